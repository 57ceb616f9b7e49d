"""``skywalking.decorators`` on swmp: ``@trace()`` and ``@runnable()``, same signatures.

``@trace(op=None, layer=Layer.Unknown, component=Component.Unknown, tags=None)`` runs the
function (sync or ``async``) in a local span named ``op`` or the function's name; as with
``swmp.trace``, a generator (or async generator) function stays one, its span covering the
iteration, and on a ``classmethod`` or ``staticmethod`` it wraps the function inside.
``@runnable(...)`` makes a function that continues, in another thread, the trace of the
thread that decorated it (or of the one that called ``continue_tracing()``); its span is
named ``Thread/<function name>`` by default. Both work on methods, and above ``@classmethod``
or ``@staticmethod``. swmp's own decorator is ``swmp.trace``.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any

from swmp.api import traced
from swmp.compat import Component, Layer, number
from swmp.compat.trace.tags import Tag
from swmp.tracing import context as _ctx
from swmp.tracing.span import as_text


def _open(op: str, layer: Layer, component: Component, tags: Sequence[Tag] | None, parent: Any = None) -> Any:
    span = _ctx.new_local_span(op, number(component), number(layer), parent)
    for tag in tags or ():
        span.tag(tag.key, tag.val)
    return span


def trace(
    op: str | None = None,
    layer: Layer = Layer.Unknown,
    component: Component = Component.Unknown,
    tags: Sequence[Tag] | None = None,
) -> Callable[[Any], Any]:
    def decorator(func: Any) -> Any:
        if isinstance(func, (classmethod, staticmethod)):  # @trace() above @classmethod
            return type(func)(decorator(func.__func__))
        name = as_text(op) if op else _name(func)

        def start() -> Any:
            return _open(name, layer, component, tags)

        return traced(func, start)

    return decorator


def _name(func: Any) -> str:
    """The function's name (a ``functools.partial`` or callable object has none: its type's)."""
    return getattr(func, "__name__", None) or type(func).__name__


class _Runnable:
    """What ``@runnable()`` returns: call it (in any thread), or give ``continue_tracing()``
    to a ``Thread`` as its target. A descriptor, as the function it wraps: on a method,
    ``obj.method`` (and so ``obj.method.continue_tracing()``) is bound to ``obj``; above
    ``@classmethod`` or ``@staticmethod`` it binds as they do."""

    def __init__(
        self, func: Any, op: str, layer: Layer, component: Component, tags: Sequence[Tag] | None
    ) -> None:
        functools.update_wrapper(self, func)
        self._func = func
        self._op = op
        self._layer = layer
        self._component = component
        self._tags = tags
        self._snapshot = _ctx.capture()  # at decoration time: the inline usage

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        get = getattr(type(self._func), "__get__", None)
        if get is None:  # a callable object that does not bind (a functools.partial)
            return self
        func = get(self._func, obj, objtype)
        if func is self._func:  # a function read from its class: nothing bound
            return self
        bound = copy.copy(self)  # same op, tags and decoration-time snapshot
        bound._func = func
        return bound

    def _run(self, snapshot: Any, args: Any, kwargs: Any) -> Any:
        with _open(self._op, self._layer, self._component, self._tags, snapshot):
            return self._func(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._run(self._snapshot, args, kwargs)

    def continue_tracing(self) -> Callable[..., Any]:
        snapshot = _ctx.capture()

        def continued(*args: Any, **kwargs: Any) -> Any:
            return self._run(snapshot, args, kwargs)

        return continued


def runnable(
    op: str | None = None,
    layer: Layer = Layer.Unknown,
    component: Component = Component.Unknown,
    tags: Sequence[Tag] | None = None,
) -> Callable[[Any], _Runnable]:
    def decorator(func: Any) -> _Runnable:
        return _Runnable(func, as_text(op) if op else f"Thread/{_name(func)}", layer, component, tags)

    return decorator


__all__ = ["runnable", "trace"]
