"""aiohttp: entry span per request served by ``aiohttp.web``, exit span per
``ClientSession`` request with ``sw8`` injected (component AioHttp, 7008).

Server: ``RequestHandler._handle_request`` (the coroutine that runs the application for one
request and turns its exceptions into responses) is wrapped, so every server aiohttp
supports (``web.run_app``, ``python -m aiohttp.web``, Gunicorn's ``GunicornWebWorker``)
is covered. The operation name becomes the matched route's template (``/users/{id}``) as
soon as the router resolved it (when it builds the ``UrlMappingMatchInfo``), before the
handler runs, so ``sw8`` sent downstream names the template too; unmatched requests keep
their path (``SW_PLUGIN_HTTP_ROUTE_TEMPLATES=false``: always the path). An exception that
aiohttp turns into a 500 is logged on the span with its stack. A handler that raises after
its response went out (a ``StreamResponse`` failing half-way: aiohttp drops the connection)
leaves the span failed with the status that was sent (``_tag_sent``).

Client: ``ClientSession._request``; the span ends when the response headers arrived (the
body is read afterwards by the application); with ``raise_for_status`` the status of the
``ClientResponseError`` raised is tagged too. The caller's headers object is never
modified. Requests made by the agent's own reporter (HTTP protocol, thread mode) are not
traced.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from swmp.instrument._http import peer_of, record_status, request_tags
from swmp.instrument._incoming import reporter_is_calling
from swmp.instrument._patch import patch, restore
from swmp.instrument._route import name_request, record_exception, request_span
from swmp.propagation import from_headers
from swmp.tracing import context as _ctx
from swmp.tracing.constants import TAG_HTTP_METHOD, TAG_HTTP_URL, Component, Kind, Layer
from swmp.tracing.limits import limits
from swmp.tracing.span import NO_TAGS, NOOP, Span, current_span

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "aiohttp"
PEER_NAMES = ("sw_aiohttp",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "aiohttp"
SUPPORTED = ("3.8", "4")
TRIGGER = "aiohttp"  # its __init__ imports client, web_protocol and web_urldispatcher

_AIOHTTP = Component.AIOHTTP
_HTTP = Layer.HTTP
_UNSET: Any = object()
_OP = "_swmp_op"  # the operation name kept on an aiohttp route
_get_current = current_span.get
_ENTRY = Kind.ENTRY


def _server(config: Config) -> None:
    from aiohttp.web_protocol import RequestHandler  # noqa: PLC0415
    from aiohttp.web_urldispatcher import UrlMappingMatchInfo  # noqa: PLC0415

    # The per-request path below inlines what ``http_entry_span`` and ``name_request`` do
    # (each Python call it saves is paid with the CPU caches cold behind a real server,
    # docs/performance.md "aiohttp and Tornado: fewer calls per request").
    def make_handle(orig: Any) -> Any:
        async def _handle_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            method = request.method
            rules = _ctx.policy.rules
            # No call at all when no method is ignored (IgnoreRules keeps them in _methods).
            if getattr(rules, "_methods", True) and rules.ignore_method(method):
                return await orig(self, request, *args, **kwargs)
            path = request.path
            get = request.headers.get
            sw8 = get("sw8")
            carrier = (
                None
                if sw8 is None
                else from_headers(
                    sw8,
                    get("sw8-correlation"),
                    get("sw8-x"),
                    limits.correlation_max_elements,
                    limits.correlation_max_value_length,
                )
            )
            span: Any = _ctx.new_entry_span(path, carrier, _AIOHTTP, _HTTP)
            if span.__class__ is not Span:
                if span is NOOP:  # an entry span of this request is open already
                    return await orig(self, request, *args, **kwargs)
                with span:  # not recorded: only keeps nested instrumentation quiet
                    return await orig(self, request, *args, **kwargs)
            with span:
                try:
                    # request.scheme and request.host without their two calls: the values
                    # they compute (first use in this request) from the same fields.
                    ssl = getattr(request, "_transport_sslcontext", _UNSET)
                    scheme = request.scheme if ssl is _UNSET else "https" if ssl else "http"
                    url = f"{scheme}://{get('host') or request.host}{path}"
                    request_tags(span, method, url)
                    # What transport.get_extra_info("peername") said when the request was
                    # made (every aiohttp 3.x keeps it), without two more calls.
                    peer = getattr(request, "_transport_peername", _UNSET)
                    if peer is _UNSET:
                        transport = request.transport
                        peer = transport.get_extra_info("peername") if transport else None
                    if (peer.__class__ is tuple or isinstance(peer, (list, tuple))) and len(peer) >= 2:
                        span.peer = f"{peer[0]}:{peer[1]}"
                except Exception:
                    if span.tags is NO_TAGS:
                        span.tag(TAG_HTTP_METHOD, method)
                result = await orig(self, request, *args, **kwargs)
                try:
                    status = result[0].status
                    record_status(span, status)
                except Exception:
                    pass
                return result

        return _handle_request

    def make_error(orig: Any) -> Any:
        def handle_error(
            self: Any, request: Any, status: int = 500, exc: Any = None, message: Any = None
        ) -> Any:
            record_exception(exc)
            try:
                # aiohttp's own test: with bytes of the response out it cannot answer 500
                # (it raises, the connection dropped); the span keeps the status that went out.
                if request.writer.output_size > 0:
                    _tag_sent(request, exc if exc is not None else sys.exc_info()[1])
            except Exception:
                pass
            return orig(self, request, status, exc, message)

        return handle_error

    def make_match_info(orig: Any) -> Any:
        # Built by the router once it found the route, before any handler or middleware
        # runs: a plain method is cheaper to wrap than the router's coroutine.
        def __init__(self: Any, match_dict: Any, route: Any) -> None:
            orig(self, match_dict, route)
            try:
                s = _get_current()
                if s is None:  # nothing recorded in this context
                    return
                op = getattr(route, _OP, None)
                if op is None:
                    resource = route.resource
                    if resource is None:  # a 404/405 (SystemRoute): the span keeps the path
                        return
                    op = resource.canonical
                    try:  # kept: once per route (its router is frozen while it serves)
                        setattr(route, _OP, op)
                    except Exception:
                        pass
                if not op:
                    return
                if s.__class__ is Span and s.kind == _ENTRY and not s.end:
                    s.set_operation(op)  # name_request() without its call: the common case
                else:
                    name_request(op)
            except Exception:
                pass

        return __init__

    patch(RequestHandler, "_handle_request", make_handle)
    patch(RequestHandler, "handle_error", make_error)
    if config.plugin_http_route_templates:
        patch(UrlMappingMatchInfo, "__init__", make_match_info)


def _tag_sent(request: Any, exc: BaseException | None) -> None:
    """Tag the request's entry span with the status of the response its handler prepared
    (headers sent) before ``exc`` ended it: a ``StreamResponse`` (a ``WebSocketResponse``'s
    101 too) of this request held by a frame the exception went through (a local of the
    handler, or of a function it called). aiohttp keeps no reference to it; looked for on
    this error path only, nothing is added per response. Not found: no status, as before."""
    from aiohttp.web_response import StreamResponse  # noqa: PLC0415

    span = request_span()
    tb = exc.__traceback__ if exc is not None else None
    if span is None or tb is None:
        return
    tb = tb.tb_next  # the first frame is aiohttp's, where it caught exc (running still)
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            if (
                isinstance(value, StreamResponse)
                and getattr(value, "_req", None) is request
                and value.prepared
            ):
                record_status(span, value.status)
                return
        tb = tb.tb_next


def _client() -> None:
    from aiohttp import ClientResponseError, ClientSession  # noqa: PLC0415
    from multidict import CIMultiDict  # noqa: PLC0415
    from yarl import URL  # noqa: PLC0415

    def make(orig: Any) -> Any:
        async def _request(self: Any, method: str, str_or_url: Any, **kwargs: Any) -> Any:
            if reporter_is_calling() or _ctx.policy.rules.ignore_method(method):
                return await orig(self, method, str_or_url, **kwargs)
            try:
                build = getattr(self, "_build_url", None)
                url = build(str_or_url) if build is not None else URL(str_or_url)
                path = url.path or "/"
                peer = peer_of(url.scheme, url.host, url.port)
            except Exception:
                return await orig(self, method, str_or_url, **kwargs)
            span = _ctx.new_exit_span(path, peer, _AIOHTTP, Layer.HTTP)
            if span is NOOP:
                return await orig(self, method, str_or_url, **kwargs)
            with span:
                if span.__class__ is Span:
                    span.tag(TAG_HTTP_METHOD, method.upper())
                    span.tag(TAG_HTTP_URL, f"{url.scheme}://{peer}{path}")
                    given = kwargs.get("headers")
                    headers = CIMultiDict(given) if given is not None else CIMultiDict()
                    headers.update(span.inject())  # replaces a forwarded sw8, never a second one
                    kwargs["headers"] = headers
                try:
                    resp = await orig(self, method, str_or_url, **kwargs)
                except ClientResponseError as e:  # raise_for_status: the status it refused
                    status = e.status
                    if span.__class__ is Span and status.__class__ is int and status >= 100:
                        record_status(span, status)
                    raise
                if span.__class__ is Span:
                    record_status(span, resp.status)
                return resp

        return _request

    patch(ClientSession, "_request", make)


def install(config: Config) -> None:
    _server(config)
    _client()


def uninstall() -> None:
    from aiohttp import ClientSession  # noqa: PLC0415
    from aiohttp.web_protocol import RequestHandler  # noqa: PLC0415
    from aiohttp.web_urldispatcher import UrlMappingMatchInfo  # noqa: PLC0415

    restore(RequestHandler, "_handle_request")
    restore(RequestHandler, "handle_error")
    restore(UrlMappingMatchInfo, "__init__")
    restore(ClientSession, "_request")
