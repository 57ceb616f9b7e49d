"""Pyramid: entry span per request, by wrapping ``Router.__call__`` with the WSGI tracing
(component Pyramid, 7009).

* Once the routes mapper matched (``RoutesMapper.__call__``), the span is renamed to the
  route's pattern (``/users/{id}``). Traversal-only applications keep the path.
* An exception that an exception view turns into a 5xx response
  (``request.invoke_exception_view``, used by Pyramid's excview tween) is logged on the
  span with its stack; one that no exception view handles propagates out of the router
  and the WSGI tracing logs it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from swmp.instrument._patch import patch, restore
from swmp.instrument._route import name_request, record_exception
from swmp.instrument.wsgi import traced_wsgi_method
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "pyramid"
PEER_NAMES = ("sw_pyramid",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "pyramid"
SUPPORTED = ("1.10", "3")
# Router, and the modules it imports (view, urldispatch) are complete once it executed.
TRIGGER = "pyramid.router"


def _name_after_pattern(orig: Any) -> Any:
    def __call__(self: Any, request: Any) -> Any:
        info = orig(self, request)
        try:
            route = info["route"]
            if route is not None:
                name_request(route.pattern)
        except Exception:
            pass
        return info

    return __call__


def _record_5xx(orig: Any) -> Any:
    def invoke_exception_view(self: Any, exc_info: Any = None, *args: Any, **kwargs: Any) -> Any:
        response = orig(self, exc_info, *args, **kwargs)
        try:
            if response.status_int >= 500:
                record_exception((exc_info or sys.exc_info())[1])
        except Exception:
            pass
        return response

    return invoke_exception_view


def install(config: Config) -> None:
    from pyramid.router import Router  # noqa: PLC0415 (only when the application has it)
    from pyramid.urldispatch import RoutesMapper  # noqa: PLC0415
    from pyramid.view import ViewMethodsMixin  # noqa: PLC0415

    make = traced_wsgi_method(Component.PYRAMID, False, config.plugin_http_http_params_length_threshold)
    patch(Router, "__call__", make)
    patch(ViewMethodsMixin, "invoke_exception_view", _record_5xx)
    if config.plugin_http_route_templates:
        patch(RoutesMapper, "__call__", _name_after_pattern)


def uninstall() -> None:
    from pyramid.router import Router  # noqa: PLC0415
    from pyramid.urldispatch import RoutesMapper  # noqa: PLC0415
    from pyramid.view import ViewMethodsMixin  # noqa: PLC0415

    restore(Router, "__call__")
    restore(ViewMethodsMixin, "invoke_exception_view")
    restore(RoutesMapper, "__call__")
