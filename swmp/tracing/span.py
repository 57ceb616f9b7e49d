"""Spans: what one operation recorded, and the no-op stand-ins used when nothing is recorded.

A :class:`Span` keeps the fields of the record format, with tags, logs and refs as flat
lists created on first use (a shared empty tuple until then), so serializing it is one list
display and no per-span dict is ever built. Its core (fields, creation, ``with``, finish)
is native when ``swmp._spancore`` is built (swmp/_native/spancore.c says why: it is the
path every traced call takes, between I/O waits that leave the CPU caches cold), else the
pure-Python :class:`PySpanCore`; the two are interchangeable.

Activation is separate from creation: ``with span:`` makes it the current span of this
context (thread / asyncio task) and finishes it on exit, while a span that is only
created and later ``finish()``-ed never touches the context (exit spans of clients whose
request and response are separate calls).

When a span finishes while it is current, the current span becomes the nearest ancestor
that is still open. A span finished from another task or thread, or out of order, only
updates its own fields and the segment's (lock-free, GIL-atomic) bookkeeping, so the
segment is still emitted exactly once, when its last open span finishes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from swmp import propagation as _propagation
from swmp.profiling.gate import gate as _gate
from swmp.propagation import b64, encode_correlation
from swmp.tracing.constants import Kind
from swmp.tracing.identity import identity
from swmp.tracing.limits import format_stack, limits, stats

if TYPE_CHECKING:
    from swmp.tracing.segment import Segment

_time_ns = time.time_ns
_EMPTY: tuple[()] = ()

# The span the code running in this context is inside of (None outside any span).
current_span: ContextVar[Any] = ContextVar("swmp_current_span", default=None)
_get_current = current_span.get
_set_current = current_span.set

# Base64 of peer addresses and endpoint names: a worker sees a small set of each, so cache
# them (bounded: cleared when full, which only costs re-encoding).
_b64_cache: dict[str, str] = {}


def b64_cached(s: str) -> str:
    v = _b64_cache.get(s)
    if v is None:
        if len(_b64_cache) >= 4096:
            _b64_cache.clear()
        v = _b64_cache[s] = b64(s)
    return v


def as_text(value: Any) -> str:
    """An operation name or peer given through an API as text: text (a ``str`` subclass too)
    as it is, anything else as ``str(value)``. The ignore rules, ``sw8`` and the reporter
    take only text: another type raised into the application or lost the segment."""
    if isinstance(value, str):
        return value
    try:
        return str(value)
    except Exception:
        return "<unprintable>"


def _clip(raw: Any, limit: int, seg: Segment) -> str:
    value: str
    if raw.__class__ is str:
        value = raw
    else:
        try:
            value = str(raw)
        except Exception:
            value = "<unprintable>"
    if len(value) > limit:
        value = value[:limit]
        seg.size_limited = True
        stats.values_truncated += 1
    return value


# ``parent_id`` of an exit span that stands in for one dropped over the span limit
# (``Segment.start_span``): it is not recorded, and its ``span_id`` is the recorded span it is
# under. Both cores check it where a span's end touches its segment (swmp/_native/spancore.c:
# UNRECORDED_PARENT, the same value).
UNRECORDED = -2


class PySpanCore:
    """The fields and life cycle of a span in pure Python: the reference implementation of
    ``swmp._spancore.SpanCore`` (used when the native module is not built, or with
    ``SWMP_TRACE_PURE=1``). Both produce the same records (tests/test_spancore.py)."""

    # Defaults of the fields most spans never change: they are set on the instance only
    # when they do (no __slots__ here on purpose), which makes creating a span cheaper.
    end = 0
    is_error = False
    tags: Any = _EMPTY
    logs: Any = _EMPTY
    refs: Any = _EMPTY
    _prev: Any = None

    def __init__(  # noqa: PLR0917 (hot path: positional calls are cheaper)
        self,
        segment: Segment,
        span_id: int,
        parent_id: int,
        op: str,
        kind: int,
        layer: int,
        component: int,
        peer: str,
    ) -> None:
        self.segment = segment
        self.span_id = span_id
        self.parent_id = parent_id
        self.start = _time_ns() // 1_000_000
        self.op = op
        self.peer = peer
        self.kind = kind
        self.layer = layer
        self.component = component

    # -- context ---------------------------------------------------------------------------
    def __enter__(self) -> Any:
        self._prev = _get_current()
        _set_current(self)
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        # finish(), inlined: one call less per span on the hot path.
        if ev is not None:
            try:  # the span ends, and the application's exception is the one raised
                if isinstance(ev, Exception):
                    self.error(ev)  # type: ignore[attr-defined]  # Span's
                else:  # cancelled or interrupted: no failure (Span.interrupted says why)
                    self.interrupted(ev)  # type: ignore[attr-defined]  # Span's
            except Exception:
                pass
        if self.end:
            return
        unrecorded = self.parent_id == UNRECORDED
        if self.span_id == 0 and not unrecorded and self.segment.profile is not None:
            self.segment.profile.stop()  # before the end time: no snapshot after the segment's end
        self.end = _time_ns() // 1_000_000
        if _get_current() is self:
            prev = self._prev
            while prev is not None and prev.end:
                prev = prev._prev
            _set_current(prev)
        if not unrecorded:
            self.segment.closed(self)  # type: ignore[arg-type]

    def finish(self, end_ms: int | None = None) -> None:
        """Finish the span (idempotent). Never raises."""
        if self.end:
            return
        unrecorded = self.parent_id == UNRECORDED
        if self.span_id == 0 and not unrecorded and self.segment.profile is not None:
            self.segment.profile.stop()
        self.end = end_ms or _time_ns() // 1_000_000
        if _get_current() is self:
            prev = self._prev
            while prev is not None and prev.end:
                prev = prev._prev
            _set_current(prev)
        if not unrecorded:  # a stand-in (UNRECORDED) is no part of its segment
            self.segment.closed(self)  # type: ignore[arg-type]

    def inject(self) -> dict[str, str]:
        """Headers that make a downstream service continue this trace with this span as parent."""
        return _inject(self)


def _py_rows(spans: list[Any], skip: bool) -> list[list[Any]]:
    """The span part of a SEGMENT record (positional layout of ``reporter_proc.records``)."""
    return [
        [
            s.span_id,
            s.parent_id,
            s.start,
            s.end,
            s.op,
            s.peer,
            s.kind,
            s.layer,
            s.component,
            s.is_error,
            skip,
            s.tags,
            s.logs,
            s.refs,
        ]
        for s in spans
    ]


def _inject(span: Any) -> dict[str, str]:
    """``span.inject()``: the headers that make a downstream service continue this trace with
    this span as parent. The pure-Python core's method, and what the native one calls for
    anything it does not build itself (correlation data, ``sw8-x``, a pure-Python segment)."""
    seg = span.segment
    sw8 = _sw8_header(span, identity.service_b64, identity.instance_b64) if _sw8_header else None
    if sw8 is None:
        enc = seg.encoded
        if enc is None:
            enc = seg.encode_ids()
        sw8 = (
            f"1-{enc[0]}-{enc[1]}-{span.span_id}-{identity.service_b64}-{identity.instance_b64}-"
            f"{enc[2]}-{b64_cached(span.peer)}"
        )
    headers = {"sw8": sw8}
    if seg.correlation:
        headers["sw8-correlation"] = encode_correlation(seg.correlation)
    if seg.skip_analysis:
        headers["sw8-x"] = "1"
    return headers


def _count_lost() -> None:
    stats.spans_lost += 1


PURE_ENV = "SWMP_TRACE_PURE"


def _native() -> Any:
    """The native module when it is built and not turned off, else None."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        from swmp import _spancore  # noqa: PLC0415
    except ImportError:
        return None
    _spancore.setup(current_span, _EMPTY, _count_lost)
    _spancore.setup_inject(_inject)
    _propagation.use_native(_spancore)
    return _spancore


