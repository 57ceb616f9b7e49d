"""gRPC client side: one exit span per call, ``sw8`` added to the call's metadata.

Channels the application creates (``grpc.insecure_channel``, ``grpc.secure_channel`` and
their ``grpc.aio`` forms) are marked with their target; the channel classes'
``unary_unary`` / ``unary_stream`` / ``stream_unary`` / ``stream_stream``, on a marked
channel, hand out the library's multicallable wrapped in a traced one of the same kind
(``grpc.UnaryUnaryMultiCallable`` ...). Its ``__call__`` (and ``with_call`` / ``future``)
starts the span, calls the library's own with ``sw8`` appended to a copy of the metadata
(the caller's object is never modified) and ends the span: at once for a blocking unary
call, from the call's done callback otherwise, so a streamed response is inside the span
and a call the application cancels ends it as CANCELLED. No client interceptor: grpc's
interceptor machinery (call details, continuations, outcome objects, and on ``grpc.aio``
an interceptor task per call) cost more than the span itself. The traced multicallable
sits where the first interceptor would: the application's own interceptors (a channel it
wraps with ``grpc.intercept_channel``, or ``grpc.aio``'s ``interceptors``) see ``sw8``
in ``grpc.aio``, and in sync grpc run before it. Ignored methods get the library's
multicallable itself.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from swmp.instrument._grpc_server import _STATUS, Ignored, _status_table
from swmp.tracing import context as _ctx
from swmp.tracing.constants import TAG_GRPC_METHOD, TAG_GRPC_STATUS, TAG_GRPC_URL, Component, Layer
from swmp.tracing.limits import limits
from swmp.tracing.span import NO_TAGS, Span

if TYPE_CHECKING:
    import asyncio

TARGET = "_swmp_grpc_target"  # on a channel to trace: the target, the exit span's peer
_GRPC = Component.GRPC
_RPC = Layer.RPC_FRAMEWORK
_new_exit_span = _ctx.new_exit_span


def _begin(op: str, target: str, metadata: Any, aio: bool = False) -> tuple[Any, Any]:
    """``(span, metadata with sw8)``; ``(None, metadata)`` when nothing is recorded. The
    metadata is a tuple of pairs, for ``grpc.aio`` a ``grpc.aio.Metadata`` (what its
    multicallable turns any other metadata into, through a slower ``isinstance`` check of a
    ``typing`` alias)."""
    span = None
    try:
        span = _new_exit_span(op, target, _GRPC, _RPC)
        if span.__class__ is not Span:
            return None, metadata  # nested in another exit span, or not sampled
        lim = limits.tag_value_max
        if span.tags is NO_TAGS and len(op) <= lim and len(target) <= lim:
            span.tags = [TAG_GRPC_METHOD, op, TAG_GRPC_URL, target]  # Span.tag() twice, inlined
        else:
            span.tag(TAG_GRPC_METHOD, op)
            span.tag(TAG_GRPC_URL, target)
        added = span.inject()
        extra = tuple(added.items())
        if not metadata:
            return span, (_AioMetadata(*extra) if aio else extra)
        # An sw8 the caller passes on (a proxy forwarding its incoming metadata) is
        # replaced by the span's, not sent beside it.
        kept = [pair for pair in metadata if pair[0] not in added]
        return span, (_AioMetadata(*kept, *extra) if aio else (*kept, *extra))
    except Exception:
        if span is not None:
            span.finish()
        return None, metadata


def _finish(span: Any, code: Any) -> None:
    """Tag the call's status code (anything but OK fails the span) and end the span."""
    if code is not None:
        hit = _STATUS.get(id(code))
        tags = span.tags
        if hit is not None and tags.__class__ is list and len(hit[0]) <= limits.tag_value_max:
            tags += (TAG_GRPC_STATUS, hit[0])  # Span.tag(), inlined
            if hit[1]:
                span.error()
        elif hit is not None:
            span.tag(TAG_GRPC_STATUS, hit[0])
            if hit[1]:
                span.error()
        else:
            span.tag(TAG_GRPC_STATUS, str(code))
            if getattr(code, "name", "OK") != "OK":
                span.error()
    span.finish()


