"""ASGI: one entry span per HTTP request (WebSocket and lifespan scopes pass through).

Use directly (``app = ASGIMiddleware(app)``) or through the framework instrumentations
(Starlette/FastAPI, Django under ASGI, Falcon's ASGI app). The span is current for the
whole application call, in the request's own task, so spans created by the handler (and
tasks it spawns, which copy the context) are its children.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from swmp.instrument._http import record_status
from swmp.propagation import from_headers, header_lookup
from swmp.tracing import context as _ctx
from swmp.tracing.constants import TAG_HTTP_METHOD, TAG_HTTP_PARAMS, TAG_HTTP_URL, Component, Layer
from swmp.tracing.limits import limits
from swmp.tracing.span import NOOP, Span

NAME = "asgi"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _url(scope: Scope, path: str) -> str:
    host = header_lookup(scope.get("headers") or (), "host")
    if isinstance(host, (bytes, bytearray)):
        host = bytes(host).decode("latin-1")
    if not host:
        server = scope.get("server") or ("", "")
        host = f"{server[0]}:{server[1]}"
    return f"{scope.get('scheme', 'http')}://{host}{scope.get('root_path', '')}{path}"


async def trace_asgi(
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    component: int = Component.PYTHON,
    collect_params: bool = False,
    params_limit: int = 1024,
) -> None:
    """Run ``app(scope, receive, send)`` inside an entry span (HTTP scopes only)."""
    if scope.get("type") != "http":
        await app(scope, receive, send)
        return
    method = scope.get("method") or "GET"
    if _ctx.policy.rules.ignore_method(method):
        await app(scope, receive, send)
        return
    path = scope.get("path") or "/"
    headers = scope.get("headers") or ()
    carrier = None
    sw8 = header_lookup(headers, "sw8")
    if sw8 is not None:
        carrier = from_headers(
            sw8,
            header_lookup(headers, "sw8-correlation"),
            header_lookup(headers, "sw8-x"),
            limits.correlation_max_elements,
            limits.correlation_max_value_length,
        )
    span = _ctx.new_entry_span(path, carrier, component, Layer.HTTP)
    if span is NOOP:
        await app(scope, receive, send)
        return
    with span:
        if isinstance(span, Span):
            _tag(span, scope, method, path, collect_params, params_limit)

            async def _send(message: Message) -> None:
                if message.get("type") == "http.response.start":
                    try:
                        record_status(span, int(message.get("status", 0)))
                    except (TypeError, ValueError):
                        pass
                await send(message)

            await app(scope, receive, _send)
        else:
            await app(scope, receive, send)


def _tag(  # noqa: PLR0917
    span: Span, scope: Scope, method: str, path: str, collect_params: bool, params_limit: int
) -> None:
    try:
        span.tag(TAG_HTTP_METHOD, method)
        span.tag(TAG_HTTP_URL, _url(scope, path))
        client = scope.get("client")
        if client:
            span.peer = f"{client[0]}:{client[1]}"
        if collect_params:
            qs = scope.get("query_string")
            if qs:
                q = bytes(qs).decode("latin-1")
                span.tag(TAG_HTTP_PARAMS, q[:params_limit] if params_limit >= 0 else q)
    except Exception:
        pass


class ASGIMiddleware:
    """Wrap an ASGI application so every HTTP request gets an entry span."""

    def __init__(
        self,
        app: ASGIApp,
        component: int = Component.PYTHON,
        collect_params: bool = False,
        params_limit: int = 1024,
    ) -> None:
        self.app = app
        self.component = component
        self.collect_params = collect_params
        self.params_limit = params_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await trace_asgi(
            self.app,
            scope,
            receive,
            send,
            component=self.component,
            collect_params=self.collect_params,
            params_limit=self.params_limit,
        )


def traced_asgi_method(component: int, collect_params: bool, params_limit: int) -> Callable[[Any], Any]:
    """A patch factory for frameworks whose ASGI entry point is an ``async`` *method*
    (Django's ``ASGIHandler.__call__``, Falcon's ``falcon.asgi.App.__call__``)."""

    def make(orig: Any) -> Any:
        async def method(self: Any, scope: Scope, receive: Receive, send: Send) -> None:
            def call(s: Scope, r: Receive, d: Send) -> Awaitable[None]:
                return orig(self, s, r, d)  # type: ignore[no-any-return]

            await trace_asgi(
                call,
                scope,
                receive,
                send,
                component=component,
                collect_params=collect_params,
                params_limit=params_limit,
            )

        return method

    return make