native_core: Any = _native()  # the module (also the segments' and ids' core), or None: pure Python
NATIVE = native_core is not None
_Core: type[PySpanCore] = native_core.SpanCore if NATIVE else PySpanCore
span_rows: Callable[[list[Any], bool], list[list[Any]]] = native_core.rows if NATIVE else _py_rows
# sw8_header(span, service_b64, instance_b64): Span.inject's sw8 value in C, or None (then
# built here, as the pure-Python core always does).
_sw8_header: Callable[[Any, str, str], str | None] | None = native_core.sw8_header if NATIVE else None
NO_TAGS = _EMPTY  # what ``tags``/``logs``/``refs`` hold until the first one is added


if TYPE_CHECKING:
    from swmp._spancore import SpanCore as _CoreType  # the fields and methods both cores have
else:
    _CoreType = _Core


class Span(_CoreType):
    """One recorded operation. Create spans through ``swmp.tracing.context`` (or the API)."""

    recording = True
    _logged_exc = 0  # id() of the exception last logged by error(): the same one is logged once

    # -- data ------------------------------------------------------------------------------
    def tag(self, key: str, value: Any) -> Span:
        if value.__class__ is not str or len(value) > limits.tag_value_max:
            value = _clip(value, limits.tag_value_max, self.segment)
        if key.__class__ is not str:  # as text: the reporter cannot encode the segment otherwise
            key = as_text(key)
        tags = self.tags
        if tags is _EMPTY:
            self.tags = [key, value]
        else:
            tags += (key, value)
        return self

    def log(self, message: Any = None, **fields: Any) -> Span:
        """Attach a timestamped log: ``span.log("retrying", attempt=2)``."""
        data: list[str] = []
        if message is not None:
            fields = {"message": message, **fields}
        lim = limits.log_value_max
        seg = self.segment
        for k, v in fields.items():
            data.append(k)
            data.append(_clip(v, lim, seg))
        entry = [_time_ns() // 1_000_000, data]
        if self.logs is _EMPTY:
            self.logs = [entry]
        else:
            self.logs.append(entry)
        return self

    def error(self, exc: BaseException | None = None) -> Span:
        """Mark the span as failed; with an exception, log its kind, message and stack."""
        self.is_error = True
        if exc is not None:
            # A framework's error hook and the entry point around it can both see the same
            # exception (Flask re-raising with PROPAGATE_EXCEPTIONS): one stack per span.
            if self._logged_exc == id(exc):
                return self
            self._logged_exc = id(exc)
            try:
                stack = format_stack(type(exc), exc, exc.__traceback__)
            except Exception:
                stack = ""
            try:
                message = str(exc)
            except Exception:  # an exception whose __str__ fails: the application's to raise, not ours
                message = f"<unprintable {type(exc).__name__} object>"
            kind = type(exc).__name__
            self.log(**{"event": "error", "error.kind": kind, "message": message, "stack": stack})
        return self

    def interrupted(self, exc: BaseException) -> Span:
        """The span's work was stopped by ``exc``, a ``BaseException`` that is no failure (as
        in the SkyWalking Python agent, only an ``Exception`` flags a span): a log
        ``event=interrupted`` with its kind for ``CancelledError`` (the client went away),
        ``KeyboardInterrupt``, ``SystemExit``, which the OAP counts in no success rate;
        nothing for ``GeneratorExit`` (the consumer stopped). ``__exit__``'s, for these."""
        if not isinstance(exc, GeneratorExit):
            try:
                message = str(exc)
            except Exception:
                message = ""
            self.log(**{"event": "interrupted", "kind": type(exc).__name__, "message": message})
        return self

    def ended_by(self, exc: BaseException) -> Span:
        """What ``__exit__`` records for ``exc``: ``error`` for an ``Exception``, else
        ``interrupted``. For code that ends a span from an ``except BaseException``."""
        if isinstance(exc, Exception):
            return self.error(exc)
        return self.interrupted(exc)

    def set_operation(self, op: str) -> Span:
        """Rename the span, also after it started (an entry span learns its route template
        only once the framework routed the request). The ignore rules and the sampler saw
        the name the span started with; ``sw8`` headers injected from now on carry the new
        name as the segment's endpoint. A name that is not text is recorded as its text."""
        if op.__class__ is not str:
            op = as_text(op)
        self.op = op
        seg = self.segment
        if seg.encoded is not None and seg.first is self:
            seg.encoded = None  # the cached endpoint of injected headers is this span's name
        # A profile task may name the final endpoint (a stand-in's span id is another span's).
        if self.span_id == 0 and _gate.by_endpoint and self.parent_id != UNRECORDED:
            _gate.consider(self)
        return self

    def set_peer(self, peer: str) -> Span:
        if peer.__class__ is not str:
            peer = "" if peer is None else as_text(peer)
        self.peer = peer
        return self

    def set_component(self, component: int) -> Span:
        self.component = component
        return self

    def set_layer(self, layer: int) -> Span:
        self.layer = layer
        return self

    def add_ref(self, ref: list[Any]) -> None:
        if self.refs is _EMPTY:
            self.refs = [ref]
        else:
            self.refs.append(ref)

    @property
    def trace_id(self) -> str:
        return self.segment.trace_id

    def __repr__(self) -> str:
        return f"<Span {self.span_id} {self.op!r} kind={self.kind} segment={self.segment.segment_id}>"


class NoopSpan:
    """Stands in for a span that is not recorded (nested duplicate, not sampled, over limit).

    Every method of :class:`Span` exists and does nothing, so instrumentation never has to
    check. The shared instance :data:`NOOP` does not touch the context at all.
    """

    __slots__ = ()

    recording = False
    end = 0
    span_id = -1
    op = ""
    peer = ""
    trace_id = ""

    def __enter__(self) -> NoopSpan:
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        return None

    def finish(self, end_ms: int | None = None) -> None:
        return None

    def tag(self, key: str, value: Any) -> NoopSpan:
        return self

    def log(self, message: Any = None, **fields: Any) -> NoopSpan:
        return self

    def error(self, exc: BaseException | None = None) -> NoopSpan:
        return self

    def interrupted(self, exc: BaseException) -> NoopSpan:
        return self

    def ended_by(self, exc: BaseException) -> NoopSpan:
        return self

    def set_operation(self, op: str) -> NoopSpan:
        return self

    def set_peer(self, peer: str) -> NoopSpan:
        return self

    def set_component(self, component: int) -> NoopSpan:
        return self

    def set_layer(self, layer: int) -> NoopSpan:
        return self

    def inject(self) -> dict[str, str]:
        return {}


class SpanPosition:
    """Where a span that is not recorded sits in a recorded trace: its segment and the
    recorded span it is under (what :class:`swmp.tracing.context.Snapshot` reads of a span)."""

    __slots__ = ("segment", "span_id")

    def __init__(self, segment: Segment, span_id: int) -> None:
        self.segment = segment
        self.span_id = span_id


class IgnoredSpan(NoopSpan):
    """Root of work that is not traced: while it is current, nested spans are :data:`NOOP`.

    One tiny object per ignored request; it is the only work a non-sampled request does
    besides the sampling/ignore decision itself. An entry or local span dropped over the
    span limit is one too, with ``at`` set: the work under it is not recorded but is still in
    the trace (its logs carry the trace id, threads it starts continue the trace, its calls
    propagate it), as in the Java agent. An exit span dropped there is a stand-in
    :class:`Span` instead (``parent_id`` :data:`UNRECORDED`), which every instrumentation
    injects as it injects a recorded one (Segment.start_span).
    """

    __slots__ = ("_prev", "at", "end")

    def __init__(self, at: SpanPosition | None = None) -> None:
        self._prev: Any = None
        self.end = 0
        self.at = at

    def __enter__(self) -> IgnoredSpan:
        self._prev = _get_current()
        _set_current(self)
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        self.finish()

    def finish(self, end_ms: int | None = None) -> None:
        if self.end:
            return
        self.end = 1
        if _get_current() is self:
            prev = self._prev
            while prev is not None and prev.end:
                prev = prev._prev
            _set_current(prev)


NOOP = NoopSpan()

# exit_child(op, peer, component, layer): the native common cases of an exit span (see
# context.new_exit_span), or None when the span core is pure Python.
exit_child: Callable[[str, str, int, int], Span | None] | None = None
if native_core is not None:
    native_core.setup_exit(Span, Kind.EXIT, limits)
    exit_child = native_core.exit_child
