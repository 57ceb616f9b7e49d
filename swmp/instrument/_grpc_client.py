"""gRPC client side: one exit span per call, ``sw8`` added to the call's metadata.

Interceptors are put on every channel the application creates (``grpc.insecure_channel``,
``grpc.secure_channel`` and their ``grpc.aio`` forms), first in line so that the
application's own interceptors see the ``sw8`` entry. The span ends when the call
terminates (the call's done callback), so a streamed response is inside it and a call the
application cancels ends it as CANCELLED. The caller's metadata object is never modified:
the call gets a copy with ``sw8`` appended.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from swmp.instrument._grpc_server import Ignored, method_name
from swmp.tracing import context as _ctx
from swmp.tracing.constants import TAG_GRPC_METHOD, TAG_GRPC_STATUS, TAG_GRPC_URL, Component, Layer
from swmp.tracing.span import Span

if TYPE_CHECKING:
    import asyncio


def _start(target: str, details: Any, ignored: Ignored) -> tuple[Any, list[tuple[str, str]]]:
    """``(span, metadata to add)``; span None when nothing is recorded."""
    method = method_name(details)
    if ignored(method):
        return None, []
    span = _ctx.new_exit_span(method, target, Component.GRPC, Layer.RPC_FRAMEWORK)
    if span.__class__ is not Span:
        return None, []  # nested in another exit span, or not sampled
    span.tag(TAG_GRPC_METHOD, method)
    span.tag(TAG_GRPC_URL, target)
    return span, list(span.inject().items())


def _finish(span: Any, code: Any) -> None:
    if code is not None:
        span.tag(TAG_GRPC_STATUS, str(code))
        if getattr(code, "name", "OK") != "OK":
            span.error()
    span.finish()


# -- grpc (threads) ------------------------------------------------------------------------
def _sync_done(span: Any, call: Any) -> None:
    try:
        code = call.code()
    except Exception:
        code = None
    _finish(span, code)


def sync_interceptor_class(ignored: Ignored) -> Callable[[str], Any]:
    """The class of the interceptor put on ``grpc`` channels; instances take the target."""
    import grpc  # noqa: PLC0415

    class Details(grpc.ClientCallDetails):  # type: ignore[misc]
        def __init__(self, base: Any, metadata: list[tuple[str, Any]]) -> None:
            self.method = base.method
            self.timeout = base.timeout
            self.metadata = metadata
            self.credentials = base.credentials
            self.wait_for_ready = getattr(base, "wait_for_ready", None)
            self.compression = getattr(base, "compression", None)

    class Interceptor(
        grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
        grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
        grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
        grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
    ):
        def __init__(self, target: str) -> None:
            self.target = target

        def _intercept(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
            try:
                span, extra = _start(self.target, details, ignored)
            except Exception:
                span, extra = None, []
            if span is None:
                return continuation(details, request)
            details = Details(details, [*(details.metadata or ()), *extra])
            try:
                call = continuation(details, request)
            except BaseException as e:
                span.error(e)
                span.finish()
                raise
            try:
                # Called at once when the call is already complete (unary calls).
                call.add_done_callback(functools.partial(_sync_done, span))
            except Exception:
                span.finish()
            return call

        intercept_unary_unary = _intercept
        intercept_unary_stream = _intercept
        intercept_stream_unary = _intercept
        intercept_stream_stream = _intercept

    return Interceptor


# -- grpc.aio --------------------------------------------------------------------------------
def _aio_code(call: Any) -> Any:
    """The status code of a finished ``grpc.aio`` call without awaiting; None if unknown."""
    from grpc import _common  # noqa: PLC0415

    cy = getattr(call, "_cython_call", None)
    if cy is None:
        return None
    return _common.CYGRPC_STATUS_CODE_TO_STATUS_CODE.get(cy._status.code())


async def _await_code(span: Any, call: Any) -> None:
    code = None
    try:
        code = await call.code()
    except BaseException:
        pass
    _finish(span, code)


_watchers: set[asyncio.Task[None]] = set()


def _aio_done(span: Any, call: Any) -> None:
    try:
        code = _aio_code(call)
    except Exception:
        code = None
    if code is None and hasattr(call, "code"):
        try:
            # An intercepted call (the application's interceptors run after ours) only
            # tells its code through a coroutine: read it in a task, already done.
            # asyncio is loaded: this runs on a grpc.aio channel's loop. Looked up, not
            # imported at module level, so the agent's start never pays for asyncio.
            task = sys.modules["asyncio"].get_running_loop().create_task(_await_code(span, call))
            _watchers.add(task)
            task.add_done_callback(_watchers.discard)
            return
        except Exception:
            pass
    _finish(span, code)


def aio_interceptors_factory(ignored: Ignored) -> Callable[[str], list[Any]]:
    """``make(target)``: one interceptor per call kind for a ``grpc.aio`` channel to
    ``target`` (``grpc.aio`` sorts interceptors by class)."""
    from grpc import aio  # noqa: PLC0415

    async def intercept(target: str, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        try:
            span, extra = _start(target, details, ignored)
            if span is not None:
                metadata = aio.Metadata(*(tuple(details.metadata or ())), *extra)
                details = aio.ClientCallDetails(
                    details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
                )
        except Exception:
            span = None
        if span is None:
            return await continuation(details, request)
        try:
            call = await continuation(details, request)
        except BaseException as e:
            span.error(e)
            span.finish()
            raise
        try:
            if call.done():
                _aio_done(span, call)
            else:
                call.add_done_callback(functools.partial(_aio_done, span))
        except Exception:
            span.finish()
        return call

    class Base:
        def __init__(self, target: str) -> None:
            self.target = target

    class UnaryUnary(Base, aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
        async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            return await intercept(self.target, continuation, details, request)

    class UnaryStream(Base, aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
        async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
            return await intercept(self.target, continuation, details, request)

    class StreamUnary(Base, aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
        async def intercept_stream_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            return await intercept(self.target, continuation, details, request)

    class StreamStream(Base, aio.StreamStreamClientInterceptor):  # type: ignore[misc]
        async def intercept_stream_stream(self, continuation: Any, details: Any, request: Any) -> Any:
            return await intercept(self.target, continuation, details, request)

    def make(target: str) -> list[Any]:
        return [UnaryUnary(target), UnaryStream(target), StreamUnary(target), StreamStream(target)]

    return make
