"""Starlette and FastAPI: the ASGI middleware wrapped around every application's middleware
stack, by patching ``Starlette.build_middleware_stack`` (FastAPI subclasses Starlette).
Component FastAPI (7014); SkyWalking has no separate id for Starlette.

The span is renamed to the matched route's path template when the route handles the
request (``Route.handle``, which FastAPI's ``APIRoute`` inherits), prefixed by the
templates of the ``Mount``s it sits under (``/api/users/{id}``). An exception that
reaches Starlette's ``ServerErrorMiddleware`` (the 500 answer) is re-raised by it and
logged on the span by the middleware, with its stack.

Applications whose middleware stack was already built (they served a request) before the
agent started keep running untraced; start the agent before serving.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from swmp.instrument._patch import patch, restore
from swmp.instrument._route import name_request
from swmp.instrument.asgi import ASGIMiddleware
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "starlette"
PEER_NAMES = ("sw_fastapi",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "starlette"
SUPPORTED = ("0.20", "2")
# starlette/__init__ imports nothing; the patched class lives here.
TRIGGER = "starlette.applications"

# The path templates of the Mounts the request went through, outermost first.
_mount_prefix: ContextVar[str] = ContextVar("swmp_starlette_mount", default="")


def _name_after_route(orig: Any) -> Any:
    async def handle(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            try:
                name_request(_mount_prefix.get() + self.path_format)
            except Exception:
                pass
        await orig(self, scope, receive, send)

    return handle


def _remember_mount(orig: Any) -> Any:
    async def handle(self: Any, scope: Any, receive: Any, send: Any) -> None:
        token = None
        if scope.get("type") == "http":
            try:
                token = _mount_prefix.set(_mount_prefix.get() + self.path)
            except Exception:
                pass
        try:
            await orig(self, scope, receive, send)
        finally:
            if token is not None:
                _mount_prefix.reset(token)

    return handle


def install(config: Config) -> None:
    from starlette.applications import Starlette  # noqa: PLC0415

    collect = config.plugin_fastapi_collect_http_params
    limit = config.plugin_http_http_params_length_threshold

    def make(orig: Any) -> Any:
        def build_middleware_stack(self: Any) -> Any:
            return ASGIMiddleware(orig(self), Component.FASTAPI, collect, limit)

        return build_middleware_stack

    patch(Starlette, "build_middleware_stack", make)
    if config.plugin_http_route_templates:
        from starlette.routing import Mount, Route  # noqa: PLC0415

        patch(Route, "handle", _name_after_route)
        patch(Mount, "handle", _remember_mount)


def uninstall() -> None:
    from starlette.applications import Starlette  # noqa: PLC0415
    from starlette.routing import Mount, Route  # noqa: PLC0415

    restore(Starlette, "build_middleware_stack")
    restore(Route, "handle")
    restore(Mount, "handle")
