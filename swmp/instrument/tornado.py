"""Tornado: entry span per request handled by a ``RequestHandler`` (component Tornado, 7005).

``RequestHandler._execute`` (routing is done, the handler instance exists; it runs prepare,
the HTTP method and finish, and turns exceptions into error pages) is wrapped. The
operation name is the pattern of the URL rule that matched (``/users/([0-9]+)``, noted by
a wrapper of ``tornado.routing.PathMatches.match``), so one rule is one endpoint
(``SW_PLUGIN_HTTP_ROUTE_TEMPLATES=false``: the path). An
uncaught exception (Tornado's ``log_exception``) is logged on the span with its stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument._http import record_status, request_tags
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

_ROUTE = "_swmp_route"
_HTTP = Layer.HTTP
_TORNADO = Component.TORNADO
# Rule pattern -> operation name ("/users/([0-9]+)$" -> "/users/([0-9]+)"): an application
# has a bounded set of rules, so the name is made once, not per request (cleared when full).
_templates: dict[str, str] = {}


def _template(pattern: str) -> str:
    if len(_templates) >= 4096:
        _templates.clear()
    op = _templates[pattern] = pattern[:-1] if pattern.endswith("$") else pattern
    return op


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
    from tornado.routing import PathMatches  # noqa: PLC0415
    from tornado.web import RequestHandler  # noqa: PLC0415

    def make_match(orig: Any) -> Any:
        def match(self: Any, request: Any) -> Any:
            found = orig(self, request)
            if found is not None:
                try:
                    setattr(request, _ROUTE, self.regex.pattern)
                except Exception:
                    pass
            return found

        return match

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
            pattern = getattr(request, _ROUTE, None)
            op = (request.path or "/") if pattern is None else (_templates.get(pattern) or _template(pattern))
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
                    url = f"{request.protocol}://{request.host}{request.path}"
                    request_tags(span, method, url)
                    if request.remote_ip:
                        span.peer = request.remote_ip
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
            if getattr(value, "status_code", 500) >= 500:  # an HTTPError(404) is no failure
                record_exception(value)
            return orig(self, typ, value, tb)

        return log_exception

    if config.plugin_http_route_templates:
        patch(PathMatches, "match", make_match)
    patch(RequestHandler, "_execute", make_execute)
    patch(RequestHandler, "log_exception", make_log_exception)


def uninstall() -> None:
    from tornado.routing import PathMatches  # noqa: PLC0415
    from tornado.web import RequestHandler  # noqa: PLC0415

    restore(PathMatches, "match")
    restore(RequestHandler, "_execute")
    restore(RequestHandler, "log_exception")
