"""The public API (re-exported by ``swmp``): start the agent, make spans, propagate context.

Everything here is safe to call whether or not the agent runs: before ``start`` spans are
still built (and counted as dropped by the null sink), so instrumented code never needs a
guard. Nothing raises into the caller for tracing reasons.

Example::

    import swmp

    swmp.start(agent_name="orders", agent_collector_backend_services="oap:11800")

    @swmp.trace()
    def price(order): ...

    with swmp.entry_span("/orders", headers=request.headers):
        swmp.tag("order.id", order_id)
        with swmp.exit_span("/stock", peer="stock:80") as span:
            http_get(url, headers=span.inject())
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, TypeVar, overload

from swmp.config import Config, load
from swmp.propagation import ContextCarrier, from_headers, header_lookup
from swmp.tracing import context as _ctx
from swmp.tracing.constants import Component, Layer
from swmp.tracing.limits import limits
from swmp.tracing.span import NoopSpan, Span, as_text
from swmp.tracing.span import current_span as _current_span

F = TypeVar("F", bound=Callable[..., Any])

AnySpan = Span | NoopSpan
_get_current = _current_span.get
_set_current = _current_span.set


def start(**settings: Any) -> Config:
    """Start the agent. Keyword arguments override ``SW_*`` variables (``agent_name="svc"``
    for ``SW_AGENT_NAME``; see docs/configuration.md). Returns the configuration in force."""
    config = load(**settings)
    from swmp import agent  # noqa: PLC0415 (keeps `import swmp` free of the agent machinery)

    agent.start(config)
    return config


def stop() -> None:
    """Flush and stop the agent (also done at interpreter exit)."""
    from swmp import agent  # noqa: PLC0415

    agent.stop()


# -- spans ---------------------------------------------------------------------------------


def extract(headers: Any) -> ContextCarrier | None:
    """Decode ``sw8`` / ``sw8-correlation`` / ``sw8-x`` from request headers.

    ``headers`` may be any mapping (looked up case-insensitively), a list of ``(name,
    value)`` pairs (ASGI), or a WSGI environ. Returns None when there is no valid ``sw8``.
    """
    if isinstance(headers, Mapping) and "HTTP_SW8" in headers:
        sw8, corr, x = headers.get("HTTP_SW8"), headers.get("HTTP_SW8_CORRELATION"), headers.get("HTTP_SW8_X")
    else:
        sw8 = header_lookup(headers, "sw8")
        if sw8 is None:
            return None
        corr, x = header_lookup(headers, "sw8-correlation"), header_lookup(headers, "sw8-x")
    return from_headers(sw8, corr, x, limits.correlation_max_elements, limits.correlation_max_value_length)


def entry_span(
    op: str,
    headers: Any = None,
    *,
    carrier: ContextCarrier | _ctx.Snapshot | None = None,
    component: int = Component.PYTHON,
    layer: int = Layer.HTTP,
) -> AnySpan:
    """A span for work that arrived from outside (a request, a message).

    Pass the incoming ``headers`` (or an already decoded ``carrier``) to continue the
    caller's trace. Use as a context manager, or call ``finish()``.
    """
    if carrier is None and headers is not None:
        carrier = extract(headers)
    return _ctx.new_entry_span(as_text(op), carrier, component, layer)


def exit_span(op: str, peer: str, *, component: int = Component.PYTHON, layer: int = Layer.HTTP) -> AnySpan:
    """A span for a call to another service; ``span.inject()`` gives the headers to send."""
    return _ctx.new_exit_span(as_text(op), "" if peer is None else as_text(peer), component, layer)


def local_span(
    op: str,
    *,
    parent: _ctx.Snapshot | None = None,
    component: int = Component.PYTHON,
    layer: int = Layer.UNKNOWN,
) -> AnySpan:
    """A span for in-process work. ``parent`` (from :func:`capture`) continues a trace
    started in another thread or task."""
    return _ctx.new_local_span(as_text(op), component, layer, parent)


@overload
def trace(fn: F) -> F: ...
@overload
def trace(
    fn: None = None, *, op: str | None = None, component: int = Component.PYTHON, layer: int = Layer.UNKNOWN
) -> Callable[[F], F]: ...
def trace(
    fn: Any = None, *, op: str | None = None, component: int = Component.PYTHON, layer: int = Layer.UNKNOWN
) -> Any:
    """Decorator: run the function (sync or ``async``) in a local span named after it.

    ``@swmp.trace`` or ``@swmp.trace(op="pricing")``. A generator (or async generator)
    function stays one; its span covers the iteration, from the first ``next()`` to the
    end, and is current only while the generator runs. On a ``classmethod`` or
    ``staticmethod`` it wraps the function inside.
    """

    def decorate(f: F) -> F:
        if isinstance(f, (classmethod, staticmethod)):
            return type(f)(decorate(f.__func__))
        qualname = getattr(f, "__qualname__", None) or type(f).__qualname__  # (a partial, a callable object)
        name = as_text(op) if op else f"{getattr(f, '__module__', None)}.{qualname}"

        def start() -> AnySpan:
            return _ctx.new_local_span(name, component, layer)

        return traced(f, start)  # type: ignore[no-any-return]

    return decorate(fn) if fn is not None else decorate


def traced(f: Any, start: Callable[[], AnySpan]) -> Any:
    """``f`` run in the span that ``start()`` opens at each call (what :func:`trace` and
    ``swmp.compat.decorators`` build on): a function, a coroutine function, or a generator
    (or async generator) function, which stays one, its span covering the iteration."""
    if inspect.isasyncgenfunction(f):
        return _traced_async_generator(f, start)
    if inspect.isgeneratorfunction(f):
        return _traced_generator(f, start)
    if inspect.iscoroutinefunction(f):

        @functools.wraps(f)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            with start():
                return await f(*args, **kwargs)

        return async_wrapper

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with start():
            return f(*args, **kwargs)

    return wrapper


def _step(state: list[Any], fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with ``state[0]`` current (the generator's span, or the span it left open
    inside itself); the caller's current span is restored afterwards: a suspended generator
    is no parent of what its caller does between two ``next()``."""
    outer = _get_current()
    _set_current(state[0])
    try:
        return fn(*args)
    finally:
        state[0] = _get_current()
        _set_current(outer)


