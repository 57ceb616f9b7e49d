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

from swmp.instrument._http import record_status
from swmp.instrument._incoming import http_entry_span
from swmp.instrument._patch import patch, restore
from swmp.instrument._route import record_exception
from swmp.tracing.constants import TAG_HTTP_URL, Component
from swmp.tracing.span import Span

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "tornado"
PEER_NAMES = ("sw_tornado",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "tornado"
SUPPORTED = ("6.0", "7")
TRIGGER = "tornado.web"  # defines RequestHandler and imports tornado.routing

_ROUTE = "_swmp_route"


def _route_of(request: Any) -> str:
    pattern = getattr(request, _ROUTE, None)
    if pattern is None:
        return request.path or "/"
    return pattern[:-1] if pattern.endswith("$") else pattern  # type: ignore[no-any-return]


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

    def make_execute(orig: Any) -> Any:
        async def _execute(self: Any, transforms: Any, *args: Any, **kwargs: Any) -> Any:
            request = self.request
            method = request.method or "GET"
            span = http_entry_span(_route_of(request), request.headers, method, Component.TORNADO)
            if span is None:
                return await orig(self, transforms, *args, **kwargs)
            with span:
                if span.__class__ is Span:
                    try:
                        span.tag(TAG_HTTP_URL, f"{request.protocol}://{request.host}{request.path}")
                        if request.remote_ip:
                            span.peer = request.remote_ip
                    except Exception:
                        pass
                result = await orig(self, transforms, *args, **kwargs)
                if span.__class__ is Span:
                    record_status(span, self.get_status())
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
