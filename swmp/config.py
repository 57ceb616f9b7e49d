"""Every setting of the agent, declared once.

Each field of :class:`Config` is one setting. Its metadata names the ``SW_*`` environment
variable, a one-line description and the section it belongs to; ``docs/configuration.md``
is generated from these declarations (``python scripts/gen_config_doc.py``).

Names follow the Apache SkyWalking Python agent wherever it has the setting, so a
deployment switches agents without rewriting its environment. The keyword-argument name of
a setting (``swmp.start(agent_name="svc")``) is its variable name without the ``SW_``
prefix, lower-cased: ``SW_AGENT_NAME`` -> ``agent_name``.

Loading never fails: a value that cannot be parsed or is out of range is reported once on
the ``swmp.config`` logger (which variable, what was wrong, what is used instead) and the
default is used.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reporter_proc.settings import ReporterSettings

log = logging.getLogger("swmp.config")

KIB = 1024
MIB = 1024 * KIB

# Prefix families: every variable starting with the prefix lands in one dict setting.
KAFKA_CONFIG_PREFIX = "SW_KAFKA_REPORTER_CONFIG_"

_TRUE = frozenset({"true", "1", "yes", "on", "y", "t"})
_FALSE = frozenset({"false", "0", "no", "off", "n", "f", ""})

PROTOCOLS = ("grpc", "http", "kafka")
LOG_LEVELS = ("CRITICAL", "FATAL", "ERROR", "WARN", "WARNING", "INFO", "DEBUG")


def _opt(
    default: Any,
    env: str,
    doc: str,
    section: str,
    *,
    check: Callable[[Any], str | None] | None = None,
    aliases: tuple[str, ...] = (),
    prefix: str = "",
) -> Any:
    """Declare one setting. ``check`` returns an error message for a bad value, else None."""
    meta = {"env": env, "doc": doc, "section": section, "check": check, "aliases": aliases, "prefix": prefix}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


def _at_least(n: float) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v >= n else f"must be >= {n}"

    return check


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}"

    return check


def _power_of_two(lo: int, hi: int) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if lo <= v <= hi and v & (v - 1) == 0:
            return None
        return f"must be a power of two between {lo} and {hi}"

    return check


def _log_level(v: Any) -> str | None:
    return None if str(v).upper() in LOG_LEVELS else f"must be one of {', '.join(LOG_LEVELS)}"


CORE = "Core"
KAFKA = "Kafka"
TRACE = "Tracing"
LOGS = "Log reporter"
METER = "Meter reporter"
PROFILE = "Profiling"
PLUGIN = "Plugins"
REPORTER = "Reporter process and shared memory (swmp)"

DEFAULT_IGNORE_SUFFIX = ".jpg,.jpeg,.js,.css,.png,.bmp,.gif,.ico,.mp3,.mp4,.html,.svg"


@dataclass(frozen=True)
class Config:
    """The agent's configuration. Build it with :func:`load` (environment + keywords)."""

    # -- core ------------------------------------------------------------------------------
    agent_name: str = _opt("Python Service Name", "SW_AGENT_NAME", "Service name shown in SkyWalking.", CORE)
    agent_instance_name: str = _opt(
        "",
        "SW_AGENT_INSTANCE_NAME",
        "Instance name prefix; each worker reports `<name>-w<slot>`. Empty: `<hostname>-<master pid>`.",
        CORE,
    )
    agent_namespace: str = _opt(
        "", "SW_AGENT_NAMESPACE", "Namespace; the reported service name becomes `name|namespace`.", CORE
    )
    agent_collector_backend_services: str = _opt(
        "127.0.0.1:11800",
        "SW_AGENT_COLLECTOR_BACKEND_SERVICES",
        "OAP address(es), `host:port[,host:port]` (11800 gRPC, 12800 HTTP); Kafka ignores it.",
        CORE,
    )
    agent_protocol: str = _opt(
        "grpc",
        "SW_AGENT_PROTOCOL",
        "Transport to the backend: `grpc`, `http` or `kafka`.",
        CORE,
        check=_one_of(PROTOCOLS),
    )
    agent_authentication: str = _opt(
        "", "SW_AGENT_AUTHENTICATION", "Authentication token sent to the OAP (gRPC metadata).", CORE
    )
    agent_force_tls: bool = _opt(
        False, "SW_AGENT_FORCE_TLS", "Use TLS to the backend (no client cert).", CORE
    )
    agent_logging_level: str = _opt(
        "INFO",
        "SW_AGENT_LOGGING_LEVEL",
        "Level of the agent's own loggers (`swmp`, `ipc`).",
        CORE,
        check=_log_level,
    )
    agent_collector_heartbeat_period: float = _opt(
        30.0,
        "SW_AGENT_COLLECTOR_HEARTBEAT_PERIOD",
        "Seconds between instance keep-alives.",
        CORE,
        check=_at_least(1),
    )
    agent_collector_properties_report_period_factor: int = _opt(
        10,
        "SW_AGENT_COLLECTOR_PROPERTIES_REPORT_PERIOD_FACTOR",
        "Instance properties are re-sent every `factor` keep-alives.",
        CORE,
        check=_at_least(1),
    )
    agent_instance_properties_json: str = _opt(
        "",
        "SW_AGENT_INSTANCE_PROPERTIES_JSON",
        'Extra instance properties as a JSON object, e.g. `{"k": "v"}`.',
        CORE,
    )

    # -- kafka -----------------------------------------------------------------------------
    kafka_bootstrap_servers: str = _opt(
        "localhost:9092", "SW_KAFKA_BOOTSTRAP_SERVERS", "Kafka brokers, `host:port[,host:port]`.", KAFKA
    )
    kafka_namespace: str = _opt(
        "",
        "SW_KAFKA_NAMESPACE",
        "Prefix (`<namespace>-`) for the topic names, as the OAP's SW_NAMESPACE.",
        KAFKA,
    )
    kafka_topic_management: str = _opt(
        "skywalking-managements",
        "SW_KAFKA_TOPIC_MANAGEMENT",
        "Topic for instance properties and pings.",
        KAFKA,
        aliases=("SW_KAFKA_REPORTER_TOPIC_MANAGEMENT",),
    )
    kafka_topic_segment: str = _opt(
        "skywalking-segments",
        "SW_KAFKA_TOPIC_SEGMENT",
        "Topic for trace segments.",
        KAFKA,
        aliases=("SW_KAFKA_REPORTER_TOPIC_SEGMENT",),
    )
    kafka_topic_log: str = _opt(
        "skywalking-logs",
        "SW_KAFKA_TOPIC_LOG",
        "Topic for logs.",
        KAFKA,
        aliases=("SW_KAFKA_REPORTER_TOPIC_LOG",),
    )
    kafka_topic_meter: str = _opt(
        "skywalking-meters",
        "SW_KAFKA_TOPIC_METER",
        "Topic for meters.",
        KAFKA,
        aliases=("SW_KAFKA_REPORTER_TOPIC_METER",),
    )
    kafka_reporter_config: dict[str, str] = _opt(  # noqa: RUF009 (a default_factory field)
        {},
        "SW_KAFKA_REPORTER_CONFIG_*",
        "Producer options: `SW_KAFKA_REPORTER_CONFIG_<KEY>=value` sets `<key>` (e.g. `..._ACKS=all`, "
        "`..._COMPRESSION_TYPE=gzip`); keyword: a dict.",
        KAFKA,
        prefix=KAFKA_CONFIG_PREFIX,
    )

    # -- tracing ---------------------------------------------------------------------------
    sample_n_per_3_secs: int = _opt(
        0,
        "SW_SAMPLE_N_PER_3_SECS",
        "Trace at most N new traces per 3 seconds per worker; 0 = all.",
        TRACE,
        check=_at_least(0),
    )
    agent_trace_ignore_path: tuple[str, ...] = _opt(
        (),
        "SW_AGENT_TRACE_IGNORE_PATH",
        "Comma-separated Ant-style path patterns (`/health`, `/static/**`, `/v?/ping`) whose requests "
        "are not traced.",
        TRACE,
    )
    agent_ignore_suffix: tuple[str, ...] = _opt(
        tuple(DEFAULT_IGNORE_SUFFIX.split(",")),
        "SW_AGENT_IGNORE_SUFFIX",
        "Comma-separated suffixes; a trace whose first operation name ends with one is not traced.",
        TRACE,
    )
    agent_span_limit: int = _opt(
        300,
        "SW_AGENT_SPAN_LIMIT",
        "Maximum spans per segment; further spans are dropped and the segment is "
        "flagged size-limited (name as in the SkyWalking Java agent).",
        TRACE,
        check=_at_least(1),
    )
    agent_tag_value_max_length: int = _opt(
        1024,
        "SW_AGENT_TAG_VALUE_MAX_LENGTH",
        "Longer tag values are truncated (segment flagged size-limited).",
        TRACE,
        check=_at_least(1),
    )
    agent_log_value_max_length: int = _opt(
        8192,
        "SW_AGENT_LOG_VALUE_MAX_LENGTH",
        "Longer span-log values (messages, stacks) are truncated.",
        TRACE,
        check=_at_least(1),
    )
    agent_cause_exception_depth: int = _opt(
        10,
        "SW_AGENT_CAUSE_EXCEPTION_DEPTH",
        "Stack frames kept when an error is recorded on a span or log.",
        TRACE,
        check=_at_least(0),
    )
    correlation_element_max_number: int = _opt(
        3,
        "SW_CORRELATION_ELEMENT_MAX_NUMBER",
        "Maximum number of `sw8-correlation` entries.",
        TRACE,
        check=_at_least(0),
    )
    correlation_value_max_length: int = _opt(
        128,
        "SW_CORRELATION_VALUE_MAX_LENGTH",
        "Maximum length of one `sw8-correlation` value.",
        TRACE,
        check=_at_least(0),
    )

    # -- plugins ---------------------------------------------------------------------------
    agent_disable_plugins: tuple[str, ...] = _opt(
        (),
        "SW_AGENT_DISABLE_PLUGINS",
        "Comma-separated instrumentation names or glob patterns not to install (e.g. `httpx,django`); "
        "the SkyWalking Python agent's plugin names (`sw_flask`) and its regular expressions work too.",
        PLUGIN,
    )
    plugin_http_ignore_method: tuple[str, ...] = _opt(
        (),
        "SW_PLUGIN_HTTP_IGNORE_METHOD",
        "Comma-separated HTTP methods whose requests are not traced (e.g. `OPTIONS,HEAD`).",
        PLUGIN,
    )
    plugin_http_http_params_length_threshold: int = _opt(
        1024,
        "SW_PLUGIN_HTTP_HTTP_PARAMS_LENGTH_THRESHOLD",
        "When query parameters are collected, keep at most this many characters.",
        PLUGIN,
        check=_at_least(0),
    )
    plugin_flask_collect_http_params: bool = _opt(
        False, "SW_PLUGIN_FLASK_COLLECT_HTTP_PARAMS", "Tag Flask entry spans with the query string.", PLUGIN
    )
    plugin_django_collect_http_params: bool = _opt(
        False, "SW_PLUGIN_DJANGO_COLLECT_HTTP_PARAMS", "Tag Django entry spans with the query string.", PLUGIN
    )
    plugin_fastapi_collect_http_params: bool = _opt(
        False,
        "SW_PLUGIN_FASTAPI_COLLECT_HTTP_PARAMS",
        "Tag FastAPI/Starlette entry spans with the query string.",
        PLUGIN,
    )

    # -- logs ------------------------------------------------------------------------------
    agent_log_reporter_active: bool = _opt(
        True,
        "SW_AGENT_LOG_REPORTER_ACTIVE",
        "Report application logs (stdlib `logging`) to the backend.",
        LOGS,
    )
    agent_log_reporter_level: str = _opt(
        "WARNING",
        "SW_AGENT_LOG_REPORTER_LEVEL",
        "Lowest level of the log records reported.",
        LOGS,
        check=_log_level,
    )
    agent_log_reporter_ignore_filter: bool = _opt(
        False,
        "SW_AGENT_LOG_REPORTER_IGNORE_FILTER",
        "Report records even when the logger's filters reject them.",
        LOGS,
    )
    agent_log_reporter_formatted: bool = _opt(
        True,
        "SW_AGENT_LOG_REPORTER_FORMATTED",
        "Send the formatted line; false: the raw message, arguments as `argument.N` tags.",
        LOGS,
    )
    agent_log_reporter_layout: str = _opt(
        "%(asctime)s [%(threadName)s] %(levelname)s %(name)s - %(message)s",
        "SW_AGENT_LOG_REPORTER_LAYOUT",
        "`logging.Formatter` layout of reported lines.",
        LOGS,
    )
    agent_log_reporter_safe_mode: bool = _opt(
        False,
        "SW_AGENT_LOG_REPORTER_SAFE_MODE",
        "Mask `user:password@` in URLs inside reported messages.",
        LOGS,
    )

    # -- meters ----------------------------------------------------------------------------
    agent_meter_reporter_active: bool = _opt(
        True, "SW_AGENT_METER_REPORTER_ACTIVE", "Report meters (gRPC and Kafka only).", METER
    )
    agent_meter_reporter_period: float = _opt(
        20.0,
        "SW_AGENT_METER_REPORTER_PERIOD",
        "Seconds between two meter reports.",
        METER,
        check=_at_least(1),
    )
    agent_pvm_meter_reporter_active: bool = _opt(
        True,
        "SW_AGENT_PVM_METER_REPORTER_ACTIVE",
        "Report Python VM meters (CPU, memory, GC, threads).",
        METER,
    )

    # -- profiling -------------------------------------------------------------------------
    agent_profile_active: bool = _opt(
        True,
        "SW_AGENT_PROFILE_ACTIVE",
        "Run the OAP's profile tasks (gRPC only; see docs/profiling.md).",
        PROFILE,
    )
    agent_collector_get_profile_task_interval: float = _opt(
        20.0,
        "SW_AGENT_COLLECTOR_GET_PROFILE_TASK_INTERVAL",
        "Seconds between two queries for new profile tasks (the reporter asks the OAP).",
        PROFILE,
        check=_at_least(1),
    )
    agent_profile_max_parallel: int = _opt(
        5,
        "SW_AGENT_PROFILE_MAX_PARALLEL",
        "Segments one worker profiles at the same time.",
        PROFILE,
        check=_at_least(1),
    )
    agent_profile_duration: int = _opt(
        10,
        "SW_AGENT_PROFILE_DURATION",
        "Longest sampling of one segment, in minutes (then it stops, the request goes on).",
        PROFILE,
        check=_at_least(1),
    )
    agent_profile_dump_max_stack_depth: int = _opt(
        500,
        "SW_AGENT_PROFILE_DUMP_MAX_STACK_DEPTH",
        "Frames kept per snapshot (the innermost ones when a stack is deeper).",
        PROFILE,
        check=_at_least(1),
    )

    # -- reporter process, arena, spool (new in swmp) --------------------------------------
    agent_reporter_process: bool = _opt(
        True,
        "SW_AGENT_REPORTER_PROCESS",
        "Ship data from a dedicated reporter process; false: a background thread in the application.",
        REPORTER,
    )
    agent_arena_dir: str = _opt(
        "/dev/shm", "SW_AGENT_ARENA_DIR", "Directory of the shared-memory arena file (a tmpfs).", REPORTER
    )
    agent_arena_slots: int = _opt(
        64,
        "SW_AGENT_ARENA_SLOTS",
        "Ring slots in the arena: the most workers that can report at once.",
        REPORTER,
        check=lambda v: None if 1 <= v <= 4096 else "must be between 1 and 4096",
    )
    agent_ring_size: int = _opt(
        4 * MIB,
        "SW_AGENT_RING_SIZE",
        "Bytes per worker ring (power of two, 4 KiB..1 GiB).",
        REPORTER,
        check=_power_of_two(4 * KIB, 1024 * MIB),
    )
    agent_reporter_batch_size: int = _opt(
        1000,
        "SW_AGENT_REPORTER_BATCH_SIZE",
        "Most records the reporter sends in one batch.",
        REPORTER,
        check=_at_least(1),
    )
    agent_reporter_flush_interval: float = _opt(
        0.2,
        "SW_AGENT_REPORTER_FLUSH_INTERVAL",
        "Seconds a partial batch may wait before it is sent.",
        REPORTER,
        check=_at_least(0.001),
    )
    agent_reporter_send_timeout: float = _opt(
        10.0,
        "SW_AGENT_REPORTER_SEND_TIMEOUT",
        "Seconds one send to the backend may take.",
        REPORTER,
        check=_at_least(0.1),
    )
    agent_reporter_max_pending_bytes: int = _opt(
        64 * MIB,
        "SW_AGENT_REPORTER_MAX_PENDING_BYTES",
        "Bytes of unsent data the reporter keeps in memory before spooling or dropping.",
        REPORTER,
        check=_at_least(KIB),
    )
    agent_reporter_shutdown_timeout: float = _opt(
        5.0,
        "SW_AGENT_REPORTER_SHUTDOWN_TIMEOUT",
        "Seconds the reporter may spend flushing at shutdown.",
        REPORTER,
        check=_at_least(0),
    )
    agent_spool_dir: str = _opt(
        "",
        "SW_AGENT_SPOOL_DIR",
        "Directory for spooling data during a long backend outage; empty = off.",
        REPORTER,
    )
    agent_spool_max_bytes: int = _opt(
        256 * MIB,
        "SW_AGENT_SPOOL_MAX_BYTES",
        "Size cap of the spool directory.",
        REPORTER,
        check=_at_least(0),
    )

    # -- derived values --------------------------------------------------------------------
    @property
    def service_name(self) -> str:
        """The reported service name: ``name|namespace`` when a namespace is set (as the peer agent)."""
        return f"{self.agent_name}|{self.agent_namespace}" if self.agent_namespace else self.agent_name

    @property
    def backends(self) -> tuple[str, ...]:
        return _split(self.agent_collector_backend_services)

    def kafka_topic(self, topic: str) -> str:
        return f"{self.kafka_namespace}-{topic}" if self.kafka_namespace else topic

    def to_reporter_settings(self) -> ReporterSettings:
        extra = {k: v for k, v in self.kafka_reporter_config.items() if k != "compression_type"}
        return ReporterSettings(
            service=self.service_name,
            namespace=self.agent_namespace,
            protocol=self.agent_protocol,
            backends=self.backends,
            authentication=self.agent_authentication,
            force_tls=self.agent_force_tls,
            kafka_bootstrap_servers=_split(self.kafka_bootstrap_servers),
            kafka_namespace=self.kafka_namespace,
            kafka_topic_segment=self.kafka_topic_segment,
            kafka_topic_log=self.kafka_topic_log,
            kafka_topic_meter=self.kafka_topic_meter,
            kafka_topic_management=self.kafka_topic_management,
            kafka_compression=self.kafka_reporter_config.get("compression_type", ""),
            kafka_extra=extra,
            batch_max_records=self.agent_reporter_batch_size,
            flush_interval_s=self.agent_reporter_flush_interval,
            keepalive_interval_s=self.agent_collector_heartbeat_period,
            properties_every_n_keepalives=self.agent_collector_properties_report_period_factor,
            send_timeout_s=self.agent_reporter_send_timeout,
            max_pending_bytes=self.agent_reporter_max_pending_bytes,
            shutdown_deadline_s=self.agent_reporter_shutdown_timeout,
            # The HTTP receiver has no meter or profiling endpoints; Kafka has no profiling.
            profile_enabled=self.agent_profile_active and self.agent_protocol not in ("http", "kafka"),
            profile_task_interval_s=self.agent_collector_get_profile_task_interval,
            meter_enabled=self.agent_meter_reporter_active and self.agent_protocol != "http",
            log_enabled=self.agent_log_reporter_active,
            spool_dir=self.agent_spool_dir,
            spool_max_bytes=self.agent_spool_max_bytes,
        )


