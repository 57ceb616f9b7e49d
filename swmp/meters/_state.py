"""Meters' per-process state: one object per kind of state, reset in place in a new process.

The hot path (``increment``/``observe``) reads ``here.ready`` and, where fork hooks cannot
be trusted, compares ``here.pid``; everything else happens behind it (``_control``).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

log = logging.getLogger("swmp.meters")


class Here:
    """What this process knows about its own reporting; reset when a new process is entered.

    ``ready`` is the one flag the hot path reads: False means "look at the process before
    counting" (a new process, a new configuration). ``check_pid`` turns on the pid backstop
    where no fork hook can be trusted to clear ``ready``.
    """

    __slots__ = ("check_pid", "final", "pid", "ready", "thread")

    def __init__(self, pid: int, check_pid: bool) -> None:
        self.check_pid = check_pid
        self.reset(pid)

    def reset(self, pid: int) -> None:
        self.pid = pid
        self.ready = False
        self.thread: Any = None  # the _control.MeterThread of this process
        self.final = False  # flush() ran here: no restart until the reporter is started again


class Settings:
    __slots__ = ("period", "pvm")

    def __init__(self, period: float, pvm: bool) -> None:
        self.period = period
        self.pvm = pvm


class Stats:
    __slots__ = ("errors", "reports_dropped", "reports_written", "supplier_errors", "values_refused")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.reports_written = 0  # METER records the sink accepted
        self.reports_dropped = 0  # METER records the sink refused (ring full, no ring)
        self.supplier_errors = 0  # gauge suppliers that raised or returned a non-number
        self.errors = 0  # reports that could not be built, threads that did not start
        self.values_refused = 0  # increment/observe values that are not finite numbers


class Locks:
    """Locks a forked child must not inherit (a parent's thread may have held them)."""

    __slots__ = ("report", "state")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.state = threading.Lock()  # here.thread, config.settings; never held while reporting
        self.report = threading.Lock()  # one report at a time (thread, flush, report())


class Config:
    __slots__ = ("settings",)

    def __init__(self) -> None:
        self.settings: Settings | None = None  # set by start_meter_reporter; None: not reporting


here = Here(os.getpid(), check_pid=False)
config = Config()
stats = Stats()
locks = Locks()
_warned: set[str] = set()


def warn_once(key: str, message: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        log.error(message, *args, exc_info=True)
