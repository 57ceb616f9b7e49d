"""Tornado: entry span per request handled by a ``RequestHandler`` (component Tornado, 7005).

``RequestHandler._execute`` (routing is done, the handler instance exists; it runs prepare,
the HTTP method and finish, and turns exceptions into error pages) is wrapped. The
operation name is the pattern of the URL rule that matched (``/users/([0-9]+)``), so one
rule is one endpoint (``SW_PLUGIN_HTTP_ROUTE_TEMPLATES=false``: the path; a path no rule
matched too). The path, in the name and ``http.url``, is the text it spells
(``/caf%C3%A9`` is ``/café``, ``_http.path_text``), as under aiohttp, ASGI and WSGI. An
uncaught exception (Tornado's ``log_exception``) is logged on the span with its stack. The
peer is the client's ``ip:port`` (the ip alone when ``xheaders`` replaced the connection's).

The rule is found without touching the routing: each application keeps an index, built on
its first request and again when a router's rule list changes length (``add_handlers``,
``add_rules``), of handler class -> the ``PathMatches`` patterns of the rules that lead to
it (the innermost one along nested routers). A class with one rule (the usual case) has its
pattern checked against the path once; a class under several rules gets the first whose
pattern matches, in Tornado's own rule order. A wrapper of ``PathMatches.match`` cost a
Python call per rule tried, before the one that matched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument._http import path_text, record_status, request_tags
from swmp.instrument._patch import patch, restore
from swmp.instrument._route import record_exception
from swmp.propagation import from_headers
from swmp.tracing import context as _ctx
from swmp.tracing.constants import TAG_HTTP_METHOD, Component, Layer
from swmp.tracing.limits import limits
from swmp.tracing.span import NO_TAGS, NOOP, Span

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "tornado"
PEER_NAMES = ("sw_tornado",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "tornado"
SUPPORTED = ("6.0", "7")
TRIGGER = "tornado.web"  # defines RequestHandler and imports tornado.routing

_ROUTES = "_swmp_routes"  # on an Application: its _Routes
_HTTP = Layer.HTTP
_TORNADO = Component.TORNADO


class _Routes:
    """An application's handler classes -> ``((regex or None, operation name), ...)``, in
    rule order, and the rule lists it was built from with their lengths then."""

    __slots__ = ("by_class", "sizes")

    def __init__(self, app: Any) -> None:
        from tornado.routing import PathMatches, RuleRouter  # noqa: PLC0415
        from tornado.web import RequestHandler  # noqa: PLC0415

        self.sizes: list[tuple[list[Any], int]] = []
        found: dict[Any, list[tuple[Any, str | None]]] = {}

        def walk(router: Any, regex: Any, depth: int) -> None:
            rules = getattr(router, "rules", None)
            if rules.__class__ is not list or depth > 16:
                return
            self.sizes.append((rules, len(rules)))
            for rule in rules:
                matcher = getattr(rule, "matcher", None)
                rx = matcher.regex if isinstance(matcher, PathMatches) else regex
                target = getattr(rule, "target", None)
                if isinstance(target, RuleRouter):
                    walk(target, rx, depth + 1)
                elif isinstance(target, type) and issubclass(target, RequestHandler):
                    pattern = getattr(rx, "pattern", None)
                    if pattern.__class__ is not str:
                        rx = pattern = None
                    elif pattern.endswith("$"):
                        pattern = pattern[:-1]
                    found.setdefault(target, []).append((rx, pattern))

        walk(getattr(app, "default_router", None), None, 0)
        self.by_class = {cls: tuple(entries) for cls, entries in found.items()}


def _routes(app: Any) -> _Routes | None:
    """``app``'s index, (re)built now; None if it cannot be (left unnamed: the path)."""
    try:
        routes = _Routes(app)
        setattr(app, _ROUTES, routes)
        return routes
    except Exception:
        return None


