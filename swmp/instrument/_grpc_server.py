"""gRPC server side: one entry span per RPC, for ``grpc.server`` and ``grpc.aio.server``.

An interceptor (put first, before the application's own) rebuilds each method handler with
its behaviour wrapped; the handler kind and the behaviour's function kind (plain, coroutine,
async generator) are kept, because the servers choose how to run a behaviour by inspecting
it. The operation name is the full method name (``/package.Service/Method``), ``sw8``
comes from the invocation metadata.

Unary responses finish the span when the behaviour returns. Streamed responses finish it
when the stream ends, or, when the client cancels or the deadline passes and the server
stops iterating, from the RPC's termination callback.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

from swmp.instrument._incoming import activate, carrier_of, deactivate
from swmp.tracing import context as _ctx
from swmp.tracing.constants import TAG_GRPC_METHOD, TAG_GRPC_STATUS, Component, Layer
from swmp.tracing.span import NOOP, Span

Ignored = Callable[[str], bool]


def method_name(details: Any) -> str:
    m = details.method
    if m.__class__ is bytes:
        return m.decode("utf-8", "replace")
    return m if m.__class__ is str else str(m)


def _start(method: str, context: Any) -> Any:
    try:
        carrier = carrier_of(dict(context.invocation_metadata() or ()))
    except Exception:
        carrier = None
    span = _ctx.new_entry_span(method, carrier, Component.GRPC, Layer.RPC_FRAMEWORK)
    if span.__class__ is Span:
        span.tag(TAG_GRPC_METHOD, method)
        try:
            span.peer = context.peer() or ""
        except Exception:
            pass
    return span


def _code_of(context: Any) -> Any:
    try:
        return context.code()  # None until the behaviour sets one
    except Exception:
        return None


def _status(span: Any, context: Any, default: Any) -> None:
    """Tag the RPC's status code; anything but OK marks the span failed."""
    if span.__class__ is not Span:
        return
    code = _code_of(context) or default
    span.tag(TAG_GRPC_STATUS, str(code))
    if getattr(code, "name", "OK") != "OK":
        span.error()


def _on_termination(context: Any, callback: Callable[[], None]) -> bool:
    """Run ``callback`` when the RPC terminates (also cancelled); False if that cannot be
    arranged (then the caller finishes the span itself)."""
    try:
        add = getattr(context, "add_callback", None)  # grpc.server
        if add is not None:
            return bool(add(callback))
        context.add_done_callback(lambda _ctx: callback())  # grpc.aio.server
        return True
    except Exception:
        return False


class _Once:
    """Finishes a span exactly once, from whichever thread gets there first."""

    __slots__ = ("_left", "context", "span")

    def __init__(self, span: Any, context: Any) -> None:
        self.span = span
        self.context = context
        self._left = [span]

    def done(self, default: Any, exc: BaseException | None = None) -> None:
        try:
            span = self._left.pop()  # atomic under the GIL
        except IndexError:
            return
        if exc is not None:
            span.error(exc)
        _status(span, self.context, default)
        span.finish()

    def terminated(self, grpc_mod: Any) -> Callable[[], None]:
        # Still open at termination: the server stopped reading the stream early.
        return lambda: self.done(grpc_mod.StatusCode.CANCELLED)


class _Responses:
    """A streamed response of a plain (threaded) behaviour: the span is current while the
    behaviour produces each message, never in between (the thread goes back to gRPC)."""

    __slots__ = ("_it", "_once")

    def __init__(self, it: Iterator[Any], once: _Once) -> None:
        self._it = it
        self._once = once

    def __iter__(self) -> _Responses:
        return self

    def __next__(self) -> Any:
        span = self._once.span
        prev = activate(span)
        try:
            return next(self._it)
        except StopIteration:
            self._once.done(_ok())
            raise
        except BaseException as e:
            self._once.done(_unknown(self._once.context), e)
            raise
        finally:
            deactivate(span, prev)


def _ok() -> Any:
    import grpc  # noqa: PLC0415 (imported: we are inside its server)

    return grpc.StatusCode.OK


def _unknown(context: Any) -> Any:
    import grpc  # noqa: PLC0415

    return _code_of(context) or grpc.StatusCode.UNKNOWN