# -- declarations as data ------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One declared setting, as the loader and the doc generator see it."""

    name: str
    env: str
    type_name: str
    default: Any
    doc: str
    section: str
    aliases: tuple[str, ...]
    prefix: str
    check: Callable[[Any], str | None] | None


def _type_name(f: dataclasses.Field[Any]) -> str:
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return {"tuple[str, ...]": "list", "dict[str, str]": "map"}.get(t, t)


def settings() -> tuple[Setting, ...]:
    """Every declared setting, in declaration order."""
    out = []
    for f in dataclasses.fields(Config):
        m = f.metadata
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        out.append(
            Setting(
                name=f.name,
                env=m["env"],
                type_name=_type_name(f),
                default=default,
                doc=m["doc"],
                section=m["section"],
                aliases=m["aliases"],
                prefix=m["prefix"],
                check=m["check"],
            )
        )
    return tuple(out)


def env_to_kwarg(env: str) -> str:
    """``SW_AGENT_NAME`` -> ``agent_name``: the documented mapping to keyword arguments."""
    return env[3:].lower() if env.startswith("SW_") else env.lower()


# -- parsing -------------------------------------------------------------------------------

_reported: set[tuple[str, str]] = set()


def _report(source: str, raw: object, why: str, fallback: object) -> None:
    """Log a bad value once per (source, value): workers re-load config after fork."""
    key = (source, repr(raw)[:200])
    if key in _reported:
        return
    _reported.add(key)
    log.warning("swmp: %s=%r is invalid (%s); using %r instead", source, raw, why, fallback)


