"""Flask: entry span per request, by wrapping ``Flask.wsgi_app`` (component Flask, 7001)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from swmp.instrument._patch import patch, restore
from swmp.instrument.wsgi import traced_wsgi_method
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "flask"
PEER_NAMES = ("sw_flask",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "flask"
SUPPORTED = ("2.0", "4")
# Patched once this module has executed: Flask is defined by then.
TRIGGER = "flask"


def install(config: Config) -> None:
    import flask  # noqa: PLC0415 (only when the application has it)

    make = traced_wsgi_method(
        Component.FLASK,
        config.plugin_flask_collect_http_params,
        config.plugin_http_http_params_length_threshold,
    )
    patch(flask.Flask, "wsgi_app", make)


def uninstall() -> None:
    import flask  # noqa: PLC0415

    restore(flask.Flask, "wsgi_app")
