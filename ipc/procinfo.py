"""Who is alive: a process's start time (so a reused pid is not mistaken for the old
process) and when the machine booted. Read from /proc; no SkyWalking, no arena."""

from __future__ import annotations


def _stat_fields(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` from field 3 (the state) on; None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return data[data.rfind(b")") + 2 :].split()


def process_start_ticks(pid: int) -> int:
    """Start time of ``pid`` in clock ticks since boot, or 0 if it does not exist."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields is not None else 0
    except (IndexError, ValueError):
        return 0


def process_exited(pid: int) -> bool:
    """Is ``pid`` no process, or one that exited and waits for its parent to reap it (a
    zombie: its locks are gone and it runs no code)? A worker of a ``forkserver`` pool is
    reaped by the fork server whenever it gets to it, after ``Pool.terminate()`` returned."""
    fields = _stat_fields(pid)
    return fields is None or fields[:1] in ([b"Z"], [b"X"])


def process_alive(pid: int, start_ticks: int) -> bool:
    if pid <= 0:
        return False
    ticks = process_start_ticks(pid)
    return ticks != 0 and start_ticks in (0, ticks)


def boot_time_ns() -> int:
    """When this machine booted (wall clock), or 0 if unknown."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return int(line.split()[1]) * 1_000_000_000
    except (OSError, ValueError, IndexError):
        pass
    return 0
