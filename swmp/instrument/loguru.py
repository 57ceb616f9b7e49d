"""loguru: every message of the reporter's level becomes a LOG record with its trace context.

loguru dispatches to sinks synchronously in the logging thread, so a sink added with
``logger.add`` sees the caller's context (trace id, segment, span). Applications commonly
call ``logger.remove()`` (or ``logger.configure(handlers=...)``, which calls it) to replace
loguru's default sink; that would remove ours too, so ``Logger.remove`` is wrapped to put
it back. Tags as the SkyWalking Python agent's loguru plugin: ``level``, ``logger=loguru``,
``thread``, and ``exception`` (the stack, at most ``SW_AGENT_CAUSE_EXCEPTION_DEPTH`` frames).

A message forwarded from the stdlib by a handler (the usual ``InterceptHandler``) was
already reported as a stdlib record and is not reported twice.

loguru formats a message (and calls ``opt(lazy=True)`` arguments) only when some sink takes
its level: the lowest level of all sinks, which loguru keeps in its core. A sink of ours at
WARNING would lower that for an application whose sinks take ERROR, and its WARNING calls
would then be formatted (and could raise) where they were silent before. So after every
``add`` and ``remove`` the core's lowest level is set back to that of the application's own
sinks: the reporter sees what the application logs, and loguru does no more work than it did.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from swmp.instrument._patch import patch, restore
from swmp.instrument.log_reporter import build_failed, level_number, reporting, write_log
from swmp.tracing.limits import format_stack

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "loguru"
PEER_NAMES = ("sw_loguru",)
PACKAGE = "loguru"
SUPPORTED = ("0.6", "1")
TRIGGER = "loguru"

_state: dict[str, Any] = {"id": None}
_log = logging.getLogger("swmp.logs")


def _keep_min_level(target: Any) -> None:
    """Give loguru's core back the lowest level of the application's sinks (ours left out)."""
    try:
        core = target._core
        with core.lock:
            ours = _state["id"]
            levels = [h.levelno for key, h in core.handlers.items() if key != ours]
            core.min_level = min(levels, default=float("inf"))
    except Exception as exc:  # a loguru whose inside differs: our sink's level then counts
        if not _state.get("warned"):
            _state["warned"] = True
            _log.warning(
                "swmp: cannot keep loguru's lowest sink level (%r); messages of the reporter's "
                "level are formatted even where the application's sinks drop them",
                exc,
            )


class _Sink:
    """The reporter's loguru sink. A class of this module, not a closure: loguru pickles a
    logger's sinks with it (its documented way of handing the logger to a ``spawn``-started
    process), and a local function cannot be pickled, so the application's ``Process(...,
    args=(logger,))`` failed. Unpickled in the child, it reports there with the child's context
    (or is counted as a record made before its agent started)."""

    __slots__ = ("safe_mode",)

    def __init__(self, safe_mode: bool) -> None:
        self.safe_mode = safe_mode

    def __reduce__(self) -> tuple[Any, tuple[bool]]:
        return (_Sink, (self.safe_mode,))

    def __call__(self, message: Any) -> None:
        if reporting():
            return
        try:
            record = message.record
            tags = ["level", record["level"].name, "logger", "loguru", "thread", record["thread"].name]
            exc = record["exception"]
            if exc is not None and exc.type is not None:
                stack = format_stack(exc.type, exc.value, exc.traceback)
                tags += ["exception", stack]
            ts = int(record["time"].timestamp() * 1000)
            body = str(record["message"])
        except Exception as e:
            # Not worth failing the application's log call: counted and said once.
            build_failed(e)
            return
        write_log(ts, body, tags, self.safe_mode)


def install(config: Config) -> None:
    if not config.agent_log_reporter_active:
        return
    from loguru import logger  # noqa: PLC0415
    from loguru._logger import Logger  # noqa: PLC0415

    level = level_number(config.agent_log_reporter_level)
    sink = _Sink(config.agent_log_reporter_safe_mode)

    def add(target: Any) -> int:
        return int(target.add(sink, level=level, format="{message}", catch=True, colorize=False))

    def make_add(orig: Any) -> Any:
        def add_sink(self: Any, *args: Any, **kwargs: Any) -> Any:
            handler_id = orig(self, *args, **kwargs)
            if _state["id"] is not None:
                _keep_min_level(self)
            return handler_id

        return add_sink

    def make_remove(orig: Any) -> Any:
        def remove(self: Any, handler_id: int | None = None) -> None:
            orig(self, handler_id)
            ours = _state["id"]
            if ours is not None and (handler_id is None or handler_id == ours):
                _state["id"] = None
                try:
                    _state["id"] = add(self)
                except Exception:
                    pass
            _keep_min_level(self)

        return remove

    _state["id"] = add(logger)
    _keep_min_level(logger)
    patch(Logger, "add", make_add)
    patch(Logger, "remove", make_remove)


def uninstall() -> None:
    from loguru import logger  # noqa: PLC0415
    from loguru._logger import Logger  # noqa: PLC0415

    restore(Logger, "add")
    restore(Logger, "remove")
    ours, _state["id"] = _state["id"], None
    if ours is not None:
        try:
            logger.remove(ours)
        except ValueError:
            pass
