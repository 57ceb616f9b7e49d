"""structlog: every event of the reporter's level becomes a LOG record with its trace context.

``BoundLoggerBase._process_event`` (the processor chain every bound logger runs, whatever
its wrapper class) is wrapped: once the application's processors produced the final event
(a rendered line, bytes, or a dict), it is reported with the caller's trace context, and
then written wherever the application's configuration sends it. An event the processors
drop (``DropEvent``) is not reported; filtering bound loggers never reach this point for
levels they filter out.

Events that structlog hands to a stdlib ``logging.Logger`` (``structlog.stdlib.LoggerFactory``)
are left to the stdlib integration, which sees them as ordinary records: reported once.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import TYPE_CHECKING, Any

import orjson

from swmp.instrument._patch import patch, restore
from swmp.instrument.log_reporter import level_number, reporting, write_log

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "structlog"
PACKAGE = "structlog"
SUPPORTED = ("21.1", "")
TRIGGER = "structlog"

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "msg": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "err": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _body(args: Any, kw: Any) -> str:
    first = args[0] if args else kw
    if isinstance(first, str):
        return _ANSI.sub("", first)
    if isinstance(first, (bytes, bytearray)):
        return _ANSI.sub("", bytes(first).decode("utf-8", "replace"))
    return orjson.dumps(first, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


def install(config: Config) -> None:
    if not config.agent_log_reporter_active:
        return
    from structlog._base import BoundLoggerBase  # noqa: PLC0415

    level = level_number(config.agent_log_reporter_level)
    safe_mode = config.agent_log_reporter_safe_mode

    def make(orig: Any) -> Any:
        def _process_event(self: Any, method_name: str, event: Any, event_kw: Any) -> Any:
            result = orig(self, method_name, event, event_kw)  # DropEvent propagates as before
            try:
                levelno = _LEVELS.get(method_name, logging.INFO)
                if levelno >= level and not reporting() and not isinstance(self._logger, logging.Logger):
                    name = logging.getLevelName(levelno)
                    tags = ["level", name, "logger", "structlog", "thread", threading.current_thread().name]
                    write_log(time.time_ns() // 1_000_000, _body(*result), tags, safe_mode)
            except Exception:
                pass  # reporting never changes what the application's logger does
            return result

        return _process_event

    patch(BoundLoggerBase, "_process_event", make)


def uninstall() -> None:
    from structlog._base import BoundLoggerBase  # noqa: PLC0415

    restore(BoundLoggerBase, "_process_event")
