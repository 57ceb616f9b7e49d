"""Instrumentations: one small module per library, installed by :func:`install_all`.

Each module declares ``NAME`` (what ``SW_AGENT_DISABLE_PLUGINS`` matches, glob patterns
allowed), optionally ``PEER_NAMES`` (the Apache SkyWalking Python agent's plugin module names
for the same library, e.g. ``("sw_flask",)``, so its users' ``SW_AGENT_DISABLE_PLUGINS`` keeps
working, in its regular-expression form too), ``PACKAGE`` (the distribution whose version
is checked; None for the standard library), ``SUPPORTED = (min, max)`` (min inclusive, max
exclusive, "" for no bound) and ``install(config)`` / ``uninstall()``. A library that is
absent is skipped quietly; one of an unsupported version, or whose installation fails, is
logged once and skipped: the application always starts.

Installation is lazy: a module may also declare ``TRIGGER``, the module whose import makes
the library patchable. :func:`install_all` patches at once what is already imported and
defers the rest to a post-import hook (``_hook``), so an application never pays the
import of a library it does not use (measured: ~650 ms and +22 MiB per worker when every
library was imported at start). Version checks run when the library is actually installed.

The WSGI and ASGI middlewares (``swmp.instrument.wsgi.WSGIMiddleware``,
``swmp.instrument.asgi.ASGIMiddleware``) are not installed automatically: wrap an
application with them directly, or let the framework modules (Flask, Django, Starlette/
FastAPI, Falcon, Pyramid, Bottle) put the same tracing in place.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib
import importlib.util
import logging
import re
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

from swmp.instrument import _hook

if TYPE_CHECKING:
    from swmp.config import Config

log = logging.getLogger("swmp.instrument")


class Plugin(NamedTuple):
    """What :func:`install_all` needs to know of an instrumentation *without importing it*:
    its module, ``NAME``, ``PEER_NAMES`` and ``TRIGGER`` (a test checks they match the module).
    A worker then imports only the instrumentations of libraries it uses (~0.6 MiB less
    per process than importing all of them)."""

    module: str
    name: str
    peer_names: tuple[str, ...]
    trigger: str | None


# Order matters only for readability of the status report.
PLUGINS: tuple[Plugin, ...] = (
    Plugin("swmp.instrument.flask", "flask", ("sw_flask",), "flask"),
    Plugin("swmp.instrument.django", "django", ("sw_django",), "django"),
    Plugin("swmp.instrument.starlette", "starlette", ("sw_fastapi",), "starlette.applications"),
    Plugin("swmp.instrument.falcon", "falcon", ("sw_falcon", "sw_falcon_v3"), "falcon"),
    Plugin("swmp.instrument.pyramid", "pyramid", ("sw_pyramid",), "pyramid.router"),
    Plugin("swmp.instrument.bottle", "bottle", ("sw_bottle",), "bottle"),
    Plugin("swmp.instrument.http_server", "http_server", ("sw_http_server",), "http.server"),
    Plugin("swmp.instrument.requests", "requests", ("sw_requests",), "requests"),
    Plugin("swmp.instrument.urllib3", "urllib3", ("sw_urllib3", "sw_urllib3_v2"), "urllib3"),
    Plugin("swmp.instrument.http_client", "http.client", ("sw_urllib_request",), "http.client"),
    Plugin("swmp.instrument.httpx", "httpx", ("sw_httpx",), "httpx"),
    Plugin("swmp.instrument.celery", "celery", ("sw_celery",), "celery"),
    Plugin("swmp.instrument.grpcio", "grpc", ("sw_grpc",), "grpc"),
    Plugin("swmp.instrument.aiohttp", "aiohttp", ("sw_aiohttp",), "aiohttp"),
    Plugin("swmp.instrument.tornado", "tornado", ("sw_tornado",), "tornado.web"),
    Plugin("swmp.instrument.sanic", "sanic", ("sw_sanic", "sw_sanic_v2"), "sanic"),
    Plugin("swmp.instrument.websockets", "websockets", ("sw_websockets",), "websockets"),
    Plugin("swmp.instrument.log_reporter", "logging", (), None),
    Plugin("swmp.instrument.loguru", "loguru", ("sw_loguru",), "loguru"),
    Plugin("swmp.instrument.structlog", "structlog", (), "structlog"),
    Plugin("swmp.instrument.threads", "threading", (), None),
    Plugin("swmp.instrument.psycopg2", "psycopg2", ("sw_psycopg2",), "psycopg2"),
    Plugin("swmp.instrument.psycopg", "psycopg", ("sw_psycopg",), "psycopg"),
    Plugin("swmp.instrument.asyncpg", "asyncpg", ("sw_asyncpg",), "asyncpg"),
    Plugin("swmp.instrument.pymysql", "pymysql", ("sw_pymysql",), "pymysql"),
    Plugin("swmp.instrument.mysqlclient", "mysqlclient", ("sw_mysqlclient",), "MySQLdb"),
    Plugin("swmp.instrument.aiomysql", "aiomysql", (), "aiomysql"),
    Plugin("swmp.instrument.redis", "redis", ("sw_redis",), "redis"),
    Plugin("swmp.instrument.pymemcache", "pymemcache", (), "pymemcache"),
    Plugin("swmp.instrument.kafka", "kafka", ("sw_kafka",), "kafka"),
    Plugin("swmp.instrument.confluent_kafka", "confluent_kafka", ("sw_confluent_kafka",), "confluent_kafka"),
    Plugin("swmp.instrument.aiokafka", "aiokafka", (), "aiokafka"),
    Plugin("swmp.instrument.pika", "pika", ("sw_rabbitmq",), "pika"),
    Plugin("swmp.instrument.aiormq", "aiormq", ("sw_aiormq",), "aiormq"),
)
MODULES: tuple[str, ...] = tuple(p.module for p in PLUGINS)

INSTALLED = "installed"
DISABLED = "disabled"
ABSENT = "absent"
DEFERRED = "deferred"  # waiting for the library's import

_installed: dict[str, str] = {}  # NAME -> module path, for uninstall_all
_status: dict[str, str] = {}  # NAME -> latest status, deferred ones updated when they run


def version_tuple(v: str) -> tuple[int, ...]:
    """Leading numeric components of a version string: ``"2.31.0rc1"`` -> ``(2, 31, 0)``."""
    out = []
    for part in v.split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
        if m.end() != len(part):
            break
    return tuple(out)


def supported(version: str, bounds: tuple[str, str]) -> bool:
    lo, hi = bounds
    v = version_tuple(version)
    if lo and v < version_tuple(lo):
        return False
    return not (hi and v >= version_tuple(hi))


def _regex_match(pattern: str, name: str) -> bool:
    try:
        return re.match(pattern, name) is not None
    except re.error:
        return False  # a glob such as "*redis" is no regular expression: fnmatch covers it


def is_disabled(name: str, patterns: tuple[str, ...], peer_names: tuple[str, ...] = ()) -> bool:
    """Whether a ``SW_AGENT_DISABLE_PLUGINS`` pattern names this instrumentation.

    A pattern matches swmp's own ``name`` as a glob (``"flask"``, ``"redis*"``), or one of the
    peer agent's module names (``"sw_flask"``) as a glob or, as that agent reads them, as a
    regular expression matched at the start (``"sw_(flask|django)"``).
    """
    for raw in patterns:
        p = raw.strip()
        if not p:
            continue
        if fnmatch.fnmatchcase(name, p):
            return True
        for peer in peer_names:
            if fnmatch.fnmatchcase(peer, p) or _regex_match(p, peer):
                return True
    return False


def install_one(module_path: str, config: Config) -> tuple[str, str]:
    """Install one instrumentation; ``(name, status)``, never raises."""
    try:
        mod = importlib.import_module(module_path)
    except Exception as e:
        log.warning("swmp: instrumentation %s cannot be imported (%r); skipped", module_path, e)
        return module_path, f"failed: {e!r}"
    name: str = getattr(mod, "NAME", module_path)
    return name, _install(mod, name, config)


def _install(mod: Any, name: str, config: Config, *, imported: bool = False) -> str:
    if is_disabled(name, config.agent_disable_plugins, getattr(mod, "PEER_NAMES", ())):
        return DISABLED
    package = getattr(mod, "PACKAGE", None)
    if package is not None:
        # The import name may differ from the distribution's (PyMySQL: pymysql, mysqlclient:
        # MySQLdb): look for the trigger module when there is one.
        if not imported and not _present(getattr(mod, "TRIGGER", None) or package.replace("-", "_")):
            return ABSENT
        # Imported here, not at start: importlib.metadata costs ~10 ms (email, zipfile...).
        from importlib import metadata  # noqa: PLC0415

        try:
            version = metadata.version(package)
        except metadata.PackageNotFoundError:
            version = ""
        bounds = getattr(mod, "SUPPORTED", ("", ""))
        if version and not supported(version, bounds):
            log.warning(
                "swmp: %s %s is outside the supported range [%s, %s); not instrumented",
                package,
                version,
                bounds[0] or "any",
                bounds[1] or "any",
            )
            return f"unsupported version {version}"
    try:
        mod.install(config)
    except Exception as e:
        log.warning("swmp: installing the %s instrumentation failed (%r); skipped", name, e, exc_info=True)
        return f"failed: {e!r}"
    _installed[name] = mod.__name__
    return INSTALLED


def _present(module: str) -> bool:
    """Whether ``module``'s top-level package can be imported, without importing anything
    (``find_spec`` of a dotted name would import its parents)."""
    try:
        return importlib.util.find_spec(module.partition(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def _deferred(plugin: Plugin, config: Config) -> None:
    """Runs inside the import of the plugin's trigger, right after its body executed: the
    instrumentation module is imported only now."""
    name = plugin.name
    try:
        mod = importlib.import_module(plugin.module)
    except Exception as e:
        log.warning("swmp: instrumentation %s cannot be imported (%r); skipped", plugin.module, e)
        _status[name] = f"failed: {e!r}"
        return
    status = _install(mod, name, config, imported=True)
    _status[name] = status
    log.debug("swmp: %s imported; %s instrumentation %s", plugin.trigger, name, status)


def install_all(config: Config) -> dict[str, str]:
    """Install every known instrumentation that applies; ``{name: status}``.

    Libraries already imported are patched now; the others are ``"deferred"`` and patched
    when (if ever) the application imports them. Never raises.
    """
    out: dict[str, str] = {}
    for plugin in PLUGINS:
        name, trigger = plugin.name, plugin.trigger
        if is_disabled(name, config.agent_disable_plugins, plugin.peer_names):
            status = DISABLED
        elif trigger is None or trigger in sys.modules:
            try:
                mod = importlib.import_module(plugin.module)
            except Exception as e:
                log.warning("swmp: instrumentation %s cannot be imported (%r); skipped", plugin.module, e)
                status = f"failed: {e!r}"
            else:
                status = _install(mod, name, config)
        elif not _present(trigger):
            status = ABSENT
        else:
            try:
                _status.pop(name, None)
                _hook.defer(trigger, functools.partial(_deferred, plugin, config), key=name)
                status = _status.get(name, DEFERRED)  # the hook may have run at once (a race)
            except Exception as e:
                log.warning("swmp: cannot defer the %s instrumentation (%r); skipped", name, e)
                status = f"failed: {e!r}"
        out[name] = _status[name] = status
    now = [n for n, s in out.items() if s == INSTALLED]
    later = [n for n, s in out.items() if s == DEFERRED]
    log.debug("swmp: instrumentation installed now: %s; deferred until imported: %s", now, later)
    return out


def statuses() -> dict[str, str]:
    """``{name: status}`` as of now: deferred entries change once their library is imported."""
    return dict(_status)


def uninstall_all() -> None:
    """Put every patched method back and forget pending hooks (tests; agent stop)."""
    _hook.clear()
    _status.clear()
    for name, path in list(_installed.items()):
        try:
            importlib.import_module(path).uninstall()
        except Exception as e:
            log.warning("swmp: uninstalling the %s instrumentation failed: %r", name, e)
        _installed.pop(name, None)


def installed() -> tuple[str, ...]:
    return tuple(_installed)
