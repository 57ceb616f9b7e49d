"""Where the PVM meters read the machine's and this process's CPU, memory and threads.

On Linux they are read straight from ``/proc``: one small file each. psutil, which the meters
used before, is only the fallback where ``/proc`` cannot be read. Importing psutil loads 28
modules and ~2 MiB into the process, and the agent starts the meters in a prefork server's
master before it forks: every worker then carries that memory in its RSS, and copies it into
its private memory as its garbage collector walks those objects, for five numbers.

Both sources answer the same five questions in the same units; ``swmp.meters._pvm`` turns them
into the percentages the OAP's rules expect, with one formula for both.
"""

from __future__ import annotations

import os
from typing import Any, Protocol


class Source(Protocol):
    def machine_times(self) -> tuple[float, float]:
        """(busy, total) CPU time of the whole machine, in any one unit: guest time is already
        in user time and is not counted twice; idle and I/O wait are not busy."""

    def memory(self) -> tuple[int, int]:
        """(total, available) bytes of the machine's memory."""

    def rss(self) -> int:
        """This process's resident set, bytes."""

    def threads(self) -> int:
        """This process's OS threads (C-level ones included)."""


def process_cpu_seconds() -> float:
    """This process's CPU time, every thread, user and system (children excluded): what
    psutil's ``Process.cpu_times()`` reads from ``/proc/<pid>/stat``, from ``times(2)``."""
    t = os.times()
    return t.user + t.system


class ProcSource:
    """``/proc`` on Linux. Build it with :func:`proc_source`, which checks it can be read."""

    __slots__ = ("_page",)

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")

    def machine_times(self) -> tuple[float, float]:
        with open("/proc/stat", "rb") as f:
            # "cpu  user nice system idle iowait irq softirq steal guest guest_nice" (ticks)
            fields = [int(x) for x in f.readline().split()[1:]]
        fields += [0] * (10 - len(fields))  # older kernels lack the last columns
        total = sum(fields[:8])  # guest and guest_nice are already in user and nice
        return float(total - fields[3] - fields[4]), float(total)

    def memory(self) -> tuple[int, int]:
        total = available = -1
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemTotal:"):
                    total = int(line.split()[1]) * 1024
                elif line.startswith(b"MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                if total >= 0 and available >= 0:
                    return total, available
        raise OSError("/proc/meminfo has no MemTotal or MemAvailable (a kernel before 3.14)")

    def rss(self) -> int:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * self._page

    def threads(self) -> int:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Threads:"):
                    return int(line.split()[1])
        raise OSError("/proc/self/status has no Threads line")


class PsutilSource:
    """psutil, where ``/proc`` cannot be read (another OS, a sandbox without it)."""

    __slots__ = ("_pid", "_process", "_psutil")

    def __init__(self, psutil: Any) -> None:
        self._psutil = psutil
        self._pid = -1
        self._process: Any = None

    def _proc(self) -> Any:
        pid = os.getpid()
        if self._pid != pid:  # psutil.Process keeps the pid it was made with: new after a fork
            self._process, self._pid = self._psutil.Process(pid), pid
        return self._process

    def machine_times(self) -> tuple[float, float]:
        t = self._psutil.cpu_times()
        total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
        return total - t.idle - getattr(t, "iowait", 0.0), total

    def memory(self) -> tuple[int, int]:
        vm = self._psutil.virtual_memory()
        return int(vm.total), int(vm.available)

    def rss(self) -> int:
        return int(self._proc().memory_info().rss)

    def threads(self) -> int:
        return int(self._proc().num_threads())


def proc_source() -> ProcSource | None:
    """A :class:`ProcSource` if every file it reads can be read and parsed here, else None."""
    try:
        source = ProcSource()
        source.machine_times()
        source.memory()
        source.rss()
        source.threads()
    except (OSError, ValueError, IndexError):
        return None
    return source