def _carrier(headers: Any) -> Any:
    """The request's decoded ``sw8`` headers (asked only when it has one: ``HTTPHeaders.get``
    of an absent header raises and catches a KeyError in two Python frames)."""
    get = headers.get
    return from_headers(
        get("sw8"),
        get("sw8-correlation"),
        get("sw8-x"),
        limits.correlation_max_elements,
        limits.correlation_max_value_length,
    )


def install(config: Config) -> None:
    from tornado.web import RequestHandler  # noqa: PLC0415

    templates = config.plugin_http_route_templates

    # The per-request path inlines what ``http_entry_span`` does (each Python call it saves
    # is paid with the CPU caches cold behind a real server, docs/performance.md).
    def make_execute(orig: Any) -> Any:
        async def _execute(self: Any, transforms: Any, *args: Any, **kwargs: Any) -> Any:
            request = self.request
            method = request.method or "GET"
            rules = _ctx.policy.rules
            # No call at all when no method is ignored (IgnoreRules keeps them in _methods).
            if getattr(rules, "_methods", True) and rules.ignore_method(method):
                return await orig(self, transforms, *args, **kwargs)
            op = None
            if templates:
                # The matched rule's pattern (module docstring), inline: no call per request
                # unless the index is missing or stale.
                app = self.application
                routes = getattr(app, _ROUTES, None)
                if routes is not None:
                    for rules, n in routes.sizes:
                        if len(rules) != n:
                            routes = _routes(app)
                            break
                else:
                    routes = _routes(app)
                entries = routes.by_class.get(self.__class__) if routes is not None else None
                if entries is not None:
                    raw = request.path  # what Tornado's rules matched
                    for rx, pattern in entries:
                        if rx is None or rx.match(raw) is not None:
                            op = pattern
                            break
            path = request.path or "/"
            if "%" in path or not path.isascii():  # the text it spells (_http.path_text)
                path = path_text(path, latin1=True)
            if op is None:
                op = path
            headers = request.headers
            carrier = _carrier(headers) if "sw8" in headers else None
            span: Any = _ctx.new_entry_span(op, carrier, _TORNADO, _HTTP)
            if span.__class__ is not Span:
                if span is NOOP:  # an entry span of this request is open already
                    return await orig(self, transforms, *args, **kwargs)
                with span:  # not recorded: only keeps nested instrumentation quiet
                    return await orig(self, transforms, *args, **kwargs)
            with span:
                try:
                    url = f"{request.protocol}://{request.host}{path}"
                    request_tags(span, method, url)
                    ip = request.remote_ip
                    if ip:
                        # The connection's (ip, port) as accepted; its port only while
                        # remote_ip is that ip (``xheaders`` may name the proxy's client).
                        addr = getattr(getattr(request.connection, "context", None), "address", None)
                        if addr.__class__ is tuple and len(addr) >= 2 and addr[0] == ip:
                            span.peer = f"{ip}:{addr[1]}"
                        else:
                            span.peer = ip
                except Exception:
                    if span.tags is NO_TAGS:
                        span.tag(TAG_HTTP_METHOD, method)
                result = await orig(self, transforms, *args, **kwargs)
                status = self.get_status()
                record_status(span, status)
                return result

        return _execute

    def make_log_exception(orig: Any) -> Any:
        def log_exception(self: Any, typ: Any, value: Any, tb: Any) -> Any:
            try:
                status = getattr(value, "status_code", 500)
                if not isinstance(status, int) or status >= 500:  # an HTTPError(404) is no failure
                    record_exception(value)
            except Exception:  # an exception of the application's we cannot read: not ours to raise
                pass
            return orig(self, typ, value, tb)

        return log_exception

    patch(RequestHandler, "_execute", make_execute)
    patch(RequestHandler, "log_exception", make_log_exception)


def uninstall() -> None:
    from tornado.web import RequestHandler  # noqa: PLC0415

    restore(RequestHandler, "_execute")
    restore(RequestHandler, "log_exception")
