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
from typing import TYPE_CHECKING, Any

from swmp.instrument import _hook

if TYPE_CHECKING:
    from swmp.config import Config

log = logging.getLogger("swmp.instrument")

# Order matters only for readability of the status report.
MODULES: tuple[str, ...] = (
    "swmp.instrument.flask",
    "swmp.instrument.django",
    "swmp.instrument.starlette",
    "swmp.instrument.falcon",
    "swmp.instrument.pyramid",
    "swmp.instrument.bottle",
    "swmp.instrument.http_server",
    "swmp.instrument.requests",
    "swmp.instrument.urllib3",
    "swmp.instrument.http_client",
    "swmp.instrument.httpx",
    "swmp.instrument.celery",
    "swmp.instrument.grpcio",
    "swmp.instrument.aiohttp",
    "swmp.instrument.tornado",
    "swmp.instrument.sanic",
    "swmp.instrument.websockets",
    "swmp.instrument.log_reporter",
    "swmp.instrument.loguru",
    "swmp.instrument.structlog",
    "swmp.instrument.threads",
    "swmp.instrument.psycopg2",
    "swmp.instrument.psycopg",
    "swmp.instrument.asyncpg",
    "swmp.instrument.pymysql",
    "swmp.instrument.mysqlclient",
    "swmp.instrument.aiomysql",
    "swmp.instrument.redis",
    "swmp.instrument.pymemcache",
    "swmp.instrument.kafka",
    "swmp.instrument.confluent_kafka",
    "swmp.instrument.aiokafka",
    "swmp.instrument.pika",
    "swmp.instrument.aiormq",
)

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


def _deferred(mod: Any, name: str, config: Config, trigger: str) -> None:
    """Runs inside the import of ``trigger``, right after its body executed."""
    status = _install(mod, name, config, imported=True)
    _status[name] = status
    log.debug("swmp: %s imported; %s instrumentation %s", trigger, name, status)


def install_all(config: Config) -> dict[str, str]:
    """Install every known instrumentation that applies; ``{name: status}``.

    Libraries already imported are patched now; the others are ``"deferred"`` and patched
    when (if ever) the application imports them. Never raises.
    """
    out: dict[str, str] = {}
    for path in MODULES:
        try:
            mod = importlib.import_module(path)
        except Exception as e:
            log.warning("swmp: instrumentation %s cannot be imported (%r); skipped", path, e)
            out[path] = f"failed: {e!r}"
            continue
        name: str = getattr(mod, "NAME", path)
        trigger: str | None = getattr(mod, "TRIGGER", None)
        disabled = is_disabled(name, config.agent_disable_plugins, getattr(mod, "PEER_NAMES", ()))
        if trigger is None or trigger in sys.modules or disabled:
            status = _install(mod, name, config)
        elif not _present(trigger):
            status = ABSENT
        else:
            try:
                _status.pop(name, None)
                _hook.defer(trigger, functools.partial(_deferred, mod, name, config, trigger), key=name)
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
