"""Flask: entry span per request, by wrapping ``Flask.wsgi_app`` (component Flask, 7001)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument._patch import patch, restore
from swmp.instrument.wsgi import trace_wsgi
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "flask"
PACKAGE = "flask"
SUPPORTED = ("2.0", "4")
# Patched once this module has executed: Flask is defined by then.
TRIGGER = "flask"


def install(config: Config) -> None:
    import flask  # noqa: PLC0415 (only when the application has it)

    collect = config.plugin_flask_collect_http_params
    limit = config.plugin_http_http_params_length_threshold

    def make(orig: Any) -> Any:
        def wsgi_app(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
            def call(e: dict[str, Any], s: Any) -> Any:
                return orig(self, e, s)

            return trace_wsgi(
                call,
                environ,
                start_response,
                component=Component.FLASK,
                collect_params=collect,
                params_limit=limit,
            )

        return wsgi_app

    patch(flask.Flask, "wsgi_app", make)


def uninstall() -> None:
    import flask  # noqa: PLC0415

    restore(flask.Flask, "wsgi_app")
