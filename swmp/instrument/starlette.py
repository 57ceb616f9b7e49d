"""Starlette and FastAPI: the ASGI middleware wrapped around every application's middleware
stack, by patching ``Starlette.build_middleware_stack`` (FastAPI subclasses Starlette).
Component FastAPI (7014); SkyWalking has no separate id for Starlette.

Applications whose middleware stack was already built (they served a request) before the
agent started keep running untraced; start the agent before serving.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument._patch import patch, restore
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


def install(config: Config) -> None:
    from starlette.applications import Starlette  # noqa: PLC0415

    collect = config.plugin_fastapi_collect_http_params
    limit = config.plugin_http_http_params_length_threshold

    def make(orig: Any) -> Any:
        def build_middleware_stack(self: Any) -> Any:
            return ASGIMiddleware(orig(self), Component.FASTAPI, collect, limit)

        return build_middleware_stack

    patch(Starlette, "build_middleware_stack", make)


def uninstall() -> None:
    from starlette.applications import Starlette  # noqa: PLC0415

    restore(Starlette, "build_middleware_stack")
