"""A patched method that is the original outside any trace and the traced code inside one.

Most wrappers only trace calls made inside a trace (a data-store call never starts one), so
outside a trace they must cost next to nothing. With the native core built the check runs
in C (``swmp._spancore.Gate``, see swmp/_native/gate.c): no span current, and the
caller's arguments go to the original untouched, without a Python frame, tuple or dict of
ours. Otherwise a Python function makes the same check first.

``traced`` takes exactly the original's arguments (``self`` first for a method) and is only
called while a span is current. An optional ``passes`` predicate, given the same arguments
while a span is current, sends the call to the original after all when it answers true or
raises (a C function keeps that path free of Python frames too: swmp/_native/threads.c).
Whatever either returns or raises reaches the caller unchanged; an async original's
coroutine is returned, not awaited, outside a trace.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from swmp.tracing.span import current_span, native_core

_outside = current_span.get
_Gate: Any = getattr(native_core, "Gate", None)


def gated(
    orig: Callable[..., Any], traced: Callable[..., Any], passes: Callable[..., Any] | None = None
) -> Callable[..., Any]:
    """``orig(...)`` when no span is current or ``passes(...)`` is true, else ``traced(...)``
    with the same arguments; named and documented like ``orig`` (``__wrapped__`` is ``orig``)."""
    gate: Callable[..., Any]
    if _Gate is not None:
        gate = _Gate(current_span, orig, traced, passes)
    else:

        def gate(*args: Any, **kwargs: Any) -> Any:
            if _outside() is None or (passes is not None and _passed(passes, args, kwargs)):
                return orig(*args, **kwargs)
            return traced(*args, **kwargs)

    try:
        functools.update_wrapper(gate, orig)
    except (AttributeError, TypeError):  # an original without the usual attributes
        pass
    return gate


def _passed(passes: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    try:
        return bool(passes(*args, **kwargs))
    except Exception:  # undecided: left untraced, as the native gate does
        return True


def is_native() -> bool:
    """Whether :func:`gated` makes native gates (the native core is built and not turned off)."""
    return _Gate is not None
