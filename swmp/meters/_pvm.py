"""Python VM meters of this process (CPU, memory, threads, GC), as the OAP's rules name them."""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

from swmp.meters import _sources
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
        self._source: _sources.Source | None = None  # None: no CPU and memory meters
        self.gc_ms = 0.0  # total time spent in collections since the callback was installed
        self._machine: tuple[float, float] | None = None  # (busy, total) CPU time at the last read
        self._own: tuple[float, float] | None = None  # (monotonic, CPU seconds) at the last read
        self._gc_started = 0.0
        self._installed = False

    def install(self) -> None:
        if self._installed:
            return
        self._source = _sources.proc_source() or _psutil_source()
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
            if self._source is None and ("cpu" in name or "mem" in name):
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
        self._own = None  # a child's CPU time starts again from zero

    def prime(self) -> None:
        """CPU percentages compare with the previous call: take the first sample now."""
        if self._installed and self._source is not None:
            try:
                self._machine = self._source.machine_times()
                self._own = (time.monotonic(), _sources.process_cpu_seconds())
            except Exception:
                log.debug("PVM priming failed", exc_info=True)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        # Collections never nest, so one start time serves every thread.
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started:
            self.gc_ms += (time.perf_counter() - self._gc_started) * 1000.0
            self._gc_started = 0.0

    def _require(self) -> _sources.Source:
        if self._source is None:  # only the CPU and memory meters call this, made with a source
            raise RuntimeError("no PVM source")
        return self._source

    def total_cpu(self) -> float:
        """Whole machine, % busy since the last report, as psutil's ``cpu_percent`` counts
        it. Not ``psutil.cpu_percent(None)`` itself: its baseline is one module global,
        shared with the application's own calls, whose readings ours would then shorten to
        "since the agent's last report"."""
        now = self._require().machine_times()
        last, self._machine = self._machine, now
        if last is None or now[1] <= last[1]:
            return 0.0
        return max(0.0, min(100.0, 100.0 * (now[0] - last[0]) / (now[1] - last[1])))

    def process_cpu(self) -> float:
        """This process, % of one core since the last report (100 = one core busy), as
        psutil's ``Process.cpu_percent`` counts it; 0 at the first reading after a fork."""
        self._require()
        now = (time.monotonic(), _sources.process_cpu_seconds())
        last, self._own = self._own, now
        if last is None or now[0] <= last[0]:
            return 0.0
        return round(max(0.0, 100.0 * (now[1] - last[1]) / (now[0] - last[0])), 1)

    def total_mem(self) -> float:
        """Machine memory in use, %: what is not available (psutil's ``percent``)."""
        total, available = self._require().memory()
        return round(100.0 * (total - available) / total, 1) if total > 0 else 0.0

    def process_mem(self) -> float:
        source = self._require()
        total = source.memory()[0]
        return 100.0 * source.rss() / total if total > 0 else 0.0

    def threads(self) -> float:
        if self._source is None:
            return float(threading.active_count())
        return float(self._source.threads())  # OS threads, C-level ones included

    def daemon_threads(self) -> float:
        return float(sum(1 for t in threading.enumerate() if t.daemon))


def _psutil_source() -> _sources.PsutilSource | None:
    try:
        import psutil  # noqa: PLC0415 (only where /proc cannot be read)
    except ImportError:
        log.warning("swmp: psutil is missing; PVM CPU and memory meters are not reported")
        return None
    return _sources.PsutilSource(psutil)


pvm = _Pvm()
