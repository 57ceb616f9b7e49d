"""What web-framework instrumentations add to the request's entry span once the framework
has done its part: the route template as the operation name, and the exception the
framework turned into an error response.

Both are found through the current context: the framework hooks run inside the request,
where the entry span opened by the WSGI/ASGI (or server) instrumentation is current or
an ancestor of the current span. A request that is not recorded (ignored, not sampled)
has no such span and these calls do nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from swmp.tracing.constants import Kind
from swmp.tracing.span import Span, current_span, native_core

_get_current = current_span.get
_ENTRY = Kind.ENTRY


def request_span() -> Span | None:
    """The open entry span of the request handled in this context, or None."""
    s = _get_current()
    while s is not None:
        if s.__class__ is Span and s.kind == _ENTRY and not s.end:
            return s
        s = getattr(s, "_prev", None)
    return None


def _py_name_request(template: str) -> None:
    """Name the request's entry span after the route that matched (``/users/{id}``), so
    every id in a path is one endpoint. Never raises. The reference form of the native
    ``name_request`` (swmp/_native/spancore.c), which renames an open entry span that is
    the current span itself and hands every other case to this function."""
    s = _get_current()
    if not (s.__class__ is Span and s.kind == _ENTRY and not s.end):
        s = request_span()  # the common case above (the entry span is current) needs no walk
    if s is not None and template:
        s.set_operation(template)


name_request: Callable[[str], None] = _py_name_request
if native_core is not None and hasattr(native_core, "name_request"):
    native_core.setup_route(_py_name_request)
    name_request = native_core.name_request


def record_exception(exc: BaseException | None) -> None:
    """Mark the request's entry span failed with ``exc``'s kind, message and stack (a
    framework is about to answer 500 for it). A ``BaseException`` that is no ``Exception``
    (the request's task cancelled as its client went away) is logged on it without the
    error flag (``Span.interrupted``). Never raises."""
    if exc is None:
        return
    s = request_span()
    if s is not None:
        try:
            s.ended_by(exc)
        except Exception:
            pass
