"""Instrumentation settings (``SW_PLUGIN_*`` and which instrumentations to install)."""

from __future__ import annotations

from dataclasses import dataclass

from reporter_proc.settings import at_least
from swmp.config._declare import (
    PLUGIN,
    opt,
)


@dataclass(frozen=True)
class PluginSettings:
    """Options of the instrumentations in ``swmp/instrument/``."""

    agent_disable_plugins: tuple[str, ...] = opt(
        (),
        "SW_AGENT_DISABLE_PLUGINS",
        "Comma-separated instrumentation names or glob patterns not to install (e.g. `httpx,django`); "
        "the SkyWalking Python agent's plugin names (`sw_flask`) and its regular expressions work too.",
        PLUGIN,
    )
    plugin_http_ignore_method: tuple[str, ...] = opt(
        (),
        "SW_PLUGIN_HTTP_IGNORE_METHOD",
        "Comma-separated HTTP methods whose requests are not traced (e.g. `OPTIONS,HEAD`).",
        PLUGIN,
    )
    plugin_http_http_params_length_threshold: int = opt(
        1024,
        "SW_PLUGIN_HTTP_HTTP_PARAMS_LENGTH_THRESHOLD",
        "When query parameters are collected, keep at most this many characters.",
        PLUGIN,
        check=at_least(0),
    )
    plugin_celery_parameters_length: int = opt(
        0,
        "SW_PLUGIN_CELERY_PARAMETERS_LENGTH",
        "Tag Celery publish and task-run spans with the task's arguments (`celery.parameters`), cut to "
        "this many characters; 0 (the default; the SkyWalking Python agent's is 512) leaves them out.",
        PLUGIN,
        check=at_least(0),
    )
    plugin_flask_collect_http_params: bool = opt(
        False, "SW_PLUGIN_FLASK_COLLECT_HTTP_PARAMS", "Tag Flask entry spans with the query string.", PLUGIN
    )
    plugin_django_collect_http_params: bool = opt(
        False, "SW_PLUGIN_DJANGO_COLLECT_HTTP_PARAMS", "Tag Django entry spans with the query string.", PLUGIN
    )
    plugin_fastapi_collect_http_params: bool = opt(
        False,
        "SW_PLUGIN_FASTAPI_COLLECT_HTTP_PARAMS",
        "Tag FastAPI/Starlette entry spans with the query string.",
        PLUGIN,
    )
    # databases and caches (swmp/instrument/_datastore.py)
    plugin_sql_parameters_max_length: int = opt(
        0,
        "SW_PLUGIN_SQL_PARAMETERS_MAX_LENGTH",
        "Tag SQL spans with their parameters (`db.sql.parameters`), cut to this many characters; "
        "0 leaves parameters out.",
        PLUGIN,
        check=at_least(0),
    )
    plugin_cache_collect_keys: bool = opt(
        True,
        "SW_PLUGIN_CACHE_COLLECT_KEYS",
        "Tag Redis and memcached spans with the key (`cache.key`, cut to SW_AGENT_TAG_VALUE_MAX_LENGTH); "
        "false leaves keys out.",
        PLUGIN,
    )
    # web frameworks and RPC
    plugin_bottle_collect_http_params: bool = opt(
        False, "SW_PLUGIN_BOTTLE_COLLECT_HTTP_PARAMS", "Tag Bottle entry spans with the query string.", PLUGIN
    )
    plugin_http_route_templates: bool = opt(
        True,
        "SW_PLUGIN_HTTP_ROUTE_TEMPLATES",
        "Name web-framework entry spans after the route that matched (`/users/{id}`) rather than "
        "the request path, so each route is one endpoint; `false` keeps the path.",
        PLUGIN,
    )
    plugin_sanic_collect_http_params: bool = opt(
        False, "SW_PLUGIN_SANIC_COLLECT_HTTP_PARAMS", "Tag Sanic entry spans with the query string.", PLUGIN
    )
    plugin_grpc_ignored_methods: tuple[str, ...] = opt(
        (),
        "SW_PLUGIN_GRPC_IGNORED_METHODS",
        "Comma-separated gRPC methods not traced, server or client side "
        "(e.g. `/package.Service/Check`); matched case-insensitively, regular expressions allowed.",
        PLUGIN,
    )
