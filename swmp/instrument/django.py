"""Django, under WSGI and ASGI: entry span per request (component Django, 7004).

* WSGI: ``WSGIHandler.__call__`` is wrapped by the WSGI tracing; ASGI:
  ``ASGIHandler.__call__`` by the ASGI tracing. Each handler module is patched when the
  application imports it (a WSGI deployment never imports the ASGI handler, nor the
  reverse), so installing on ``import django`` costs nothing.
* Once the URL is resolved (``BaseHandler.resolve_request``, both paths), the span is
  renamed to the matched route (``/users/<int:pk>/``; for ``re_path`` the pattern).
* An exception Django turns into a 500 (``handle_uncaught_exception``) is logged on the
  span with its stack; Django's own handling then runs unchanged.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import TYPE_CHECKING, Any

from swmp.instrument import _hook
from swmp.instrument._patch import patch, restore
from swmp.instrument._route import name_request, record_exception
from swmp.instrument.asgi import can_trace_inner_method, traced_asgi_method, traced_inner_method
from swmp.instrument.wsgi import traced_wsgi_method
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "django"
PEER_NAMES = ("sw_django",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "django"
SUPPORTED = ("3.2", "7")  # 6.x: tested on Python 3.12+ (scripts/other_pythons.sh)
# The package alone (cheap: settings, version checks); the handler modules are hooked from
# install(), each when it is imported.
TRIGGER = "django"

_WSGI = "django.core.handlers.wsgi"
_ASGI = "django.core.handlers.asgi"


def _name_after_route(orig: Any) -> Any:
    def resolve_request(self: Any, request: Any) -> Any:
        match = orig(self, request)
        try:
            route = match.route
            if route is not None:
                name_request("/" + route.lstrip("^"))
        except Exception:
            pass
        return match

    return resolve_request


def _record_uncaught(orig: Any) -> Any:
    def handle_uncaught_exception(request: Any, resolver: Any, exc_info: Any) -> Any:
        try:
            record_exception(exc_info[1])
        except Exception:
            pass
        return orig(request, resolver, exc_info)

    return handle_uncaught_exception


def _patch_common(config: Config) -> None:
    """What both handlers share (their base class and the exception module)."""
    from django.core.handlers import base, exception  # noqa: PLC0415

    patch(exception, "handle_uncaught_exception", _record_uncaught)
    if config.plugin_http_route_templates:
        patch(base.BaseHandler, "resolve_request", _name_after_route)


def _patch_handler(config: Config, handler: type, name: str, tracing: Any) -> None:
    """Patch ``handler.name`` (the WSGI or ASGI handler's entry) and the shared parts."""
    _patch_common(config)
    make = tracing(
        Component.DJANGO,
        config.plugin_django_collect_http_params,
        config.plugin_http_http_params_length_threshold,
    )
    patch(handler, name, make)


def _patch_wsgi(config: Config) -> None:
    _patch_handler(config, sys.modules[_WSGI].WSGIHandler, "__call__", traced_wsgi_method)


def _patch_asgi(config: Config) -> None:
    """``ASGIHandler.handle`` (Django 3.2+: what ``__call__`` awaits once it checked the
    scope, with the same arguments) where it can be traced without a coroutine of ours;
    ``__call__`` otherwise."""
    handler = sys.modules[_ASGI].ASGIHandler
    handle = handler.__dict__.get("handle")
    if can_trace_inner_method() and handle is not None and inspect.iscoroutinefunction(handle):
        _patch_handler(config, handler, "handle", traced_inner_method)
    else:
        _patch_handler(config, handler, "__call__", traced_asgi_method)


def install(config: Config) -> None:
    # defer() runs the patch at once when the handler module is already imported.
    _hook.defer(_WSGI, functools.partial(_patch_wsgi, config), key="django-wsgi")
    _hook.defer(_ASGI, functools.partial(_patch_asgi, config), key="django-asgi")


def uninstall() -> None:
    if _WSGI in sys.modules:
        restore(sys.modules[_WSGI].WSGIHandler, "__call__")
    if _ASGI in sys.modules:
        restore(sys.modules[_ASGI].ASGIHandler, "__call__")
        restore(sys.modules[_ASGI].ASGIHandler, "handle")
    base = sys.modules.get("django.core.handlers.base")
    if base is not None:
        restore(base.BaseHandler, "resolve_request")
    exception = sys.modules.get("django.core.handlers.exception")
    if exception is not None:
        restore(exception, "handle_uncaught_exception")