_OK = "StatusCode.OK"  # str(grpc.StatusCode.OK)


def _ok(span: Any) -> None:
    """A blocking unary call returned: its status is OK."""
    tags = span.tags
    if tags.__class__ is list and len(_OK) <= limits.tag_value_max:
        tags += (TAG_GRPC_STATUS, _OK)  # Span.tag(), inlined
    else:
        span.tag(TAG_GRPC_STATUS, _OK)
    span.finish()


def _raised(span: Any, e: BaseException) -> None:
    """The library raised: an ``RpcError`` that is a call carries its status code (tagged,
    no stack logged, as for a call that ends in error later); anything else is logged on
    the span."""
    import grpc  # noqa: PLC0415 (loaded: its channel raised)

    if isinstance(e, grpc.RpcError) and callable(getattr(e, "code", None)):
        try:
            _finish(span, e.code())
            return
        except Exception:
            pass
    span.error(e)
    span.finish()


# -- grpc (threads) ------------------------------------------------------------------------
def _sync_done(span: Any, call: Any) -> None:
    # grpc calls back once the call's state has its code: read it there, not through
    # ``call.code()`` (the condition's lock again and, for a response iterator, a wait loop
    # around it: ~a fifth of what the span costs such a call).
    try:
        code = getattr(getattr(call, "_state", None), "code", None)
        if code is None:
            code = call.code()
    except Exception:
        code = None
    if code is _CODE_OK:
        _ok(span)  # the common case: no status table look-up
    else:
        _finish(span, code)


def _watch(span: Any, call: Any) -> Any:
    """End ``span`` when ``call`` (a future or a response iterator) terminates."""
    try:
        # Called at once when the call has already terminated.
        call.add_done_callback(functools.partial(_sync_done, span))
    except Exception:
        span.finish()
    return call


class _Traced:
    """What the traced multicallables share: the library's one, the method and target."""

    __slots__ = ("_inner", "_op", "_target")

    def __init__(self, inner: Any, op: str, target: str) -> None:
        self._inner = inner
        self._op = op
        self._target = target

    def __getattr__(self, name: str) -> Any:
        # Anything else (grpc's private attributes) is the library multicallable's.
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)


