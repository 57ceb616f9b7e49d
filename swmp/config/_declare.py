"""How a setting is declared: :func:`opt` and the value checks, shared by every section.

A setting is one field of a frozen dataclass whose metadata names its ``SW_*`` variable, a
one-line description and its section (the heading it gets in ``docs/configuration.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any

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

Check = Callable[[Any], "str | None"]


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


# The most any setting in seconds may be. Each one ends up as a wait, a sleep or a timer,
# and those fail far below float's range: threading's Event.wait and join raise
# OverflowError above threading.TIMEOUT_MAX (which killed the meter thread), and Kafka's
# millisecond timeouts are 32-bit (24.8 days). A day is longer than any useful period or
# timeout, so a larger value is a mistake and refused like any out-of-range one.
MAX_SECONDS = 24 * 3600


def seconds(lo: float) -> Check:
    """A duration in seconds: from ``lo`` to :data:`MAX_SECONDS`."""

    def check(v: Any) -> str | None:
        return None if lo <= v <= MAX_SECONDS else f"must be between {lo:g} and {MAX_SECONDS} seconds"

    return check


def at_least(n: float) -> Check:
    def check(v: Any) -> str | None:
        return None if v >= n else f"must be >= {n}"

    return check


def between(lo: int, hi: int, unit: str = "") -> Check:
    def check(v: Any) -> str | None:
        return None if lo <= v <= hi else f"must be between {lo} and {hi}{' ' + unit if unit else ''}"

    return check


def one_of(choices: tuple[str, ...]) -> Check:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}"

    return check


def power_of_two(lo: int, hi: int) -> Check:
    def check(v: Any) -> str | None:
        if lo <= v <= hi and v & (v - 1) == 0:
            return None
        return f"must be a power of two between {lo} and {hi}"

    return check


def log_level(v: Any) -> str | None:
    return None if str(v).upper() in LOG_LEVELS else f"must be one of {', '.join(LOG_LEVELS)}"
