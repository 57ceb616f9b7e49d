"""Instrumentations: one small module per library, installed by :func:`install_all`.

Each module declares ``NAME`` (what ``SW_AGENT_DISABLE_PLUGINS`` matches, glob patterns
allowed), ``PACKAGE`` (the distribution whose version is checked; None for the standard
library), ``SUPPORTED = (min, max)`` (min inclusive, max exclusive, "" for no bound) and
``install(config)`` / ``uninstall()``. A library that is absent is skipped quietly; one of
an unsupported version, or whose installation fails, is logged once and skipped: the
application always starts.

The WSGI and ASGI middlewares (``swmp.instrument.wsgi.WSGIMiddleware``,
``swmp.instrument.asgi.ASGIMiddleware``) are not installed automatically: wrap an
application with them directly, or let the Flask, Django and Starlette/FastAPI modules
put them in place.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.metadata
import importlib.util
import logging
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from swmp.config import Config

log = logging.getLogger("swmp.instrument")

# Order matters only for readability of the status report.
MODULES: tuple[str, ...] = (
    "swmp.instrument.flask",
    "swmp.instrument.django",
    "swmp.instrument.starlette",
    "swmp.instrument.requests",
    "swmp.instrument.urllib3",
    "swmp.instrument.http_client",
    "swmp.instrument.httpx",
    "swmp.instrument.log_reporter",
)

INSTALLED = "installed"
DISABLED = "disabled"
ABSENT = "absent"

_installed: dict[str, str] = {}  # NAME -> module path, for uninstall_all


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


def is_disabled(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p.strip()) for p in patterns if p.strip())


def install_one(module_path: str, config: Config) -> tuple[str, str]:
    """Install one instrumentation; ``(name, status)``, never raises."""
    try:
        mod = importlib.import_module(module_path)
    except Exception as e:
        log.warning("swmp: instrumentation %s cannot be imported (%r); skipped", module_path, e)
        return module_path, f"failed: {e!r}"
    name: str = getattr(mod, "NAME", module_path)
    return name, _install(mod, name, config)


def _install(mod: Any, name: str, config: Config) -> str:
    if is_disabled(name, config.agent_disable_plugins):
        return DISABLED
    package = getattr(mod, "PACKAGE", None)
    if package is not None:
        if importlib.util.find_spec(package.replace("-", "_")) is None:
            return ABSENT
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
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


def install_all(config: Config) -> dict[str, str]:
    """Install every known instrumentation that applies; ``{name: status}``."""
    out = {}
    for path in MODULES:
        name, status = install_one(path, config)
        out[name] = status
    return out


def uninstall_all() -> None:
    """Put every patched method back (tests; agent stop)."""
    for name, path in list(_installed.items()):
        try:
            importlib.import_module(path).uninstall()
        except Exception as e:
            log.warning("swmp: uninstalling the %s instrumentation failed: %r", name, e)
        _installed.pop(name, None)


def installed() -> tuple[str, ...]:
    return tuple(_installed)
