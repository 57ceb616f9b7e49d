"""Starlette and FastAPI: the ASGI middleware wrapped around every application's middleware
stack, by patching ``Starlette.build_middleware_stack`` and the same method of every
subclass that overrides it (FastAPI does, without calling Starlette's): the
subclasses that exist when the agent installs, and those defined later (found through
``Starlette.__init_subclass__``, so a FastAPI imported after Starlette is covered at the
moment its class is created). Only the outermost patched build of an application wraps: an
override that calls ``super().build_middleware_stack()`` (and returns it, or wraps it in
middleware of its own) gets one layer, around everything it returns. Component FastAPI
(7014); SkyWalking has no separate id for Starlette.

The span is renamed to the matched route's path template when the route handles the
request (``Route.handle``, which FastAPI's ``APIRoute`` inherits or calls), prefixed by the
templates of the ``Mount``s it sits under (``/api/users/{id}``). A typed parameter keeps
its name only (``/users/{uid:int}`` -> ``/users/{uid}``, Starlette's ``path_format``).
FastAPI routes reached through ``include_router`` that FastAPI serves from its "effective
route context" (newer FastAPI: the router's routes are not copied with the prefix) are
named after that context's template, which carries the routers' prefixes.

An exception that reaches Starlette's ``ServerErrorMiddleware`` (the 500 answer) is
re-raised by it and logged on the span by the middleware, with its stack; an
``HTTPException`` or a FastAPI validation error is an answer (its status tagged, 4xx/5xx
mark the span an error), not an exception to log.

Applications whose middleware stack was already built (they served a request) before the
agent started keep running untraced; start the agent before serving.
"""

from __future__ import annotations

import sys
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from swmp.instrument._patch import is_patched, patch, restore
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

_FASTAPI_ROUTING = "fastapi.routing"
_BUILD = "build_middleware_stack"
_INIT_SUBCLASS = "__init_subclass__"

# The path templates of the Mounts the request went through, outermost first.
_mount_prefix: ContextVar[str] = ContextVar("swmp_starlette_mount", default="")

# The application whose middleware stack a patched build_middleware_stack is building now.
_building: ContextVar[Any] = ContextVar("swmp_starlette_building", default=None)

# Subclasses of Starlette whose own build_middleware_stack is patched (for uninstall).
_patched_classes: list[type] = []


class _Traced(ASGIMiddleware):
    """The middleware put around an application's stack by this instrumentation."""

    __slots__ = ()


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


def _name_after_api_route(orig: Any) -> Any:
    """FastAPI's own ``APIRoute.handle`` (newer FastAPI): a route reached through
    ``include_router`` is served from its effective route context (prefixes joined) without
    ``Route.handle``: name the span after that context's template. A route served by itself
    goes on to ``Route.handle``, which names it."""
    routing = sys.modules.get(_FASTAPI_ROUTING)
    context_of = getattr(routing, "_get_scope_effective_route_context", None)
    if context_of is None:
        return orig

    async def handle(self: Any, scope: Any, receive: Any, send: Any) -> None:
        try:
            if scope.get("type") == "http":
                ctx = context_of(scope)
                if ctx is not None and ctx.original_route is self:
                    template = ctx.path_format
                    if template.__class__ is str and template:
                        name_request(_mount_prefix.get() + template)
        except Exception:
            pass
        await orig(self, scope, receive, send)

    return handle


class _Installer:
    """What install() decided, used again for subclasses defined later."""

    def __init__(self, config: Config) -> None:
        self.collect = config.plugin_fastapi_collect_http_params
        self.limit = config.plugin_http_http_params_length_threshold
        self.routes = config.plugin_http_route_templates

    def make_build(self, orig: Any) -> Any:
        collect, limit = self.collect, self.limit

        def build_middleware_stack(self: Any) -> Any:
            if _building.get() is self:
                # super() called by a patched override of this application: the outermost
                # call wraps, around what the override adds too (one layer, not two).
                return orig(self)
            token = _building.set(self)
            try:
                stack = orig(self)
            finally:
                _building.reset(token)
            if stack.__class__ is _Traced:  # already wrapped (not by a build of this call)
                return stack
            return _Traced(stack, Component.FASTAPI, collect, limit)

        return build_middleware_stack

    def subclass(self, cls: type) -> None:
        """Patch a Starlette subclass (FastAPI, an application's own) that builds its own
        middleware stack; FastAPI's route class along with FastAPI. Never raises."""
        try:
            if _BUILD in cls.__dict__ and not is_patched(cls, _BUILD):
                patch(cls, _BUILD, self.make_build)
                _patched_classes.append(cls)
            if self.routes and cls.__module__ == "fastapi.applications":
                # fastapi.applications imports fastapi.routing (complete) before FastAPI.
                routing = sys.modules.get(_FASTAPI_ROUTING)
                api_route = getattr(routing, "APIRoute", None)
                if api_route is not None and "handle" in api_route.__dict__:
                    patch(api_route, "handle", _name_after_api_route)
        except Exception:
            pass


def _all_subclasses(cls: type) -> list[type]:
    out: list[type] = []
    todo: list[type] = list(cls.__subclasses__())
    while todo:
        c = todo.pop()
        if c not in out:
            out.append(c)
            todo.extend(c.__subclasses__())
    return out


def install(config: Config) -> None:
    from starlette.applications import Starlette  # noqa: PLC0415

    inst = _Installer(config)
    patch(Starlette, _BUILD, inst.make_build)
    if config.plugin_http_route_templates:
        from starlette.routing import Mount, Route  # noqa: PLC0415

        patch(Route, "handle", _name_after_route)
        patch(Mount, "handle", _remember_mount)
    for cls in _all_subclasses(Starlette):
        inst.subclass(cls)
    if _INIT_SUBCLASS not in Starlette.__dict__:  # Starlette defines none (0.20 - 1.x)

        def __init_subclass__(cls: Any, /, **kwargs: Any) -> None:
            # What Python calls when Starlette has none: the next class's in the MRO.
            super(Starlette, cls).__init_subclass__(**kwargs)
            inst.subclass(cls)

        __init_subclass__.__swmp_original__ = None  # type: ignore[attr-defined]
        hook: Any = classmethod(__init_subclass__)
        Starlette.__init_subclass__ = hook  # type: ignore[method-assign]


def uninstall() -> None:
    from starlette.applications import Starlette  # noqa: PLC0415
    from starlette.routing import Mount, Route  # noqa: PLC0415

    hook = Starlette.__dict__.get(_INIT_SUBCLASS)
    if hook is not None and hasattr(getattr(hook, "__func__", None), "__swmp_original__"):
        delattr(Starlette, _INIT_SUBCLASS)
    restore(Starlette, _BUILD)
    while _patched_classes:
        restore(_patched_classes.pop(), _BUILD)
    restore(Route, "handle")
    restore(Mount, "handle")
    routing = sys.modules.get(_FASTAPI_ROUTING)
    api_route = getattr(routing, "APIRoute", None)
    if api_route is not None:
        restore(api_route, "handle")
