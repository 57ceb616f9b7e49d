"""What is recorded: tracing limits, log reporting, meters, profiling."""

from __future__ import annotations

from dataclasses import dataclass

from reporter_proc.settings import BOUNDS, at_least, seconds
from reporter_proc.taskboard import MAX_DURATION_MIN, MIN_DURATION_MIN
from swmp.config._declare import (
    DEFAULT_IGNORE_SUFFIX,
    LOGS,
    METER,
    PROFILE,
    TRACE,
    between,
    log_level,
    opt,
)


@dataclass(frozen=True)
class TraceSettings:
    """Sampling, ignore rules and size limits of traces."""

    sample_n_per_3_secs: int = opt(
        0,
        "SW_SAMPLE_N_PER_3_SECS",
        "Trace at most N new traces per 3 seconds per worker; 0 = all.",
        TRACE,
        check=at_least(0),
    )
    agent_trace_ignore_path: tuple[str, ...] = opt(
        (),
        "SW_AGENT_TRACE_IGNORE_PATH",
        "Comma-separated Ant-style path patterns (`/health`, `/static/**`, `/v?/ping`) whose requests "
        "are not traced. Matched in time linear in the path, also patterns with several `*` in a "
        "segment or several `/**/` (a client chooses the path).",
        TRACE,
    )
    agent_ignore_suffix: tuple[str, ...] = opt(
        tuple(DEFAULT_IGNORE_SUFFIX.split(",")),
        "SW_AGENT_IGNORE_SUFFIX",
        "Comma-separated suffixes; a trace whose first operation name ends with one is not traced.",
        TRACE,
    )
    agent_span_limit: int = opt(
        300,
        "SW_AGENT_SPAN_LIMIT",
        "Maximum spans per segment; further spans are dropped and the segment is "
        "flagged size-limited (name as in the SkyWalking Java agent). A dropped exit span still "
        "sends `sw8` on its call (HTTP, gRPC, messages, Celery), as the Java agent does: the service "
        "called joins the trace, its parent the recorded span the call is made under.",
        TRACE,
        check=at_least(1),
    )
    agent_tag_value_max_length: int = opt(
        1024,
        "SW_AGENT_TAG_VALUE_MAX_LENGTH",
        "Longer tag values are truncated (segment flagged size-limited).",
        TRACE,
        check=at_least(1),
    )
    agent_log_value_max_length: int = opt(
        8192,
        "SW_AGENT_LOG_VALUE_MAX_LENGTH",
        "Longer span-log values (messages, stacks), reported log bodies and log tag values are truncated.",
        TRACE,
        check=at_least(1),
    )
    agent_cause_exception_depth: int = opt(
        10,
        "SW_AGENT_CAUSE_EXCEPTION_DEPTH",
        "Stack frames kept (the innermost: where it was raised) when an error is recorded on a span or log.",
        TRACE,
        check=at_least(0),
    )
    correlation_element_max_number: int = opt(
        3,
        "SW_CORRELATION_ELEMENT_MAX_NUMBER",
        "Maximum number of `sw8-correlation` entries.",
        TRACE,
        check=at_least(0),
    )
    correlation_value_max_length: int = opt(
        128,
        "SW_CORRELATION_VALUE_MAX_LENGTH",
        "Maximum length of one `sw8-correlation` value.",
        TRACE,
        check=at_least(0),
    )

    agent_thread_propagation: bool = opt(
        True,
        "SW_AGENT_THREAD_PROPAGATION",
        "Threads (`threading.Thread`) started and `ThreadPoolExecutor` work submitted inside a trace "
        "continue it (cross-thread reference); false: they start on their own.",
        TRACE,
    )


@dataclass(frozen=True)
class LogSettings:
    """Application log records reported to the backend."""

    agent_log_reporter_active: bool = opt(
        True,
        "SW_AGENT_LOG_REPORTER_ACTIVE",
        "Report application logs (stdlib `logging`) to the backend.",
        LOGS,
    )
    agent_log_reporter_level: str = opt(
        "WARNING",
        "SW_AGENT_LOG_REPORTER_LEVEL",
        "Lowest level of the log records reported.",
        LOGS,
        check=log_level,
    )
    agent_log_reporter_ignore_filter: bool = opt(
        False,
        "SW_AGENT_LOG_REPORTER_IGNORE_FILTER",
        "Report records even when the logger's filters reject them.",
        LOGS,
    )
    agent_log_reporter_formatted: bool = opt(
        True,
        "SW_AGENT_LOG_REPORTER_FORMATTED",
        "Send the formatted line; false: the raw message, arguments as `argument.N` tags.",
        LOGS,
    )
    agent_log_reporter_layout: str = opt(
        "%(asctime)s [%(threadName)s] %(levelname)s %(name)s - %(message)s",
        "SW_AGENT_LOG_REPORTER_LAYOUT",
        "`logging.Formatter` layout of reported lines.",
        LOGS,
    )
    agent_log_reporter_safe_mode: bool = opt(
        False,
        "SW_AGENT_LOG_REPORTER_SAFE_MODE",
        "Mask `user:password@` in URLs inside reported messages.",
        LOGS,
    )


@dataclass(frozen=True)
class MeterSettings:
    """Meter reporting."""

    agent_meter_reporter_active: bool = opt(
        True, "SW_AGENT_METER_REPORTER_ACTIVE", "Report meters (gRPC and Kafka only).", METER
    )
    agent_meter_reporter_period: float = opt(
        20.0,
        "SW_AGENT_METER_REPORTER_PERIOD",
        "Seconds between two meter reports (1 to 86400).",
        METER,
        check=seconds(1),
    )
    agent_pvm_meter_reporter_active: bool = opt(
        True,
        "SW_AGENT_PVM_METER_REPORTER_ACTIVE",
        "Report Python VM meters (CPU, memory, GC, threads).",
        METER,
    )


@dataclass(frozen=True)
class ProfileSettings:
    """Profiling tasks from the OAP."""

    agent_profile_active: bool = opt(
        True,
        "SW_AGENT_PROFILE_ACTIVE",
        "Run the OAP's profile tasks (gRPC only; see docs/profiling.md).",
        PROFILE,
    )
    agent_collector_get_profile_task_interval: float = opt(
        20.0,
        "SW_AGENT_COLLECTOR_GET_PROFILE_TASK_INTERVAL",
        "Seconds between two queries for new profile tasks (the reporter asks the OAP; 1 to 86400).",
        PROFILE,
        check=BOUNDS["profile_task_interval_s"],
    )
    agent_profile_max_parallel: int = opt(
        5,
        "SW_AGENT_PROFILE_MAX_PARALLEL",
        "Segments one worker profiles at the same time.",
        PROFILE,
        check=at_least(1),
    )
    agent_profile_duration: int = opt(
        10,
        "SW_AGENT_PROFILE_DURATION",
        "Longest sampling of one segment, in minutes (then it stops, the request goes on); "
        "1 to 15, the bounds of a task's duration.",
        PROFILE,
        check=between(MIN_DURATION_MIN, MAX_DURATION_MIN, "minutes"),
    )
    agent_profile_dump_max_stack_depth: int = opt(
        500,
        "SW_AGENT_PROFILE_DUMP_MAX_STACK_DEPTH",
        "Frames kept per snapshot (the innermost ones when a stack is deeper).",
        PROFILE,
        check=at_least(1),
    )
