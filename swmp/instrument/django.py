"""Django: entry span per request, by wrapping ``WSGIHandler.__call__`` (component Django, 7004)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from swmp.instrument._patch import patch, restore
from swmp.instrument.wsgi import traced_wsgi_method
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "django"
PEER_NAMES = ("sw_django",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "django"
SUPPORTED = ("3.2", "6")
# Not "django": importing it alone (version checks, settings) must stay cheap.
TRIGGER = "django.core.handlers.wsgi"


def install(config: Config) -> None:
    from django.core.handlers.wsgi import WSGIHandler  # noqa: PLC0415

    make = traced_wsgi_method(
        Component.DJANGO,
        config.plugin_django_collect_http_params,
        config.plugin_http_http_params_length_threshold,
    )
    patch(WSGIHandler, "__call__", make)


def uninstall() -> None:
    from django.core.handlers.wsgi import WSGIHandler  # noqa: PLC0415

    restore(WSGIHandler, "__call__")
