"""Application logs to SkyWalking: a ``logging.Handler`` that writes LOG records.

Each record carries the trace context of the code that logged it (trace id, segment id,
span id, endpoint), so the OAP links logs to traces. It never raises and never blocks: a
record the ring cannot take is dropped and counted. The agent's own loggers (``swmp``,
``ipc``) are never reported, so a failing sink cannot feed itself.

``SW_AGENT_LOG_REPORTER_IGNORE_FILTER=false`` (default): the handler sits on the root logger
and sees what the logging configuration lets through to it. ``true``: every record of the
reporter's level is reported from ``Logger.handle``, before any filter or propagation rule.
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any

import orjson

from reporter_proc.records import LOG
from swmp import _sink
from swmp.instrument._patch import patch, restore
from swmp.tracing.context import active_span
from swmp.tracing.identity import identity
from swmp.tracing.limits import limits

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "logging"
PACKAGE = None
SUPPORTED = ("", "")

_OWN = ("swmp", "ipc")
_OWN_PREFIXES = ("swmp.", "ipc.")
_CREDENTIALS = re.compile(r"(://)[^/\s:@]+:[^/\s@]+@")


class LogStats:
    __slots__ = ("dropped", "errors", "written")

    def __init__(self) -> None:
        self.written = 0
        self.dropped = 0
        self.errors = 0


stats = LogStats()


class SkyWalkingLogHandler(logging.Handler):
    """Turns log records into swmp LOG records (see ``reporter_proc.records``)."""

    def __init__(
        self,
        level: int | str = logging.WARNING,
        layout: str | None = None,
        formatted: bool = True,
        safe_mode: bool = False,
    ) -> None:
        super().__init__(level)
        self.formatted = formatted
        self.safe_mode = safe_mode
        self.setFormatter(logging.Formatter(layout or "%(message)s"))
        self._logged = False

    def emit(self, record: logging.LogRecord) -> None:
        name = record.name
        if name in _OWN or name.startswith(_OWN_PREFIXES):
            return
        try:
            payload = orjson.dumps(self.to_record(record))
        except Exception as e:
            stats.errors += 1
            if not self._logged:
                self._logged = True
                logging.getLogger("swmp.logs").error(
                    "swmp: cannot encode a log record: %r (only counted now)", e
                )
            return
        if _sink.get_sink().write(LOG, payload):
            stats.written += 1
        else:
            stats.dropped += 1

    def to_record(self, record: logging.LogRecord) -> list[Any]:
        tags = ["level", record.levelname, "logger", record.name, "thread", record.threadName or ""]
        if self.formatted:
            body = self.format(record)
        else:
            body = str(record.msg)
            args = record.args
            if isinstance(args, tuple):
                for i, a in enumerate(args):
                    tags += [f"argument.{i}", str(a)]
            if record.exc_info:
                tags += [
                    "exception",
                    self.formatter.formatException(record.exc_info) if self.formatter else "",
                ]
        if self.safe_mode:
            body = _CREDENTIALS.sub(r"\1***:***@", body)
        lim = limits.log_value_max
        if len(body) > lim:
            body = body[:lim]
        span = active_span()
        if span is not None:
            seg = span.segment
            trace_id, seg_id, span_id, endpoint = seg.trace_id, seg.segment_id, span.span_id, seg.endpoint
        else:
            trace_id, seg_id, span_id, endpoint = "", "", -1, ""
        ts = int(record.created * 1000) if record.created else time.time_ns() // 1_000_000
        return [
            ts,
            identity.service,
            identity.instance,
            endpoint,
            "text",
            body,
            trace_id,
            seg_id,
            span_id,
            tags,
            "",
        ]


_handler: SkyWalkingLogHandler | None = None


def install(config: Config) -> None:
    global _handler
    if not config.agent_log_reporter_active or _handler is not None:
        return
    handler = SkyWalkingLogHandler(
        config.agent_log_reporter_level,
        config.agent_log_reporter_layout,
        config.agent_log_reporter_formatted,
        config.agent_log_reporter_safe_mode,
    )
    _handler = handler
    if config.agent_log_reporter_ignore_filter:

        def make(orig: Any) -> Any:
            def handle(self: logging.Logger, record: logging.LogRecord) -> None:
                if record.levelno >= handler.level:
                    handler.emit(record)
                orig(self, record)

            return handle

        patch(logging.Logger, "handle", make)
    else:
        logging.getLogger().addHandler(handler)


def uninstall() -> None:
    global _handler
    if _handler is not None:
        logging.getLogger().removeHandler(_handler)
        restore(logging.Logger, "handle")
        _handler = None
