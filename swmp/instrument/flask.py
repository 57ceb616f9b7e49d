"""Flask: entry span per request, by wrapping ``Flask.wsgi_app`` (component Flask, 7001).

Once Flask has matched the URL (``RequestContext.match_request``, Flask's documented hook
for it), the span is renamed to the rule (``/items/<int:n>``). An exception Flask turns
into a 500 (``Flask.handle_exception``) is logged on the span with its stack before Flask's
own handling runs, unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument._patch import patch, restore
from swmp.instrument._route import name_request, record_exception
from swmp.instrument.wsgi import traced_wsgi_method
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "flask"
PEER_NAMES = ("sw_flask",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "flask"
SUPPORTED = ("2.0", "4")
# Patched once this module has executed: Flask is defined by then.
TRIGGER = "flask"


def _name_after_rule(orig: Any) -> Any:
    def match_request(self: Any) -> None:
        orig(self)
        try:
            rule = self.request.url_rule
            if rule is not None:
                name_request(rule.rule)
        except Exception:
            pass

    return match_request


def _record_unhandled(orig: Any) -> Any:
    def handle_exception(self: Any, e: BaseException, *args: Any, **kwargs: Any) -> Any:
        record_exception(e)
        return orig(self, e, *args, **kwargs)

    return handle_exception


def install(config: Config) -> None:
    import flask  # noqa: PLC0415 (only when the application has it)

    make = traced_wsgi_method(
        Component.FLASK,
        config.plugin_flask_collect_http_params,
        config.plugin_http_http_params_length_threshold,
    )
    patch(flask.Flask, "wsgi_app", make)
    patch(flask.Flask, "handle_exception", _record_unhandled)
    if config.plugin_http_route_templates:
        from flask.ctx import RequestContext  # noqa: PLC0415

        patch(RequestContext, "match_request", _name_after_rule)


def uninstall() -> None:
    import flask  # noqa: PLC0415
    from flask.ctx import RequestContext  # noqa: PLC0415

    restore(flask.Flask, "wsgi_app")
    restore(flask.Flask, "handle_exception")
    restore(RequestContext, "match_request")
