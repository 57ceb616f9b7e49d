"""``skywalking.trace.context`` on swmp: ``get_context()`` and the span API built on it.

swmp keeps the current span in a context variable, so there is no per-trace context object
to carry around: :func:`get_context` returns a stateless :class:`SpanContext` whose methods
act on the caller's current trace. Spans are swmp spans behind :class:`Span`, which offers
the attributes and methods that code written for the SkyWalking Python agent uses
(``op``, ``peer``, ``component``, ``layer``, ``tag(Tag)``, ``log(ex)``, ``raised()``,
``inject()``, ``start()`` / ``stop()``, ``with``).
"""

from __future__ import annotations

import sys
from typing import Any

from swmp import api
from swmp.compat import Component, Kind, Layer, number
from swmp.compat.trace.carrier import Carrier
from swmp.compat.trace.tags import Tag
from swmp.tracing import context as _ctx
from swmp.tracing.constants import Kind as _Kind
from swmp.tracing.span import Span as _SwSpan
from swmp.tracing.span import as_text, current_span

Snapshot = _ctx.Snapshot

_KINDS = {_Kind.ENTRY: Kind.Entry, _Kind.EXIT: Kind.Exit, _Kind.LOCAL: Kind.Local}


class Span:
    """One span, as the SkyWalking Python agent's ``Span`` is used by application code."""

    __slots__ = ("_span", "_token", "context")

    def __init__(self, span: Any, context: SpanContext) -> None:
        self._span = span
        self.context = context
        self._token: Any = None

    # -- fields ----------------------------------------------------------------------------
    @property
    def sid(self) -> int:
        return int(getattr(self._span, "span_id", -1))

    @property
    def pid(self) -> int:
        return int(getattr(self._span, "parent_id", -1))

    @property
    def kind(self) -> Kind | None:
        return _KINDS.get(getattr(self._span, "kind", -1))

    @property
    def op(self) -> str:
        return str(self._span.op)

    @op.setter
    def op(self, value: str) -> None:
        self._span.set_operation(value)

    @property
    def peer(self) -> str:
        return str(self._span.peer)

    @peer.setter
    def peer(self, value: str) -> None:
        self._span.set_peer(value or "")

    @property
    def component(self) -> Component | int:
        value = getattr(self._span, "component", 0)
        try:
            return Component(value)
        except ValueError:
            return int(value)

    @component.setter
    def component(self, value: Component | int) -> None:
        self._span.set_component(number(value))

    @property
    def layer(self) -> Layer | int:
        value = getattr(self._span, "layer", 0)
        try:
            return Layer(value)
        except ValueError:
            return int(value)

    @layer.setter
    def layer(self, value: Layer | int) -> None:
        self._span.set_layer(number(value))

    @property
    def error_occurred(self) -> bool:
        return bool(getattr(self._span, "is_error", False))

    # -- data ------------------------------------------------------------------------------
    def tag(self, tag: Tag) -> Span:
        self._span.tag(tag.key, tag.val)
        return self

    def log(self, ex: BaseException) -> Span:
        self._span.error(ex)
        return self

    def raised(self) -> Span:
        """Mark the span failed with the exception being handled."""
        self._span.error(sys.exc_info()[1])
        return self

    def inject(self) -> Carrier:
        """The carrier of a call made from this (exit) span. A span without a peer (an entry or
        local span, or an exit span whose peer is empty) gives an empty carrier, as
        ``swmp.inject()`` gives no headers: ``sw8`` without the address used at the client is
        refused by whoever receives it. (The peer agent raised ``RuntimeError`` for a span
        that is not an exit span; the agent raises nothing into the application.)"""
        if not getattr(self._span, "peer", ""):
            return Carrier()
        return Carrier(self._span.inject())

    # -- life ------------------------------------------------------------------------------
    def start(self) -> Span:
        self._span.__enter__()
        return self

    def stop(self) -> bool:
        self._span.finish()
        return True

    def __enter__(self) -> Span:
        self._span.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        self._span.__exit__(exc_type, exc_val, exc_tb)  # exceptions propagate, as they should


class SpanContext:
    """Creates spans in the caller's current trace (see the module docstring)."""

    def new_local_span(self, op: str) -> Span:
        return Span(_ctx.new_local_span(as_text(op), 0), self)

    def new_entry_span(
        self, op: str, carrier: Carrier | None = None, inherit: Component | None = None
    ) -> Span:
        decoded = api.extract(carrier.headers()) if carrier is not None else None
        return Span(_ctx.new_entry_span(as_text(op), decoded, 0), self)

    def new_exit_span(
        self, op: str, peer: str, component: Component | None = None, inherit: Component | None = None
    ) -> Span:
        return Span(_ctx.new_exit_span(as_text(op), as_text(peer or ""), number(component)), self)

    @property
    def active_span(self) -> Span | None:
        span = _ctx.active_span()
        return Span(span, self) if span is not None else None

    def get_correlation(self, key: str) -> str | None:
        return api.get_correlation(key)

    def put_correlation(self, key: str, value: str | None) -> None:
        """Set (or with ``None`` remove) a ``sw8-correlation`` entry; over the limits: ignored."""
        if key is None:
            return
        if value is None:
            span = _ctx.active_span()
            if span is not None:
                span.segment.correlation_for_update().pop(key, None)
            return
        api.set_correlation(key, value)

    def capture(self) -> Snapshot | None:
        return _ctx.capture()

    def continued(self, snapshot: Snapshot | None) -> None:
        """Link the active span to ``snapshot`` (taken in another thread) by a cross-thread
        reference. Prefer opening the span with the snapshot: ``@runnable`` does."""
        if snapshot is None:
            return
        span = current_span.get()
        if span.__class__ is not _SwSpan or span.segment.segment_id == snapshot.segment_id:
            return
        from swmp.tracing.segment import cross_thread_ref  # noqa: PLC0415

        span.add_ref(
            cross_thread_ref(snapshot.trace_id, snapshot.segment_id, snapshot.span_id, snapshot.endpoint)
        )


_CONTEXT = SpanContext()


def get_context() -> SpanContext:
    return _CONTEXT


__all__ = ["Snapshot", "Span", "SpanContext", "get_context"]
