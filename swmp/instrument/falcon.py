"""Falcon 3/4, WSGI and ASGI apps: entry span per request (component Falcon, 7012).

* WSGI: ``falcon.App.__call__`` wrapped by the WSGI tracing; ASGI: ``falcon.asgi.App.__call__``
  by the ASGI tracing, patched when ``falcon.asgi`` is imported.
* Once Falcon found the responder (``App._get_responder``, shared by both apps), the span is
  renamed to the route's ``uri_template`` (``/users/{user_id}``).
* An exception Falcon turns into a 500 (its default ``Exception`` handler,
  ``_python_error_handler``) is logged on the span with its stack before that handler runs.
  Only apps created after the instrumentation is installed get this, as Falcon registers
  the handler when an app is created; an application's own handler for ``Exception``
  replaces Falcon's, and then the span only has the status code.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from swmp.instrument import _hook
from swmp.instrument._patch import patch, restore
from swmp.instrument._route import name_request, record_exception
from swmp.instrument.asgi import traced_asgi_method
from swmp.instrument.wsgi import traced_wsgi_method
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "falcon"
PEER_NAMES = ("sw_falcon", "sw_falcon_v3")  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "falcon"
SUPPORTED = ("3.0", "5")
# The package imports falcon.app (the WSGI App) in its body; falcon.asgi is imported on demand.
TRIGGER = "falcon"

_ASGI = "falcon.asgi.app"


def _name_after_template(orig: Any) -> Any:
    def _get_responder(self: Any, req: Any) -> Any:
        found = orig(self, req)
        try:
            template = found[3]
            if template:
                name_request(template)
        except Exception:
            pass
        return found

    return _get_responder


def _record_wsgi_error(orig: Any) -> Any:
    def _python_error_handler(self: Any, req: Any, resp: Any, error: BaseException, params: Any) -> Any:
        record_exception(error)
        return orig(self, req, resp, error, params)

    return _python_error_handler


def _record_asgi_error(orig: Any) -> Any:
    async def _python_error_handler(
        self: Any, req: Any, resp: Any, error: BaseException, params: Any, *args: Any, **kwargs: Any
    ) -> Any:
        if resp is not None:  # None: a WebSocket, not traced
            record_exception(error)
        return await orig(self, req, resp, error, params, *args, **kwargs)

    return _python_error_handler


def _patch_asgi(config: Config) -> None:
    from falcon.asgi.app import App  # noqa: PLC0415

    make = traced_asgi_method(Component.FALCON, False, config.plugin_http_http_params_length_threshold)
    patch(App, "__call__", make)
    patch(App, "_python_error_handler", _record_asgi_error)


def install(config: Config) -> None:
    from falcon.app import App  # noqa: PLC0415

    make = traced_wsgi_method(Component.FALCON, False, config.plugin_http_http_params_length_threshold)
    patch(App, "__call__", make)
    patch(App, "_python_error_handler", _record_wsgi_error)
    if config.plugin_http_route_templates:
        patch(App, "_get_responder", _name_after_template)
    _hook.defer(_ASGI, lambda: _patch_asgi(config), key="falcon-asgi")


def uninstall() -> None:
    from falcon.app import App  # noqa: PLC0415

    for name in ("__call__", "_python_error_handler", "_get_responder"):
        restore(App, name)
    asgi = sys.modules.get(_ASGI)
    if asgi is not None:
        restore(asgi.App, "__call__")
        restore(asgi.App, "_python_error_handler")
