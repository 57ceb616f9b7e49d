"""Helpers shared by the entry-span instrumentations of servers that are not WSGI/ASGI
(aiohttp, Tornado, Sanic, gRPC), and the guard that keeps the agent's own reporter
untraced.
"""

from __future__ import annotations

import threading
from typing import Any

from reporter_proc.process import in_reporter_process  # imported by swmp.agent already
from swmp.propagation import ContextCarrier, from_headers
from swmp.tracing import context as _ctx
from swmp.tracing.constants import TAG_HTTP_METHOD, Layer
from swmp.tracing.limits import limits
from swmp.tracing.span import NOOP, Span, current_span

# reporter_proc.process.ReporterThread names its thread so (SW_AGENT_REPORTER_PROCESS=false).
REPORTER_THREAD_NAME = "swmp-reporter"
_current_thread = threading.current_thread


def carrier_of(headers: Any) -> ContextCarrier | None:
    """The decoded ``sw8`` headers of a case-insensitive ``headers.get`` mapping, or None."""
    get = headers.get
    sw8 = get("sw8")
    if sw8 is None:
        return None
    return from_headers(
        sw8,
        get("sw8-correlation"),
        get("sw8-x"),
        limits.correlation_max_elements,
        limits.correlation_max_value_length,
    )


def http_entry_span(op: str, headers: Any, method: str, component: int) -> Any:
    """The entry span of an HTTP request (``http.method`` tagged), continuing its ``sw8``;
    None when the request is not to be traced at all (``SW_PLUGIN_HTTP_IGNORE_METHOD``, or
    an entry span of this request is already open)."""
    if _ctx.policy.rules.ignore_method(method):
        return None
    span = _ctx.new_entry_span(op, carrier_of(headers), component, Layer.HTTP)
    if span is NOOP:
        return None
    if span.__class__ is Span:
        span.tag(TAG_HTTP_METHOD, method)
    return span


def activate(span: Any) -> Any:
    """Make ``span`` current without finishing anything; returns what to give back to
    :func:`deactivate`. For spans whose end is not where the current code block ends."""
    prev = current_span.get()
    if span is not NOOP:  # the shared NOOP never becomes current (it has no _prev)
        span._prev = prev
        current_span.set(span)
    return prev


def deactivate(span: Any, prev: Any) -> None:
    """Undo :func:`activate` if ``span`` is still the current span of this context."""
    if current_span.get() is span:
        current_span.set(prev)


def reporter_is_calling() -> bool:
    """Whether the code running now is the agent's own reporter (its thread in thread mode,
    or the reporter process): its gRPC and HTTP calls to the backend must never be traced
    nor carry ``sw8``."""
    return _current_thread().name == REPORTER_THREAD_NAME or in_reporter_process()
