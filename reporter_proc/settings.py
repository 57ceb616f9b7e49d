"""What the reporter needs to know, as one plain value.

The in-application agent owns configuration (every ``SW_*`` variable is declared in
``swmp.config``) and hands the reporter this dataclass. Keeping it free of the agent's
config machinery means the reporter never imports the instrumentation side and tests can
build one in a line.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("swmp.reporter")

KIB = 1024

# A check returns why a value is refused, or None when it is acceptable.
Check = Callable[[Any], "str | None"]

# The most any setting in seconds may be. Each one ends up as a wait, a sleep or a timer,
# and those fail far below float's range: threading's Event.wait and join raise
# OverflowError above threading.TIMEOUT_MAX (which killed the meter thread), and Kafka's
# millisecond timeouts are 32-bit (24.8 days). A day is longer than any useful period or
# timeout, so a larger value is a mistake and refused like any out-of-range one.
MAX_SECONDS = 24 * 3600

# The reporter's own protocols: the agent's three, and "memory" (tests, benchmarks).
REPORTER_PROTOCOLS = ("grpc", "http", "kafka", "memory")


def seconds(lo: float, hi: float = MAX_SECONDS) -> Check:
    """A duration in seconds: from ``lo`` to ``hi`` (:data:`MAX_SECONDS` unless given).
    NaN and infinities fail the comparison and are refused too."""

    def check(v: Any) -> str | None:
        return None if lo <= v <= hi else f"must be between {lo:g} and {hi:g} seconds"

    return check


def at_least(n: float) -> Check:
    def check(v: Any) -> str | None:
        return None if v >= n else f"must be >= {n}"

    return check


def one_of(choices: tuple[str, ...]) -> Check:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}"

    return check


def header_text(v: Any) -> str | None:
    """Text a gRPC metadata value or an HTTP header can carry: printable ASCII. gRPC refuses
    anything else on every call (a tab, a newline, a non-ASCII letter), and the reporter then
    failed each send and keep-alive, dropped the records as invalid and stopped."""
    ok = all(" " <= c <= "~" for c in v)
    return None if ok else "must be printable ASCII (a header value: no tabs, newlines or non-ASCII letters)"


def kafka_key(raw: str) -> str:
    """A SW_KAFKA_REPORTER_CONFIG_* key as a producer argument name ("Linger.MS" -> "linger_ms").

    The one normalisation of those keys: the agent's config splits ``compression_type`` out
    with it and the Kafka sender reads the rest with it, so both see the same names.
    """
    return raw.strip().lower().replace(".", "_").replace("-", "_")


@dataclass(frozen=True)
class ReporterSettings:
    service: str = "python-service"
    namespace: str = ""
    protocol: str = "grpc"  # grpc | http | kafka
    # host:port entries; several mean fail-over, tried in order.
    backends: tuple[str, ...] = ("127.0.0.1:11800",)
    authentication: str = ""
    force_tls: bool = False
    # TLS to gRPC/HTTP backends (any of these set also means TLS; see senders/tls.py)
    tls_ca_file: str = ""  # PEM CA bundle to trust instead of the system's
    tls_cert_file: str = ""  # PEM client certificate (mTLS), with tls_key_file
    tls_key_file: str = ""
    tls_server_name: str = ""  # name the server certificate must carry (override of the host)
    # gRPC segments: False = batched collectInSync (measured cheaper on both ends, see
    # docs/performance.md); True = one long-lived client stream of `collect`.
    grpc_segment_stream: bool = False
    # Kafka (kafka_namespace overrides namespace for topic prefixes when set)
    kafka_namespace: str = ""
    kafka_bootstrap_servers: tuple[str, ...] = ("127.0.0.1:9092",)
    kafka_topic_segment: str = "skywalking-segments"
    kafka_topic_log: str = "skywalking-logs"
    kafka_topic_meter: str = "skywalking-meters"
    kafka_topic_management: str = "skywalking-managements"
    kafka_compression: str = ""  # "", gzip, snappy, lz4, zstd
    kafka_extra: dict[str, str] = field(default_factory=dict)  # SW_KAFKA_REPORTER_CONFIG_*
    # Batching and timing
    batch_max_records: int = 1000
    # A batch is sealed at this many payload bytes too: far below the OAP's 50 MiB gRPC limit.
    batch_max_bytes: int = 4 * 1024 * 1024
    # The longest a record read below saturation waits before it is sent: every open batch
    # is sent on this tick. A send costs ~1.5 ms of CPU whatever it carries (a gRPC call wakes
    # gRPC's threads), which at ordinary rates is most of the reporter's cost per request
    # (docs/performance.md), so a quiet application sends seldom...
    flush_interval_s: float = 5.0
    # ...and a busier one sooner: a batch holding this many records is sent on the next read
    # tick, where one call's cost spread over its records is small.
    send_early_records: int = 500
    # The intake's read tick below saturation (a ring a quarter full rings the doorbell and
    # is read at once): reading keeps the rings nearly empty whatever the flush interval.
    poll_interval_s: float = 1.0
    keepalive_interval_s: float = 30.0
    properties_every_n_keepalives: int = 10
    send_timeout_s: float = 10.0
    retry_max_attempts: int = 5
    retry_backoff_base_s: float = 0.5
    # Capped at 1 s: while the backend is down, the oldest batch is retried about once a
    # second, so delivery resumes within ~1 s of its return (issue 16).
    retry_backoff_max_s: float = 1.0
    max_pending_bytes: int = 64 * 1024 * 1024
    shutdown_deadline_s: float = 5.0
    # Features
    profile_enabled: bool = True
    profile_task_interval_s: float = 20.0  # SW_AGENT_COLLECTOR_GET_PROFILE_TASK_INTERVAL
    meter_enabled: bool = True
    log_enabled: bool = True
    # Spool (disk buffer during long outages); "" or "off" = off, "auto" = a private per-user
    # directory (reporter_proc.spooldir). The agent's config defaults to "auto"; this value
    # stays off so code that builds settings by hand (tests, benchmarks) opts in.
    spool_dir: str = ""
    spool_max_bytes: int = 1024 * 1024 * 1024
    spool_segment_bytes: int = 4 * 1024 * 1024  # one spool file is sealed at this size
    # Reporter process lifecycle
    supervise: bool = True  # a tiny supervisor restarts a reporter that died abnormally
    restart_backoff_base_s: float = 0.5
    restart_backoff_max_s: float = 30.0
    restart_stable_s: float = 60.0  # a reporter that ran this long resets the backoff
    status_interval_s: float = 1.0  # heartbeat + status document period (must stay <= 1 s)
    status_max_instances: int = 16  # instances listed in the status document (8 KiB cap)
    # protocol="memory" (tests, benchmarks): JSON lines of every accepted call go here
    memory_path: str = ""
    memory_fail_first: int = 0  # the memory sender fails its first N calls (retry tests)


# The range of every numeric reporter setting, declared once: the reporter checks the
# settings it reads from JSON (``python -m reporter_proc --settings/--settings-file``) with
# them, and the agent's configuration (swmp.config) declares the SW_* variables that feed
# these fields with the same checks. What a value outside them did in the reporter:
# a zero flush or poll interval divided by zero on the first tick (the reporter died, and
# its supervisor restarted it into the same death); a negative one made the intake spin a
# whole core; a batch size of 0 or less sent every record alone; a negative send timeout
# failed every send; more than a day overflowed the thread and Kafka timers.
BOUNDS: dict[str, Check] = {
    "batch_max_records": at_least(1),
    "batch_max_bytes": at_least(KIB),
    "flush_interval_s": seconds(0.001),
    "send_early_records": at_least(1),
    "poll_interval_s": seconds(0.001),
    # The reporter's keep-alive tick is at least 50 ms; the agent asks its users for 1 s.
    "keepalive_interval_s": seconds(0.05),
    "properties_every_n_keepalives": at_least(1),
    "send_timeout_s": seconds(0.1),
    "retry_max_attempts": at_least(1),
    "retry_backoff_base_s": seconds(0),
    "retry_backoff_max_s": seconds(0),
    "max_pending_bytes": at_least(KIB),
    "shutdown_deadline_s": seconds(0),
    "profile_task_interval_s": seconds(1),
    "spool_max_bytes": at_least(0),
    "spool_segment_bytes": at_least(4 * KIB),  # the spool never seals a file smaller
    "restart_backoff_base_s": seconds(0),
    "restart_backoff_max_s": seconds(0),
    "restart_stable_s": seconds(0),
    "status_interval_s": seconds(0.05, 1.0),  # the heartbeat others judge liveness by
    "status_max_instances": at_least(0),
    "memory_fail_first": at_least(0),
}

# The text settings with a form, checked the same way (the agent's SW_* variable too).
TEXT: dict[str, Check] = {"authentication": header_text}

# Settings whose value a log line must not show.
SECRETS = frozenset({"authentication"})

# Settings with no default worth falling back to: a mistyped protocol must not quietly
# become gRPC to 127.0.0.1:11800. A bad value here refuses the start (ValueError).
FATAL: dict[str, Check] = {"protocol": one_of(REPORTER_PROTOCOLS)}


def _typed(default: Any, value: Any) -> tuple[Any, str | None]:
    """``value`` as the type of ``default``, or the reason it is not one."""
    if isinstance(default, bool):
        return (value, None) if isinstance(value, bool) else (None, "not true or false")
    if isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return (value, None) if ok else (None, "not an integer")
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None, "not a number"
        return (float(value), None) if math.isfinite(value) else (None, "not a finite number")
    if isinstance(default, str):
        return (value, None) if isinstance(value, str) else (None, "not a string")
    if isinstance(default, tuple):
        ok = isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value)
        return (tuple(value), None) if ok else (None, "not a list of strings")
    if isinstance(default, dict):
        ok = isinstance(value, dict) and all(isinstance(x, str) for x in value.values())
        return (dict(value), None) if ok else (None, "not an object of strings")
    return value, None


def settings_from_mapping(data: Mapping[str, Any]) -> ReporterSettings:
    """Reporter settings from a decoded JSON object, checked as the agent checks its own.

    An unknown key is logged and ignored; a value of the wrong type or out of its range
    (:data:`BOUNDS`) is logged once, with the default used instead; a bad :data:`FATAL`
    value raises ValueError (the reporter refuses to start, exit status 78).
    """
    fields = {f.name: f for f in dataclasses.fields(ReporterSettings)}
    kwargs: dict[str, Any] = {}
    for key, raw in data.items():
        f = fields.get(key)
        if f is None:
            log.warning("ignoring unknown reporter setting %r", key)
            continue
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        value, why = _typed(default, raw)
        if why is None:
            check = BOUNDS.get(key) or TEXT.get(key) or FATAL.get(key)
            why = check(value) if check is not None else None
        if why is None:
            kwargs[key] = value
        elif key in FATAL:
            raise ValueError(f"reporter setting {key}={raw!r} is invalid ({why})")
        else:
            shown = "****" if key in SECRETS else raw
            log.warning("reporter setting %s=%r is invalid (%s); using %r instead", key, shown, why, default)
    return ReporterSettings(**kwargs)