async def _astep(state: list[Any], fn: Callable[..., Any], *args: Any) -> Any:
    if state[0].__class__ is NoopSpan:  # not recorded: the generator runs as it is
        return await fn(*args)
    outer = _get_current()
    _set_current(state[0])
    try:
        return await fn(*args)
    finally:
        state[0] = _get_current()
        _set_current(outer)


def _traced_generator(f: Callable[..., Any], start: Callable[[], AnySpan]) -> Callable[..., Any]:
    @functools.wraps(f)
    def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
        span = start()
        if span.__class__ is NoopSpan:
            return (yield from f(*args, **kwargs))
        state: list[Any] = [span]
        err: BaseException | None = None
        try:
            gen = f(*args, **kwargs)
            value: Any = None
            thrown: BaseException | None = None
            while True:
                try:
                    if thrown is None:
                        item = _step(state, gen.send, value)
                    else:
                        item = _step(state, gen.throw, thrown)
                except StopIteration as stop:
                    return stop.value
                thrown = None
                try:
                    value = yield item
                except GeneratorExit:
                    _step(state, gen.close)
                    raise
                except BaseException as e:  # thrown in by the caller: the generator's to handle
                    value, thrown = None, e
        except GeneratorExit:
            raise
        except BaseException as e:
            err = e
            raise
        finally:
            span.__exit__(None if err is None else type(err), err, None)

    return gen_wrapper


def _traced_async_generator(f: Callable[..., Any], start: Callable[[], AnySpan]) -> Callable[..., Any]:
    @functools.wraps(f)
    async def agen_wrapper(*args: Any, **kwargs: Any) -> Any:
        span = start()
        state: list[Any] = [span]
        err: BaseException | None = None
        try:
            gen = f(*args, **kwargs)
            value: Any = None
            thrown: BaseException | None = None
            while True:
                try:
                    if thrown is None:
                        item = await _astep(state, gen.asend, value)
                    else:
                        item = await _astep(state, gen.athrow, thrown)
                except StopAsyncIteration:
                    return
                thrown = None
                try:
                    value = yield item
                except GeneratorExit:
                    await _astep(state, gen.aclose)
                    raise
                except BaseException as e:  # thrown in by the caller: the generator's to handle
                    value, thrown = None, e
        except GeneratorExit:
            raise
        except BaseException as e:
            err = e
            raise
        finally:
            span.__exit__(None if err is None else type(err), err, None)

    return agen_wrapper


# -- the active span -----------------------------------------------------------------------


def current_span() -> Span | None:
    """The innermost open recorded span of this thread/task, or None."""
    return _ctx.active_span()


def tag(key: str, value: Any) -> None:
    """Tag the current span (no-op outside a recorded span)."""
    span = _ctx.active_span()
    if span is not None:
        # A key that is not a string (a number, None) would make the whole segment
        # unencodable for the reporter; the value is converted by the span.
        span.tag(key if isinstance(key, str) else str(key), value)


def log(message: Any = None, **fields: Any) -> None:
    """Attach a timestamped log to the current span."""
    span = _ctx.active_span()
    if span is not None:
        span.log(message, **fields)


def error(exc: BaseException | None = None) -> None:
    """Mark the current span as failed; records ``exc`` (default: the exception being
    handled) with its stack."""
    span = _ctx.active_span()
    if span is not None:
        span.error(exc if exc is not None else sys.exc_info()[1])


def trace_id() -> str:
    """The current trace id ("" outside a recorded trace), e.g. to put in a log line."""
    return _ctx.trace_id()


def inject(headers: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Propagation headers for an outgoing call made from the current span.

    Adds them to ``headers`` when given, and returns them. Prefer an :func:`exit_span`'s
    own ``inject()``: the backend draws the call between the two spans. The current span
    must have a peer (an exit span's): ``sw8`` without the address used at the client is
    refused by whoever receives it (swmp, the Java and the Python agents), so a span without
    one gives no headers.
    """
    span = _ctx.active_span()
    out = span.inject() if span is not None and span.peer else {}
    if headers is not None:
        headers.update(out)
    return out


def capture() -> _ctx.Snapshot | None:
    """Snapshot of the current span, to continue the trace in another thread (``local_span(parent=...)``)."""
    return _ctx.capture()


def set_correlation(key: str, value: str) -> bool:
    """Set a ``sw8-correlation`` entry carried to downstream services; False if over the limits
    (or if the key or the value is not text)."""
    span = _ctx.active_span()
    if span is None or not isinstance(key, str) or not isinstance(value, str):
        # Stored, anything else would make every later inject() (each outgoing call of the
        # trace) raise while it encodes the header.
        return False
    corr = span.segment.correlation_for_update()
    if len(value) > limits.correlation_max_value_length:
        return False
    if key not in corr and len(corr) >= limits.correlation_max_elements:
        return False
    corr[key] = value
    return True


def get_correlation(key: str) -> str | None:
    span = _ctx.active_span()
    return span.segment.correlation.get(key) if span is not None else None
