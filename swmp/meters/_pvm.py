"""Python VM meters of this process (CPU, memory, threads, GC), as the OAP's rules name them."""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from swmp.meters._registry import registry

log = logging.getLogger("swmp.meters")

PVM_METERS = (
    "instance_pvm_total_cpu_utilization",
    "instance_pvm_process_cpu_utilization",
    "instance_pvm_total_mem_utilization",
    "instance_pvm_process_mem_utilization",
    "instance_pvm_thread_active_count",
    "instance_pvm_thread_daemon_count",
    "instance_pvm_gc_g0",
    "instance_pvm_gc_g1",
    "instance_pvm_gc_g2",
    "instance_pvm_gc_time",
)


class _Pvm:
    """Python VM meters of this process, named as the OAP's python-runtime rules expect."""

    def __init__(self) -> None:
        self._pid = -1
        self._process: Any = None
        self._psutil: Any = None
        self.gc_ms = 0.0  # total time spent in collections since the callback was installed
        self._machine: tuple[float, float] | None = None  # (busy, total) CPU seconds at the last read
        self._gc_started = 0.0
        self._installed = False

    def install(self) -> None:
        if self._installed:
            return
        try:
            import psutil  # noqa: PLC0415 (only when PVM meters are on)

            self._psutil = psutil
        except ImportError:
            log.warning("swmp: psutil is missing; PVM CPU and memory meters are not reported")
        from swmp.meters._kinds import Gauge  # noqa: PLC0415 (kinds -> control -> pvm)

        gc.callbacks.append(self._on_gc)
        suppliers: dict[str, Callable[[], float]] = {
            "instance_pvm_total_cpu_utilization": self.total_cpu,
            "instance_pvm_process_cpu_utilization": self.process_cpu,
            "instance_pvm_total_mem_utilization": self.total_mem,
            "instance_pvm_process_mem_utilization": self.process_mem,
            "instance_pvm_thread_active_count": self.threads,
            "instance_pvm_thread_daemon_count": self.daemon_threads,
            "instance_pvm_gc_g0": lambda: float(gc.get_stats()[0]["collected"]),
            "instance_pvm_gc_g1": lambda: float(gc.get_stats()[1]["collected"]),
            "instance_pvm_gc_g2": lambda: float(gc.get_stats()[2]["collected"]),
            "instance_pvm_gc_time": lambda: self.gc_ms,
        }
        for name, supplier in suppliers.items():
            if self._psutil is None and ("cpu" in name or "mem" in name):
                continue
            Gauge(name, supplier=supplier)
        self._installed = True

    def uninstall(self) -> None:
        if not self._installed:
            return
        self._installed = False
        try:
            gc.callbacks.remove(self._on_gc)
        except ValueError:
            pass
        for name in PVM_METERS:
            meter = registry.get(name)
            if meter is not None:
                registry.remove(meter)

    def after_fork(self) -> None:
        self._pid = -1  # psutil.Process() caches the pid: take a new one on first use

    def prime(self) -> None:
        """CPU percentages compare with the previous call: take the first sample now."""
        if self._installed and self._psutil is not None:
            try:
                self._machine = self._machine_times()
                self._proc()
            except Exception:
                log.debug("PVM priming failed", exc_info=True)

    def _proc(self) -> Any:
        pid = os.getpid()
        if self._pid != pid:
            self._process = self._psutil.Process(pid)
            self._process.cpu_percent(None)
            self._pid = pid
        return self._process

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        # Collections never nest, so one start time serves every thread.
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started:
            self.gc_ms += (time.perf_counter() - self._gc_started) * 1000.0
            self._gc_started = 0.0

    def total_cpu(self) -> float:
        """Whole machine, % busy since the last report. Not ``psutil.cpu_percent(None)``: its
        baseline is one module global, shared with the application's own calls, whose
        readings ours would then shorten to "since the agent's last report"."""
        now = self._machine_times()
        last, self._machine = self._machine, now
        if last is None or now[1] <= last[1]:
            return 0.0
        return max(0.0, min(100.0, 100.0 * (now[0] - last[0]) / (now[1] - last[1])))

    def _machine_times(self) -> tuple[float, float]:
        """(busy, total) CPU seconds of the machine, as psutil's ``cpu_percent`` counts them:
        guest time is already in user time; idle and I/O wait are not busy."""
        t = self._psutil.cpu_times()
        total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
        return total - t.idle - getattr(t, "iowait", 0.0), total

    def process_cpu(self) -> float:
        return float(self._proc().cpu_percent(None))  # this process; 100 = one core

    def total_mem(self) -> float:
        return float(self._psutil.virtual_memory().percent)

    def process_mem(self) -> float:
        rss = float(self._proc().memory_info().rss)
        return 100.0 * rss / float(self._psutil.virtual_memory().total)

    def threads(self) -> float:
        if self._psutil is None:
            return float(threading.active_count())
        return float(self._proc().num_threads())  # OS threads, C-level ones included

    def daemon_threads(self) -> float:
        return float(sum(1 for t in threading.enumerate() if t.daemon))


pvm = _Pvm()


