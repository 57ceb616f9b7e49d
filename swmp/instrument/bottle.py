"""Bottle: entry span per request, by wrapping ``Bottle.__call__`` with the WSGI tracing
(component Bottle, 7015).

* Once the router matched (``Router.match``), the span is renamed to the route's rule
  (``/users/<id:int>``).
* An exception Bottle turns into its 500 page (``Bottle._handle`` catches it and keeps it
  in ``environ["bottle.exc_info"]``) is logged on the span with its stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument._patch import patch, restore
from swmp.instrument._route import name_request, record_exception
from swmp.instrument.wsgi import traced_wsgi_method
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "bottle"
PEER_NAMES = ("sw_bottle",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "bottle"
SUPPORTED = ("0.12", "0.14")
TRIGGER = "bottle"


def _name_after_rule(orig: Any) -> Any:
    def match(self: Any, environ: Any) -> Any:
        found = orig(self, environ)
        try:
            name_request(found[0].rule)
        except Exception:
            pass
        return found

    return match


def _record_caught(orig: Any) -> Any:
    def _handle(self: Any, environ: Any) -> Any:
        out = orig(self, environ)
        try:
            exc_info = environ.get("bottle.exc_info")
            if exc_info:
                record_exception(exc_info[1])
        except Exception:
            pass
        return out

    return _handle


def install(config: Config) -> None:
    import bottle  # noqa: PLC0415 (only when the application has it)

    make = traced_wsgi_method(
        Component.BOTTLE,
        config.plugin_bottle_collect_http_params,
        config.plugin_http_http_params_length_threshold,
    )
    patch(bottle.Bottle, "__call__", make)
    patch(bottle.Bottle, "_handle", _record_caught)
    if config.plugin_http_route_templates:
        patch(bottle.Router, "match", _name_after_rule)


def uninstall() -> None:
    import bottle  # noqa: PLC0415

    restore(bottle.Bottle, "__call__")
    restore(bottle.Bottle, "_handle")
    restore(bottle.Router, "match")
