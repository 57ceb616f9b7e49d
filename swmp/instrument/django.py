"""Django: entry span per request, by wrapping ``WSGIHandler.__call__`` (component Django, 7004)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument._patch import patch, restore
from swmp.instrument.wsgi import trace_wsgi
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "django"
PACKAGE = "django"
SUPPORTED = ("3.2", "6")
# Not "django": importing it alone (version checks, settings) must stay cheap.
TRIGGER = "django.core.handlers.wsgi"


def install(config: Config) -> None:
    from django.core.handlers.wsgi import WSGIHandler  # noqa: PLC0415

    collect = config.plugin_django_collect_http_params
    limit = config.plugin_http_http_params_length_threshold

    def make(orig: Any) -> Any:
        def __call__(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
            def call(e: dict[str, Any], s: Any) -> Any:
                return orig(self, e, s)

            return trace_wsgi(
                call,
                environ,
                start_response,
                component=Component.DJANGO,
                collect_params=collect,
                params_limit=limit,
            )

        return __call__

    patch(WSGIHandler, "__call__", make)


def uninstall() -> None:
    from django.core.handlers.wsgi import WSGIHandler  # noqa: PLC0415

    restore(WSGIHandler, "__call__")
