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
import inspect
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
    named_like(traced, orig)
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
    _async_like(gate, orig)
    return gate


def named_like(traced: Any, orig: Any) -> None:
    """``traced`` (a Python function) given ``orig``'s name: a call whose arguments it cannot
    bind (an unknown keyword, no query) is refused with a TypeError naming the function, which
    must be the library's (``Cursor.execute() got an unexpected keyword argument``), as
    without the agent. Anything else is left as it is."""
    if not inspect.isfunction(traced):
        return
    try:
        traced.__name__ = orig.__name__
        traced.__qualname__ = orig.__qualname__
    except (AttributeError, TypeError):  # an original without the usual names
        pass


# A generator function too (psycopg's Cursor.stream): isgeneratorfunction answers as for it.
_KIND_FLAGS = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_GENERATOR


def _async_like(gate: Any, orig: Any) -> None:
    """A gate for a coroutine, async generator or generator function answers as the original
    does to ``inspect.iscoroutinefunction`` / ``isasyncgenfunction`` / ``isgeneratorfunction``
    / ``signature`` (and so to ``asyncio.iscoroutinefunction`` and ``mock.create_autospec``,
    which pick sync or async behaviour by them): libraries and tests decide by these what a
    method is.

    The native gate is given the original's code attributes, which is how ``inspect``
    recognises an object that behaves like a function (the duck typing it applies to
    compiled functions); the Python gate, a function of its own, gets asyncio's marker (and
    is no generator function: nothing marks one)."""
    if not inspect.isfunction(orig) or not orig.__code__.co_flags & _KIND_FLAGS:
        return
    code = orig.__code__
    try:
        if inspect.isfunction(gate):
            if code.co_flags & inspect.CO_COROUTINE:
                # Imported here: an async original's library has imported asyncio already, and
                # the agent must not import it into every process (test_instrument_lazy.py).
                from asyncio import coroutines  # noqa: PLC0415

                gate._is_coroutine = coroutines._is_coroutine  # type: ignore[attr-defined]
        else:
            gate.__dict__.update(
                __code__=code, __defaults__=orig.__defaults__, __kwdefaults__=orig.__kwdefaults__
            )
    except (AttributeError, TypeError):  # a gate without a __dict__: answers as a callable
        pass


def _passed(passes: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    try:
        return bool(passes(*args, **kwargs))
    except Exception:  # undecided: left untraced, as the native gate does
        return True


def is_native() -> bool:
    """Whether :func:`gated` makes native gates (the native core is built and not turned off)."""
    return _Gate is not None
