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
from swmp.instrument.log_reporter import build_failed, level_number, reporting, write_log
from swmp.tracing.utf8 import escaped

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
    try:
        return orjson.dumps(first, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        # A key orjson cannot take (a tuple), text that is not UTF-8 (lone surrogates), an
        # integer past 64 bits: those as (escaped) text, the rest as before.
        return orjson.dumps(_encodable(first), default=_text, option=orjson.OPT_NON_STR_KEYS).decode()


def _text(value: Any) -> str:
    try:
        return escaped(str(value))
    except Exception:
        return "<unprintable>"


def _encodable(value: Any) -> Any:
    if isinstance(value, str):
        return escaped(value)
    if isinstance(value, dict):
        return {_text(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encodable(v) for v in value]
    if isinstance(value, int) and not -(2**63) <= value < 2**64:
        return str(value)
    return value


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
            except Exception as e:  # reporting never changes what the application's logger does
                build_failed(e)
            return result

        return _process_event

    patch(BoundLoggerBase, "_process_event", make)


def uninstall() -> None:
    from structlog._base import BoundLoggerBase  # noqa: PLC0415

    restore(BoundLoggerBase, "_process_event")
