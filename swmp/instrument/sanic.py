"""Sanic: entry span per routed request (component Sanic, 7007).

Sanic recompiles its request-handling methods at start-up ("touch-up"), so they cannot be
wrapped; instead every ``Sanic`` application gets, when it is created, a request
middleware (registered first, so it runs before the application's own) that starts the
span and two inline signal handlers: ``http.lifecycle.exception`` logs the exception with
its stack, ``http.lifecycle.response`` tags the status and finishes the span (on every
path: normal, error pages, streamed responses). The operation name is the route's URI
template (``/users/<id:int>``; the path with ``SW_PLUGIN_HTTP_ROUTE_TEMPLATES=false``).
Requests that match no route (404) keep the path.
``SW_PLUGIN_SANIC_COLLECT_HTTP_PARAMS`` adds the query string.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument._http import record_status
from swmp.instrument._incoming import activate, http_entry_span
from swmp.instrument._patch import patch, restore
from swmp.tracing.constants import TAG_HTTP_PARAMS, TAG_HTTP_URL, Component
from swmp.tracing.span import Span

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "sanic"
PEER_NAMES = ("sw_sanic", "sw_sanic_v2")  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "sanic"
SUPPORTED = ("22.9", "26")
TRIGGER = "sanic"  # its __init__ imports sanic.app

_SPAN = "_swmp_span"


def _hooks(templates: bool, collect_params: bool, params_limit: int) -> tuple[Any, Any, Any]:
    async def on_request(request: Any) -> None:
        op = (request.uri_template if templates else None) or request.path
        span = http_entry_span(op, request.headers, request.method, Component.SANIC)
        if span is None:
            return
        try:
            if span.__class__ is Span:
                # Not request.url: it resolves proxy headers and the server name every time
                # (it was a third of the span's cost); the Host header is what aiohttp and
                # Tornado report too.
                info = request.conn_info
                scheme = "https" if info is not None and info.ssl else "http"
                span.tag(TAG_HTTP_URL, f"{scheme}://{request.headers.get('host', '')}{request.path}")
                if request.ip:
                    span.peer = f"{request.ip}:{request.port}" if request.port else request.ip
                if collect_params and request.query_string:
                    qs = request.query_string
                    span.tag(TAG_HTTP_PARAMS, qs[:params_limit] if params_limit >= 0 else qs)
        finally:
            setattr(request.ctx, _SPAN, span)
            # The middleware is awaited inline by the request's task: the handler runs
            # with the span current.
            activate(span)

    async def on_exception(request: Any, exception: BaseException) -> None:
        span = getattr(getattr(request, "ctx", None), _SPAN, None) if request is not None else None
        if span is not None and not span.end:
            span.error(exception)

    async def on_response(request: Any, response: Any) -> None:
        span = getattr(getattr(request, "ctx", None), _SPAN, None) if request is not None else None
        if span is None or span.end:
            return
        if span.__class__ is Span and response is not None:
            try:
                record_status(span, int(response.status))
            except Exception:
                pass
        span.finish()

    return on_request, on_exception, on_response


def install(config: Config) -> None:
    from sanic import Sanic  # noqa: PLC0415

    on_request, on_exception, on_response = _hooks(
        config.plugin_http_route_templates,
        config.plugin_sanic_collect_http_params,
        config.plugin_http_http_params_length_threshold,
    )

    def make(orig: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            try:
                self.register_middleware(on_request, "request")
                self.signal("http.lifecycle.exception")(on_exception)
                self.signal("http.lifecycle.response")(on_response)
            except Exception:
                pass  # an application Sanic refuses hooks on stays untraced, never broken

        return __init__

    patch(Sanic, "__init__", make)


def uninstall() -> None:
    from sanic import Sanic  # noqa: PLC0415

    restore(Sanic, "__init__")
