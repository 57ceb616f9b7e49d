"""How a setting is declared: :func:`opt` and the value checks, shared by every section.

A setting is one field of a frozen dataclass whose metadata names its ``SW_*`` variable, a
one-line description and its section (the heading it gets in ``docs/configuration.md``).
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

# The value checks (seconds, at_least, one_of) live with the reporter's settings, and so does
# the range of every reporter setting (reporter_proc.settings.BOUNDS): a SW_* variable that
# feeds one takes that bound as its check, so the agent and ``python -m reporter_proc
# --settings-file`` refuse the same values. swmp may import reporter_proc, not the reverse.
from reporter_proc.settings import Check

KIB = 1024
MIB = 1024 * KIB

# Prefix families: every variable starting with the prefix lands in one dict setting.
KAFKA_CONFIG_PREFIX = "SW_KAFKA_REPORTER_CONFIG_"

PROTOCOLS = ("grpc", "http", "kafka")
LOG_LEVELS = ("CRITICAL", "FATAL", "ERROR", "WARN", "WARNING", "INFO", "DEBUG")

# Section headings, in the order docs/configuration.md shows them.
CORE = "Core"
KAFKA = "Kafka"
TRACE = "Tracing"
LOGS = "Log reporter"
METER = "Meter reporter"
PROFILE = "Profiling"
PLUGIN = "Plugins"
REPORTER = "Reporter process and shared memory (swmp)"

DEFAULT_IGNORE_SUFFIX = ".jpg,.jpeg,.js,.css,.png,.bmp,.gif,.ico,.mp3,.mp4,.html,.svg"


def opt(
    default: Any,
    env: str,
    doc: str,
    section: str,
    *,
    check: Check | None = None,
    aliases: tuple[str, ...] = (),
    prefix: str = "",
) -> Any:
    """Declare one setting. ``check`` returns an error message for a bad value, else None."""
    meta = {"env": env, "doc": doc, "section": section, "check": check, "aliases": aliases, "prefix": prefix}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


def between(lo: int, hi: int, unit: str = "") -> Check:
    def check(v: Any) -> str | None:
        return None if lo <= v <= hi else f"must be between {lo} and {hi}{' ' + unit if unit else ''}"

    return check


def power_of_two(lo: int, hi: int) -> Check:
    def check(v: Any) -> str | None:
        if lo <= v <= hi and v & (v - 1) == 0:
            return None
        return f"must be a power of two between {lo} and {hi}"

    return check


# gRPC target schemes (and URLs, "://"): their syntax is the library's to judge.
_TARGET_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:")


def _bad_address(entry: str) -> bool:
    """True for a ``host:port`` that no client can use: an empty host or port, or a port that
    is not 1..65535 (gRPC took 99999 modulo 65536, ``host:`` and ``:11800`` failed every
    send as if the backend were down). A bare host, a bracketed or bare IPv6 address, a URL
    and a gRPC target with a scheme are left to the client."""
    if "://" in entry or entry.startswith(_TARGET_SCHEMES):
        return False
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        if rest == "":
            return not host
        if not rest.startswith(":"):
            return True
        port = rest[1:]
    elif entry.count(":") == 1:
        host, _, port = entry.partition(":")
    else:
        return False  # a bare host, or a bare IPv6 address
    return not host or not (port.isdigit() and port.isascii() and 1 <= int(port) <= 65535)


ADDRESS_RULE = "not host:port with a port from 1 to 65535"


def addresses(v: Any) -> str | None:
    """A comma-separated list of backend addresses (empty entries are skipped, as loading does)."""
    bad = [e for e in (p.strip() for p in str(v).split(",")) if e and _bad_address(e)]
    return f"{bad[0]!r} is {ADDRESS_RULE}" if bad else None


def split_addresses(v: str) -> tuple[str, list[str]]:
    """``(the usable entries joined again, the unusable ones)`` of an :func:`addresses` list:
    loading keeps the good backends of a list with a bad one (refusing only that one)."""
    good: list[str] = []
    bad: list[str] = []
    for entry in filter(None, (p.strip() for p in v.split(","))):
        (bad if _bad_address(entry) else good).append(entry)
    return ",".join(good), bad


def log_level(v: Any) -> str | None:
    return None if str(v).upper() in LOG_LEVELS else f"must be one of {', '.join(LOG_LEVELS)}"
