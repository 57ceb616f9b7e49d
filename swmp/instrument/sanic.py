"""Sanic: entry span per request (component Sanic, 7007).

``Sanic.handle_request`` (routing, middleware, the handler, the response; it turns the
exceptions into error pages through ``Sanic.handle_exception``) is wrapped, for every
application and every way Sanic serves one (its HTTP/1.1 and HTTP/3 servers, ASGI). No
middleware nor signal handler is registered: an application that has none pays nothing
for Sanic's signal dispatch (a request middleware and two signal handlers per request
were most of what the previous hooks cost).

Sanic recompiles ``handle_request`` and ``handle_exception`` from their source when a
server starts ("touch-up", ``Sanic._startup``): it reads the source of the original
through the wrapper's ``__wrapped__`` and replaces the class attribute, so the wrappers
are put back around the recompiled methods right after ``_startup``.

The operation name is the route's URI template (``/users/<id:int>``), looked up before
the span starts (``app.router.get``, the call ``handle_request`` makes itself, cached by
Sanic), so the ignore rules, the sampler and profile tasks see the template;
``SW_PLUGIN_HTTP_ROUTE_TEMPLATES=false`` keeps the path, and so do requests that match
no route (404, 405); the path, in the name and ``http.url``, is the text it spells
(``/caf%C3%A9`` is ``/café``), as under aiohttp, ASGI and WSGI. The span ends when
``handle_request`` returns (the response sent), with the status of the response it sent
(101 for a websocket handler served by Sanic's own server: its upgrade is no response of
Sanic's). An exception Sanic turns into a 5xx page is logged on the span with its stack (a
``SanicException`` with a 4xx status, such as the router's ``NotFound``, only marks the
span failed through its status).
``SW_PLUGIN_SANIC_COLLECT_HTTP_PARAMS`` adds the query string.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument._http import path_text, record_status
from swmp.instrument._incoming import http_entry_span
from swmp.instrument._patch import is_patched, patch, restore
from swmp.instrument._route import name_request, record_exception
from swmp.tracing.constants import TAG_HTTP_PARAMS, TAG_HTTP_URL, Component
from swmp.tracing.span import Span

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "sanic"
PEER_NAMES = ("sw_sanic", "sw_sanic_v2")  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "sanic"
SUPPORTED = ("22.9", "26")
TRIGGER = "sanic"  # its __init__ imports sanic.app

_SANIC = Component.SANIC
_TOUCHED = ("handle_request", "handle_exception")  # recompiled by Sanic's touch-up


def _makers(templates: bool, collect_params: bool, params_limit: int) -> dict[str, Any]:
    def start(app: Any, request: Any) -> Any:
        """The request's entry span (None: not traced), named and tagged."""
        raw: str = request.path  # a property (the URL's bytes as text, escapes kept): read once
        method: str = request.method
        headers = request.headers
        host = headers.getone("host", None)
        # The text it spells (_http.path_text), as aiohttp, ASGI and WSGI name a path.
        path = path_text(raw) if "%" in raw else raw
        op = path
        routed = False
        if templates:
            try:
                op = f"/{app.router.get(raw, method, host)[0].path}"
                routed = True
            except Exception:
                pass  # no route (404/405): Sanic answers it, the span keeps the path
        span = http_entry_span(op, headers, method, _SANIC)
        if span is None:
            if routed:
                name_request(op)  # e.g. the entry span of an ASGI server around Sanic
            return None
        if span.__class__ is Span:
            try:
                # Not request.url: it resolves proxy headers and the server name every
                # time; the Host header is what aiohttp and Tornado report too.
                info = request.conn_info
                scheme = "https" if info is not None and info.ssl else "http"
                span.tag(TAG_HTTP_URL, f"{scheme}://{host or ''}{path}")
                ip = request.ip
                if ip:
                    port = request.port
                    span.peer = f"{ip}:{port}" if port else ip
                if collect_params:
                    qs = request.query_string
                    if qs:
                        span.tag(TAG_HTTP_PARAMS, qs[:params_limit] if params_limit >= 0 else qs)
            except Exception:
                pass
        return span

    def make_handle_request(orig: Any) -> Any:
        async def handle_request(self: Any, request: Any) -> Any:
            try:
                span = start(self, request)
            except Exception:
                span = None
            if span is None:
                return await orig(self, request)
            with span:  # current for the handler; an exception escaping Sanic is logged
                result = await orig(self, request)
                if span.__class__ is Span:
                    try:
                        stream = request.stream
                        response = stream.response if stream is not None else None
                        if response is not None:
                            record_status(span, int(response.status))
                        elif (
                            not self.asgi  # (there the upgrade is the ASGI server's)
                            and getattr(request.transport.get_protocol(), "websocket", None) is not None
                        ):
                            # A websocket handler: the upgrade (its 101) went out through the
                            # websockets library, not as a response of Sanic's (its refusal,
                            # a 4xx page, would be one); tagged as aiohttp and Tornado do.
                            record_status(span, 101)
                    except Exception:
                        pass
                return result

        return handle_request

    def make_handle_exception(orig: Any) -> Any:
        async def handle_exception(self: Any, request: Any, exception: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                if getattr(exception, "status_code", 500) >= 500:  # a 404 is no failure to log
                    record_exception(exception)
            except Exception:
                pass
            return await orig(self, request, exception, *args, **kwargs)

        return handle_exception

    return {"handle_request": make_handle_request, "handle_exception": make_handle_exception}


def _wrap(sanic: Any, makers: dict[str, Any]) -> None:
    for name in _TOUCHED:
        patch(sanic, name, makers[name])


def install(config: Config) -> None:
    from sanic import Sanic  # noqa: PLC0415

    makers = _makers(
        config.plugin_http_route_templates,
        config.plugin_sanic_collect_http_params,
        config.plugin_http_http_params_length_threshold,
    )

    def make_startup(orig: Any) -> Any:
        async def _startup(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = await orig(self, *args, **kwargs)
            # Touch-up (inside _startup) replaced the wrappers by the recompiled originals.
            if is_patched(Sanic, "_startup"):  # not after uninstall
                try:
                    _wrap(Sanic, makers)
                except Exception:
                    pass
            return result

        return _startup

    _wrap(Sanic, makers)
    patch(Sanic, "_startup", make_startup)


def uninstall() -> None:
    from sanic import Sanic  # noqa: PLC0415

    restore(Sanic, "_startup")
    for name in _TOUCHED:
        restore(Sanic, name)
