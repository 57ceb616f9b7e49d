"""When and where meters report: the per-process thread, fork, start, flush, stop.

Fork and the sink's binding are ``swmp.lifecycle`` moments this module subscribes to; the
hot path's slow branch (:func:`enter`) settles the rest (see the package doc).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from swmp import lifecycle
from swmp.config import MAX_SECONDS
from swmp.meters._pvm import pvm as pvm_meters
from swmp.meters._registry import registry
from swmp.meters._report import report
from swmp.meters._state import Settings, here, locks, warn_once
from swmp.meters._state import config as current
from swmp.meters._state import stats as counts

_new_process_locks: dict[int, threading.Lock] = {}


def enter() -> None:
    """The slow path behind the hot path's flag: a new process, or reporting not settled."""
    try:
        pid = os.getpid()
        if here.pid != pid:
            _new_process(pid)
        _maybe_start()
    except Exception:
        counts.errors += 1
        warn_once("enter", "swmp: meter bookkeeping failed in pid %d", os.getpid())
        here.ready = True  # do not retry on every increment


def _new_process(pid: int) -> None:
    """Forget what the parent process had: values, locks, its reporter thread."""
    # One lock per pid from setdefault (atomic under the GIL): the hooks and the pid
    # backstop may race here, and any lock inherited from the parent may be held forever.
    with _new_process_locks.setdefault(pid, threading.Lock()):
        if here.pid == pid:
            return
        locks.reset()
        counts.reset()  # the child's own counts
        registry._after_fork()
        pvm_meters.after_fork()
        here.reset(pid)
        for stale in [p for p in _new_process_locks if p != pid]:
            _new_process_locks.pop(stale, None)


def _maybe_start() -> None:
    """Start this process's reporter thread if it should run and is not running."""
    with locks.state:
        thread = here.thread
        settings = current.settings
        if thread is not None and thread.is_alive():
            pass
        elif settings is None or here.final or not lifecycle.may_report_here():
            pass  # start_meter_reporter / a fork makes us look again
        else:
            thread = MeterThread(settings.period)
            try:
                thread.start()
            except RuntimeError:  # interpreter shutting down, or no more threads
                counts.errors += 1
                warn_once("thread", "swmp: cannot start the meter thread in pid %d", os.getpid())
            else:
                here.thread = thread
        here.ready = True


def _after_fork_in_child() -> None:
    try:
        _new_process(os.getpid())
        if len(registry):
            _maybe_start()  # PVM and declared gauges report without waiting for a call
    except Exception:
        counts.errors += 1
        warn_once("fork", "swmp: meter after-fork setup failed in pid %d", os.getpid())


def _on_bound(role: str) -> None:
    """The sink bound this process: a worker starts reporting declared meters now."""
    if role == lifecycle.WORKER and len(registry):
        enter()


# Fork and binding come from swmp.lifecycle; where its fork hooks cannot be trusted
# (uWSGI without uwsgidecorators), the hot path compares pids.
lifecycle.on_fork(_after_fork_in_child)
here.check_pid = not lifecycle.FORK_HOOKS_RELIABLE


class MeterThread(threading.Thread):
    def __init__(self, period: float) -> None:
        super().__init__(name="swmp-meters", daemon=True)
        self.period = period
        self.stopping = threading.Event()

    def run(self) -> None:
        pvm_meters.prime()
        while not self.stopping.wait(self.period):
            report()

    def stop(self, timeout: float) -> None:
        self.stopping.set()
        if self is not threading.current_thread():
            self.join(timeout)


def start_meter_reporter(config: Any) -> None:
    """Turn reporting on (the agent calls this at start, in the master). Never raises.

    ``config`` is a :class:`swmp.config.Config` (or anything with its
    ``agent_meter_reporter_period`` and ``agent_pvm_meter_reporter_active``). No thread is
    started here unless this process already owns its ring: see the module doc.
    """
    try:
        period = float(getattr(config, "agent_meter_reporter_period", 20.0))
        pvm = bool(getattr(config, "agent_pvm_meter_reporter_active", True))
        # A hand-built Config skips the loader's range check; Event.wait overflows on huge values.
        if not 0 < period <= MAX_SECONDS:
            period = 20.0
        if pvm:
            pvm_meters.install()
        else:
            pvm_meters.uninstall()
        with locks.state:
            current.settings = Settings(period, pvm)
            here.final = False
            here.ready = False  # the next use looks at the process again
        lifecycle.on_bound(_on_bound)
        lifecycle.on_leave(_flush_on_leave)
        if lifecycle.is_reporting_worker() and len(registry):
            enter()
    except Exception:
        counts.errors += 1
        warn_once("start", "swmp: the meter reporter could not be set up")


def start_in_this_process() -> bool:
    """Start this process's reporter thread now (an application that knows it is not a
    prefork master). True if the thread runs. Needs :func:`start_meter_reporter` first."""
    here.ready = False
    enter()
    thread = here.thread
    return thread is not None and thread.is_alive()


def flush(timeout: float = 2.0) -> bool:
    """Stop this process's meter thread and write a final report (the agent calls this at
    exit, before the worker leaves its ring). True if a report was written."""
    try:
        if here.pid != os.getpid():
            return False  # a forked process that never reported inherits nothing to flush
        with locks.state:
            thread = here.thread
            here.thread = None
            here.final = True
        if thread is None:
            return False
        thread.stop(timeout)
        return report()
    except Exception:
        warn_once("flush", "swmp: the final meter report failed")
        return False


def stop_meter_reporter(timeout: float = 2.0) -> None:
    """Flush, then turn reporting off in this process (PVM meters are removed)."""
    flush(timeout)
    with locks.state:
        current.settings = None
        here.ready = False
    pvm_meters.uninstall()
    lifecycle.unsubscribe(_on_bound)
    lifecycle.unsubscribe(_flush_on_leave)


def stats() -> dict[str, int | bool]:
    """Counters of this process's meter reporting (for status pages and tests)."""
    thread = here.thread
    return {
        "reports_written": counts.reports_written,
        "reports_dropped": counts.reports_dropped,
        "supplier_errors": counts.supplier_errors,
        "values_refused": counts.values_refused,
        "errors": counts.errors,
        "observations_dropped": sum(m.dropped for m in registry.meters()),
        "meters": len(registry),
        "thread_alive": bool(thread is not None and thread.is_alive() and here.pid == os.getpid()),
    }


def _flush_on_leave() -> None:
    try:
        flush()
    except Exception:
        pass