def _split(raw: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def _parse(type_name: str, raw: Any) -> Any:
    """Convert an environment string or a keyword value to the setting's type; ValueError if not possible."""
    if type_name == "bool":
        if isinstance(raw, bool):
            return raw
        s = str(raw).strip().lower()
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
        raise ValueError("not a boolean (true/false)")
    if type_name == "int":
        if isinstance(raw, bool):
            raise ValueError("not an integer")
        if isinstance(raw, int):
            return raw
        s = str(raw).strip().replace("_", "")
        m = re.fullmatch(r"(\d+)\s*([kKmMgG]i?[bB]?)?", s)
        if m and m.group(2):
            unit = m.group(2)[0].lower()
            return int(m.group(1)) * {"k": KIB, "m": MIB, "g": 1024 * MIB}[unit]
        try:
            return int(s)
        except ValueError:
            raise ValueError("not an integer") from None
    if type_name == "float":
        if isinstance(raw, bool):
            raise ValueError("not a number")
        try:
            v = float(raw)
        except (TypeError, ValueError):
            raise ValueError("not a number") from None
        if not math.isfinite(v):
            raise ValueError("not a finite number")
        return v
    if type_name == "list":
        if isinstance(raw, str):
            return _split(raw)
        if isinstance(raw, (list, tuple, set, frozenset)):
            return tuple(str(x).strip() for x in raw if str(x).strip())
        raise ValueError("not a comma-separated list")
    if type_name == "map":
        if isinstance(raw, Mapping):
            return {str(k): str(v) for k, v in raw.items()}
        raise ValueError("not a mapping")
    if not isinstance(raw, str):
        raise ValueError("not a string")
    return raw


def _validated(s: Setting, source: str, raw: Any) -> tuple[bool, Any]:
    try:
        value = _parse(s.type_name, raw)
    except ValueError as e:
        _report(source, raw, str(e), s.default)
        return False, None
    if s.name in ("agent_logging_level", "agent_log_reporter_level"):
        value = value.upper()
    if s.name == "agent_protocol":
        value = value.lower()
    if s.check is not None:
        why = s.check(value)
        if why is not None:
            _report(source, raw, why, s.default)
            return False, None
    return True, value


def load(environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
    """Build a Config from the environment, then keyword arguments (which win). Never raises."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for s in settings():
        if s.prefix:
            family = {k[len(s.prefix) :].lower(): v for k, v in env.items() if k.startswith(s.prefix)}
            if family:
                values[s.name] = family
            continue
        for var in (s.env, *s.aliases):
            if var in env:
                ok, value = _validated(s, var, env[var])
                if ok:
                    values[s.name] = value
                break
    known = {f.name: f for f in settings()}
    for key, raw in overrides.items():
        s2 = known.get(key)
        if s2 is None:
            if ("kwarg", key) not in _reported:
                _reported.add(("kwarg", key))
                log.warning(
                    "swmp: start() got an unknown setting %r; ignored (see docs/configuration.md)", key
                )
            continue
        ok, value = _validated(s2, f"start({key}=...)", raw)
        if ok:
            values[key] = value
    return Config(**values)


def parse_instance_properties(cfg: Config) -> dict[str, str]:
    """``SW_AGENT_INSTANCE_PROPERTIES_JSON`` as a dict; a bad value is reported once and ignored."""
    raw = cfg.agent_instance_properties_json
    if not raw:
        return {}
    import json  # noqa: PLC0415 (rarely used; keep start-up imports small)

    try:
        obj = json.loads(raw)
    except ValueError as e:
        _report("SW_AGENT_INSTANCE_PROPERTIES_JSON", raw, f"not JSON: {e}", {})
        return {}
    if not isinstance(obj, dict):
        _report("SW_AGENT_INSTANCE_PROPERTIES_JSON", raw, "not a JSON object", {})
        return {}
    return {str(k): str(v) for k, v in obj.items()}