def _begin_args(op: str, target: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """``_begin`` for a sync multicallable's arguments (``request``, ``timeout``,
    ``metadata``, ...; by position or by name): ``(span, args)``, ``kwargs`` updated."""
    if len(args) > 2:
        span, md = _begin(op, target, args[2])
        if span is not None:
            args = (args[0], args[1], md, *args[3:])
        return span, args
    span, md = _begin(op, target, kwargs.get("metadata"))
    if span is not None:
        kwargs["metadata"] = md
    return span, args


class _Blocking(_Traced):
    """unary-unary and stream-unary: ``__call__``, ``with_call``, ``future``."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        span, args = _begin_args(self._op, self._target, args, kwargs)
        if span is None:
            return self._inner(*args, **kwargs)
        try:
            response = self._inner(*args, **kwargs)
        except BaseException as e:
            _raised(span, e)
            raise
        _ok(span)
        return response

    def with_call(self, *args: Any, **kwargs: Any) -> Any:
        span, args = _begin_args(self._op, self._target, args, kwargs)
        if span is None:
            return self._inner.with_call(*args, **kwargs)
        try:
            got = self._inner.with_call(*args, **kwargs)
        except BaseException as e:
            _raised(span, e)
            raise
        _ok(span)
        return got

    def future(self, *args: Any, **kwargs: Any) -> Any:
        span, args = _begin_args(self._op, self._target, args, kwargs)
        if span is None:
            return self._inner.future(*args, **kwargs)
        try:
            fut = self._inner.future(*args, **kwargs)
        except BaseException as e:
            _raised(span, e)
            raise
        return _watch(span, fut)


class _Streaming(_Traced):
    """unary-stream and stream-stream: ``__call__`` returns the response iterator."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        span, args = _begin_args(self._op, self._target, args, kwargs)
        if span is None:
            return self._inner(*args, **kwargs)
        try:
            call = self._inner(*args, **kwargs)
        except BaseException as e:
            _raised(span, e)
            raise
        return _watch(span, call)


# -- grpc.aio --------------------------------------------------------------------------------
_CODES: dict[Any, Any] = {}  # cygrpc status code -> grpc.StatusCode, filled at install
_CODE_OK: Any = object()  # grpc.StatusCode.OK, set at install
_AioMetadata: Any = None  # grpc.aio.Metadata, set at install


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
        # The status code of the finished call without awaiting: its cython call's status
        # (an intercepted call has none: AttributeError, then the coroutine below).
        code = _CODES.get(call._cython_call._status.code())
    except Exception:
        code = None
    if code is _CODE_OK:
        _ok(span)  # the common case: no status table look-up
        return
    if code is None and hasattr(call, "code"):
        try:
            # An intercepted call (the application's interceptors run after us) only
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


class _Aio(_Traced):
    """Every ``grpc.aio`` kind: ``__call__`` returns the call object (not a coroutine)."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        span, md = _begin(self._op, self._target, kwargs.get("metadata"), True)  # keyword-only
        if span is None:
            return self._inner(*args, **kwargs)
        kwargs["metadata"] = md
        try:
            call = self._inner(*args, **kwargs)
        except BaseException as e:
            _raised(span, e)
            raise
        try:
            call.add_done_callback(functools.partial(_aio_done, span))
        except Exception:
            span.finish()
        return call


# -- the channels ----------------------------------------------------------------------------
KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def _classes(aio: bool) -> dict[str, type]:
    """The traced multicallable class of each kind, a subclass of grpc's abstract one (an
    ``isinstance`` check of the application's still holds)."""
    if aio:
        from grpc.aio import _base_channel as base  # noqa: PLC0415

        bases: dict[str, type] = {k: _Aio for k in KINDS}
    else:
        import grpc as base  # noqa: PLC0415

        bases = {"unary_unary": _Blocking, "unary_stream": _Streaming}
        bases.update(stream_unary=_Blocking, stream_stream=_Streaming)
    out: dict[str, type] = {}
    for kind, ours in bases.items():
        abstract = getattr(base, "".join(p.title() for p in kind.split("_")) + "MultiCallable")
        out[kind] = type(f"Traced{abstract.__name__}", (ours, abstract), {"__slots__": ()})
    return out


class ClientTracing:
    """Channel marking and the multicallable factories' wrappers, for ``grpcio.install``."""

    def __init__(self, ignored: Ignored) -> None:
        self.ignored = ignored
        self._sync = _classes(aio=False)
        self._aio = _classes(aio=True)
        _status_table()
        global _AioMetadata, _CODE_OK
        from grpc import StatusCode, _common, aio  # noqa: PLC0415

        _CODES.update(_common.CYGRPC_STATUS_CODE_TO_STATUS_CODE)
        _AioMetadata = aio.Metadata
        _CODE_OK = StatusCode.OK

    @staticmethod
    def mark(channel: Any, target: Any) -> None:
        """Trace the calls of ``channel`` (made by the application) to ``target``."""
        try:
            setattr(channel, TARGET, str(target))
        except Exception:
            pass  # a channel type we do not know: left untraced

    def factory(self, orig: Callable[..., Any], kind: str, aio: bool) -> Callable[..., Any]:
        """A wrapper of ``Channel.<kind>`` (the class's): on a marked channel, the library's
        multicallable in a traced one, unless the method is ignored."""
        cls = (self._aio if aio else self._sync)[kind]
        ignored = self.ignored

        def multicallable(channel: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
            made = orig(channel, method, *args, **kwargs)
            target = getattr(channel, TARGET, None)
            if target is None:
                return made
            try:
                op = method.decode("utf-8", "replace") if isinstance(method, bytes) else str(method)
                return made if ignored(op) else cls(made, op, target)
            except Exception:
                return made

        return multicallable
