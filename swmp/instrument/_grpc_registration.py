"""gRPC server side: where the method handlers get their spans (``_grpc_server`` makes them).

A server created without interceptors of the application's has its handlers wrapped where
they are registered; a server with interceptors gets ours first. See :class:`ServerTracing`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from swmp.instrument._grpc_server import Ignored, give_metadata, method_name, wrap_handler


class ServerTracing:
    """Traces every server method not ``ignored``, in one of two ways per server.

    A server created without interceptors of the application's (the usual case) gets its
    handlers wrapped where they are registered (:meth:`trace_server`): the generic handlers
    hand out wrapped method handlers, the registered method handlers are wrapped once.
    grpc's interceptor machinery costs more per call than the span's gRPC-specific work
    (the sync server's pipeline of Python calls: ~5,000 instructions). With interceptors of
    the application's, ours goes first (:attr:`sync_interceptor`, :attr:`aio_interceptor`),
    so the span covers what they do around the method as well.
    """

    def __init__(self, ignored: Ignored) -> None:
        import grpc  # noqa: PLC0415
        from grpc import aio  # noqa: PLC0415

        self.ignored = ignored
        # Servers hand out the same handler object for a method on every call: wrap it
        # once. Keyed by (handler, method) identity; bounded (cleared when full, which only
        # costs wrapping again).
        self._wrapped: dict[tuple[int, str], tuple[Any, Any]] = {}
        wrapped = self._wrapped
        wrap = self.wrap

        # The handler is looked up on every call (an interceptor runs per RPC): the cache
        # hit is inlined into each interceptor, the rest is wrap().
        class SyncInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
            def intercept_service(self, continuation: Any, details: Any) -> Any:
                handler = continuation(details)
                if handler is None:
                    return None  # unknown method: gRPC answers UNIMPLEMENTED itself
                try:
                    hit = wrapped.get((id(handler), details.method))
                except Exception:  # an unhashable method name: wrap() copes or gives up
                    hit = None
                if hit is not None and hit[0] is handler:
                    return hit[1]
                return wrap(handler, details)

        class AioInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
            async def intercept_service(self, continuation: Any, details: Any) -> Any:
                return _handing_over(await continuation(details), details, wrapped, wrap)

        self.sync_interceptor = SyncInterceptor()
        self.aio_interceptor = AioInterceptor()

    def wrap(self, handler: Any, details: Any) -> Any:
        """``handler`` wrapped for the method of ``details``, once per (handler, method)."""
        try:
            method = details.method
            if method.__class__ is not str:
                method = method_name(details)
            key = (id(handler), method)
            wrapped = self._wrapped
            hit = wrapped.get(key)
            if hit is not None and hit[0] is handler:
                return hit[1]
            result = handler if self.ignored(method) else wrap_handler(handler, method)
            if len(wrapped) >= 4096:
                wrapped.clear()
            wrapped[key] = (handler, result)  # holds the handler: its id stays its own
            return result
        except Exception:
            return handler

    def generic(self, handler: Any, aio: bool) -> Any:
        """A generic RPC handler handing out the traced method handlers of ``handler``."""
        sync_cls, aio_cls = _generic_classes()
        if isinstance(handler, sync_cls) or not hasattr(handler, "service"):
            return handler  # ours already, or not a handler (grpc raises its own error)
        return (aio_cls if aio else sync_cls)(handler, self._wrapped, self.wrap)

    def registered(self, service: str, method_handlers: Any) -> Any:
        """``add_registered_method_handlers``' dict with every method's handler traced."""
        out = {}
        for name, handler in method_handlers.items():
            full = f"/{service}/{name}"  # grpc's fully qualified method name
            out[name] = handler if self.ignored(full) else wrap_handler(handler, full)
        return out

    def trace_server(self, server: Any, aio: bool) -> None:
        """Make ``server`` (created without application interceptors) register traced
        handlers from now on (its own methods, replaced on the instance)."""
        add_generic = server.add_generic_rpc_handlers
        add_registered = getattr(server, "add_registered_method_handlers", None)  # grpcio 1.62

        def add_generic_rpc_handlers(generic_rpc_handlers: Any) -> None:
            try:
                traced = [self.generic(h, aio) for h in generic_rpc_handlers]
            except Exception:
                traced = generic_rpc_handlers  # not iterable: grpc raises its own error
            add_generic(traced)

        def add_registered_method_handlers(service_name: str, method_handlers: Any) -> None:
            try:
                traced = self.registered(service_name, method_handlers)
            except Exception:
                traced = method_handlers
            add_registered(service_name, traced)  # type: ignore[misc]

        server.add_generic_rpc_handlers = add_generic_rpc_handlers
        if add_registered is not None:
            server.add_registered_method_handlers = add_registered_method_handlers


def _handing_over(handler: Any, details: Any, wrapped: dict[Any, Any], wrap: Callable[..., Any]) -> Any:
    """grpc.aio: the traced handler for ``handler``, the call's metadata handed over to its
    behaviour (see ``_aio_metadata``)."""
    if handler is None:
        return None  # unknown method: gRPC answers UNIMPLEMENTED itself
    try:
        hit = wrapped.get((id(handler), details.method))
    except Exception:  # an unhashable method name: wrap() copes or gives up
        hit = None
    result = hit[1] if hit is not None and hit[0] is handler else wrap(handler, details)
    if result is not handler:
        try:
            give_metadata(details.invocation_metadata)
        except Exception:
            pass
    return result


@functools.cache
def _generic_classes() -> tuple[type, type]:
    """(sync, aio) generic handler classes (made once grpc is imported)."""
    import grpc  # noqa: PLC0415

    class SyncGeneric(grpc.GenericRpcHandler):  # type: ignore[misc]
        """An application's generic handler, handing out traced method handlers."""

        __slots__ = ("_inner", "_wrap", "_wrapped")

        def __init__(self, inner: Any, wrapped: dict[Any, Any], wrap: Callable[..., Any]) -> None:
            self._inner = inner
            self._wrapped = wrapped
            self._wrap = wrap

        def service(self, handler_call_details: Any) -> Any:
            handler = self._inner.service(handler_call_details)
            if handler is None:
                return None
            try:
                hit = self._wrapped.get((id(handler), handler_call_details.method))
            except Exception:
                hit = None
            if hit is not None and hit[0] is handler:
                return hit[1]
            return self._wrap(handler, handler_call_details)

    class AioGeneric(SyncGeneric):
        __slots__ = ()

        def service(self, handler_call_details: Any) -> Any:
            return _handing_over(
                self._inner.service(handler_call_details), handler_call_details, self._wrapped, self._wrap
            )

    return SyncGeneric, AioGeneric
