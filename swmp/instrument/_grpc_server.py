"""gRPC server side: one entry span per RPC, for ``grpc.server`` and ``grpc.aio.server``.

Each method handler is rebuilt once with its behaviour wrapped, where the server gets it:
at registration (generic handlers hand out wrapped handlers; registered method handlers
are wrapped), or, in a server with interceptors of the application's, by our interceptor,
put first (``_grpc_registration.ServerTracing``). The handler kind and the behaviour's function kind
(plain, coroutine, async generator) are kept, because the servers choose how to run a
behaviour by inspecting it. The operation name is the full method name
(``/package.Service/Method``), ``sw8`` comes from the invocation metadata.

Unary responses finish the span when the behaviour returns. Streamed responses finish it
when the stream ends, or, when the client cancels or the deadline passes and the server
stops iterating, from the RPC's termination callback. ``grpc.aio`` cancels the task of
such an RPC instead: the ``CancelledError`` ends the span as ``StatusCode.CANCELLED`` as
well (no stack: nothing failed in the application), unless the behaviour set a code. A
sync unary behaviour that returns after its RPC was abandoned ends CANCELLED too (its
response is never sent); a sync stream over before its behaviour ran (its deadline passed
while it waited for a thread) ends at once, as no termination callback will come.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from swmp.instrument._incoming import activate, deactivate
from swmp.propagation import from_headers
from swmp.tracing import context as _ctx
from swmp.tracing.constants import TAG_GRPC_METHOD, TAG_GRPC_STATUS, Component, Layer
from swmp.tracing.limits import limits
from swmp.tracing.span import NO_TAGS, NOOP, Span

Ignored = Callable[[str], bool]

# grpc.aio: the invocation metadata, handed from the interceptor to the behaviour of the same
# RPC (one task runs both, the interceptor just before). The aio servicer context builds a
# new tuple of metadata on every invocation_metadata() call (~0.7 us), which the interceptor
# has been given already. The behaviour takes it (and clears it) before the application runs.
_aio_metadata: ContextVar[Any] = ContextVar("swmp_grpc_aio_metadata", default=None)
_take_metadata = _aio_metadata.get
_give_metadata = _aio_metadata.set
give_metadata = _give_metadata  # for the registration side (_grpc_registration)
_GRPC = Component.GRPC
_RPC = Layer.RPC_FRAMEWORK

# id(StatusCode member) -> (its status tag text, whether it fails the span), filled on the
# first wrap: str(), .name and hash() of an Enum member each run Python code (members live
# as long as their class, so their ids are theirs).
_STATUS: dict[int, tuple[str, bool]] = {}


def _status_table() -> None:
    import grpc  # noqa: PLC0415 (imported: we are inside its server)

    if not _STATUS:
        _STATUS.update({id(code): (str(code), code.name != "OK") for code in grpc.StatusCode})


def method_name(details: Any) -> str:
    m = details.method
    if m.__class__ is bytes:
        return m.decode("utf-8", "replace")
    return m if m.__class__ is str else str(m)


def _start(method: str, context: Any, md: Any = None) -> Any:
    """The RPC's entry span (``sw8`` from the invocation metadata, ``md`` when the caller
    has it, ``grpc.method`` tagged, the peer recorded), or NOOP / a non-recording span, not
    yet current."""
    # Per-call path: carrier_of() and Span.tag() inlined (a Python call each saved).
    try:
        if md is None:
            md = context.invocation_metadata()
        get = dict(md).get if md else None
        sw8 = get("sw8") if get is not None else None
        carrier = (
            from_headers(
                sw8,
                get("sw8-correlation"),  # type: ignore[misc]
                get("sw8-x"),  # type: ignore[misc]
                limits.correlation_max_elements,
                limits.correlation_max_value_length,
            )
            if sw8 is not None
            else None
        )
    except Exception:
        carrier = None
    span = _ctx.new_entry_span(method, carrier, _GRPC, _RPC)
    if span.__class__ is Span:
        if span.tags is NO_TAGS and len(method) <= limits.tag_value_max:
            span.tags = [TAG_GRPC_METHOD, method]
        else:
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
    try:
        code = context.code() or default  # None until the behaviour sets one
    except Exception:
        code = default
    hit = _STATUS.get(id(code))
    tags = span.tags
    if hit is not None and tags.__class__ is list and len(hit[0]) <= limits.tag_value_max:
        tags += (TAG_GRPC_STATUS, hit[0])  # Span.tag(), inlined
        if hit[1]:
            span.error()
        return
    span.tag(TAG_GRPC_STATUS, str(code))
    if getattr(code, "name", "OK") != "OK":
        span.error()


def _on_termination(context: Any, callback: Callable[[], None]) -> bool | None:
    """Run ``callback`` when the RPC terminates (also cancelled): True. False: the RPC has
    terminated already (grpc.server's ``add_callback`` refuses). None if that cannot be
    arranged (then the span ends with the stream)."""
    try:
        add = getattr(context, "add_callback", None)  # grpc.server
        if add is not None:
            # Only grpc.server's answers: grpc.aio's context of a plain behaviour (run in
            # its migration thread pool) has an add_callback that returns None.
            return add(callback) is not False
        context.add_done_callback(lambda _ctx: callback())  # grpc.aio.server
        return True
    except Exception:
        return None


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


def _abandoned(context: Any) -> bool:
    """Whether the client of a sync server's RPC cancelled it or its deadline passed: the
    response of a behaviour that returns then is never sent (the client gets CANCELLED or
    DEADLINE_EXCEEDED), so its span ends CANCELLED, as a stream's does. grpc's own state,
    read without ``is_active()``'s lock (once per call); False when it has another shape
    (grpc.aio's context)."""
    return getattr(getattr(context, "_state", None), "client", None) == "cancelled"


def _failed(span: Any, context: Any, exc: BaseException, default: Any) -> None:
    span.error(exc)
    _status(span, context, default)
    span.finish()


def _wrap_unary(fn: Callable[..., Any], method: str) -> Callable[..., Any]:
    """A plain behaviour with one response: the span is current while it runs."""
    import grpc  # noqa: PLC0415

    ok, unknown, cancelled = grpc.StatusCode.OK, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED

    def behaviour(request: Any, context: Any) -> Any:
        span = _start(method, context)
        if span is NOOP:
            return fn(request, context)
        span.__enter__()  # finish() gives the context back
        try:
            result = fn(request, context)
        except BaseException as e:  # (a request stream raises once the RPC is abandoned)
            _failed(span, context, e, cancelled if _abandoned(context) else unknown)
            raise
        _status(span, context, cancelled if _abandoned(context) else ok)
        span.finish()
        return result

    return behaviour


def _wrap_streaming(fn: Callable[..., Any], method: str) -> Callable[..., Any]:
    """A plain behaviour with streamed responses: see :class:`_Responses`."""
    import grpc  # noqa: PLC0415

    def behaviour(request: Any, context: Any) -> Any:
        span = _start(method, context)
        if span is NOOP:
            return fn(request, context)
        once = _Once(span, context)
        if _on_termination(context, once.terminated(grpc)) is False:
            # Over before it started (its deadline passed while it waited for a thread of
            # the pool; a request stream's behaviour is called even then): gRPC takes one
            # response at most and stops, no callback will come. The span ends now.
            once.done(grpc.StatusCode.CANCELLED)
            return fn(request, context)
        prev = activate(span)
        try:
            result = _Responses(iter(fn(request, context)), once)
        except BaseException as e:
            once.done(_unknown(context), e)
            raise
        finally:
            deactivate(span, prev)
        return result

    return behaviour


def _wrap_coroutine(fn: Callable[..., Any], method: str) -> Callable[..., Any]:
    """grpc.aio: a coroutine (unary, or streaming through ``context.write()``)."""
    # Imported here, with grpc.aio's behaviours, not with this module: the agent loads every
    # instrumentation module in every process, and asyncio is several MiB of modules.
    from asyncio import CancelledError  # noqa: PLC0415

    import grpc  # noqa: PLC0415

    ok, unknown, cancelled = grpc.StatusCode.OK, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED

    async def behaviour(request: Any, context: Any) -> Any:
        md = _take_metadata()
        if md is not None:
            _give_metadata(None)
        span = _start(method, context, md)
        if span is NOOP:
            return await fn(request, context)
        span.__enter__()  # finish() gives the context back
        try:
            result = await fn(request, context)
        except CancelledError:  # the client cancelled or the deadline passed (docstring)
            _status(span, context, cancelled)
            span.finish()
            raise
        except BaseException as e:
            _failed(span, context, e, unknown)
            raise
        _status(span, context, ok)
        span.finish()
        return result

    return behaviour


def _wrap_async_gen(fn: Callable[..., Any], method: str) -> Callable[..., Any]:
    from asyncio import CancelledError  # noqa: PLC0415 (as in _wrap_coroutine)

    import grpc  # noqa: PLC0415

    async def behaviour(request: Any, context: Any) -> Any:
        md = _take_metadata()
        if md is not None:
            _give_metadata(None)
        span = _start(method, context, md)
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
        except (GeneratorExit, CancelledError):  # the server stopped reading (docstring)
            once.done(_code_of(context) or grpc.StatusCode.CANCELLED)
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
    if getattr(fn, "experimental_non_blocking", False) or getattr(fn, "experimental_thread_pool", None):
        # grpc's experimental behaviour attributes (a callback to send the response with, a
        # thread pool of its own) belong to the function it calls: left as it is, untraced.
        return handler
    factory = factories[kind]
    streaming = bool(handler.response_streaming)
    _status_table()
    if inspect.isasyncgenfunction(fn):
        wrapped = _wrap_async_gen(fn, method)
    elif inspect.iscoroutinefunction(fn):
        wrapped = _wrap_coroutine(fn, method)
    elif streaming:
        wrapped = _wrap_streaming(fn, method)
    else:
        wrapped = _wrap_unary(fn, method)
    return factory(
        wrapped,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