def _wrap_plain(fn: Callable[..., Any], method: str, streaming: bool) -> Callable[..., Any]:
    import grpc  # noqa: PLC0415

    def behaviour(request: Any, context: Any) -> Any:
        span = _start(method, context)
        if span is NOOP:
            return fn(request, context)
        once = _Once(span, context)
        if streaming:
            _on_termination(context, once.terminated(grpc))
        prev = activate(span)
        try:
            result = fn(request, context)
            if streaming:
                result = _Responses(iter(result), once)
        except BaseException as e:
            once.done(_unknown(context), e)
            raise
        finally:
            deactivate(span, prev)
        if not streaming:
            once.done(grpc.StatusCode.OK)
        return result

    return behaviour


def _wrap_coroutine(fn: Callable[..., Any], method: str) -> Callable[..., Any]:
    import grpc  # noqa: PLC0415

    async def behaviour(request: Any, context: Any) -> Any:
        span = _start(method, context)
        if span is NOOP:
            return await fn(request, context)
        once = _Once(span, context)
        prev = activate(span)
        try:
            result = await fn(request, context)
        except BaseException as e:
            once.done(_unknown(context), e)
            raise
        finally:
            deactivate(span, prev)
        once.done(grpc.StatusCode.OK)
        return result

    return behaviour


def _wrap_async_gen(fn: Callable[..., Any], method: str) -> Callable[..., Any]:
    import grpc  # noqa: PLC0415

    async def behaviour(request: Any, context: Any) -> Any:
        span = _start(method, context)
        if span is NOOP:
            async for item in fn(request, context):
                yield item
            return
        once = _Once(span, context)
        _on_termination(context, once.terminated(grpc))
        agen = fn(request, context)
        try:
            while True:
                prev = activate(span)
                try:
                    item = await agen.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    deactivate(span, prev)
                yield item
        except GeneratorExit:
            once.done(grpc.StatusCode.CANCELLED)  # the server stopped reading
            raise
        except BaseException as e:
            once.done(_unknown(context), e)
            raise
        finally:
            await agen.aclose()
        once.done(grpc.StatusCode.OK)

    return behaviour


def wrap_handler(handler: Any, method: str) -> Any:
    """A copy of ``handler`` (an ``RpcMethodHandler``) whose behaviour records an entry span."""
    import grpc  # noqa: PLC0415

    factories = {
        "unary_unary": grpc.unary_unary_rpc_method_handler,
        "unary_stream": grpc.unary_stream_rpc_method_handler,
        "stream_unary": grpc.stream_unary_rpc_method_handler,
        "stream_stream": grpc.stream_stream_rpc_method_handler,
    }
    kind = next((k for k in factories if getattr(handler, k, None) is not None), None)
    if kind is None:
        return handler
    fn = getattr(handler, kind)
    factory = factories[kind]
    streaming = bool(handler.response_streaming)
    if inspect.isasyncgenfunction(fn):
        wrapped = _wrap_async_gen(fn, method)
    elif inspect.iscoroutinefunction(fn):
        # grpc.aio: a coroutine (unary, or streaming through context.write())
        wrapped = _wrap_coroutine(fn, method)
    else:
        wrapped = _wrap_plain(fn, method, streaming)
    return factory(
        wrapped,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def server_interceptors(ignored: Ignored) -> tuple[Any, Any]:
    """``(sync interceptor, aio interceptor)`` that trace every method not ``ignored``."""
    import grpc  # noqa: PLC0415
    from grpc import aio  # noqa: PLC0415

    # Servers hand out the same handler object for a method on every call: wrap it once.
    # Keyed by (handler, method) identity; bounded (cleared when full, which only costs
    # wrapping again).
    wrapped: dict[tuple[int, str], tuple[Any, Any]] = {}

    def intercept(handler: Any, details: Any) -> Any:
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED itself
        try:
            method = method_name(details)
            key = (id(handler), method)
            hit = wrapped.get(key)
            if hit is not None and hit[0] is handler:
                return hit[1]
            result = handler if ignored(method) else wrap_handler(handler, method)
            if len(wrapped) >= 4096:
                wrapped.clear()
            wrapped[key] = (handler, result)  # holds the handler: its id stays its own
            return result
        except Exception:
            return handler

    class SyncInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
        def intercept_service(self, continuation: Any, details: Any) -> Any:
            return intercept(continuation(details), details)

    class AioInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
        async def intercept_service(self, continuation: Any, details: Any) -> Any:
            return intercept(await continuation(details), details)

    return SyncInterceptor(), AioInterceptor()
