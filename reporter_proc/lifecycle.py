"""The reporter's lifecycle: the stop state every part consults, and the owner watch.

:class:`StopState` is the one place that knows whether the reporter is stopping and by when
it must be done; delivery shortens its retries by it, intake stops reading at its drain
deadline. :class:`OwnerWatch` notices the death of the process that owns the application
(a pidfd when the kernel has one, polling otherwise), which is what ends a reporter process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import time
from collections.abc import Callable

from ipc import Arena, process_alive

log = logging.getLogger("swmp.reporter")


class StopState:
    def __init__(self) -> None:
        self.stopping = False
        self.closing = False  # the drain is over: senders finish their queues and return
        self.reason = ""
        self.deadline = 0.0  # monotonic: everything is done by then
        self.drain_deadline = 0.0  # monotonic: reading the rings ends by then
        # Wait for the application to finish before calling the rings drained: a stop signal
        # sent to the whole process group (systemd's KillMode=control-group, Ctrl-C) reaches
        # us while workers still finish their in-flight requests and write their records.
        self.wait_for_workers = False

    def begin(self, reason: str, deadline_s: float, *, wait_for_workers: bool = False) -> bool:
        """Start stopping; False when already stopping."""
        if self.stopping:
            return False
        self.stopping = True
        self.wait_for_workers = wait_for_workers
        self.reason = reason
        now = time.monotonic()
        deadline_s = max(0.0, deadline_s)
        self.deadline = now + deadline_s
        # Most of the budget is for draining; the rest is for sending what is in flight.
        self.drain_deadline = now + 0.7 * deadline_s
        return True

    def past_deadline(self, now: float | None = None) -> bool:
        return self.stopping and (time.monotonic() if now is None else now) >= self.deadline

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


class OwnerWatch:
    """Calls ``on_died`` once when the owner process is gone (process mode only)."""

    def __init__(self, arena: Arena, owner_pid: int, enabled: bool, on_died: Callable[[], None]) -> None:
        self.arena = arena
        self.owner_pid = owner_pid
        self.enabled = enabled and owner_pid > 0
        self.dead = False
        self._on_died = on_died
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.enabled:
            return
        self._loop = loop
        info = self.arena.info()
        ticks = info.owner_start_ticks if info.owner_pid == self.owner_pid else 0
        if not process_alive(self.owner_pid, ticks):
            self._died()
            return
        try:
            self._fd = os.pidfd_open(self.owner_pid)
        except ProcessLookupError:
            self._died()
            return
        except (OSError, AttributeError) as exc:  # old kernel: fall back to polling (see poll)
            log.warning("pidfd_open(%d) failed (%s); watching the owner by polling", self.owner_pid, exc)
            return
        loop.add_reader(self._fd, self._died)

    def poll(self) -> None:
        """Without a pidfd (old kernel): the status task calls this about once a second."""
        if self._fd < 0 and self.enabled and not self.dead and not process_alive(self.owner_pid, 0):
            self._died()

    def _died(self) -> None:
        self.close()
        if not self.dead:
            self.dead = True
            log.info("owner process %d is gone", self.owner_pid)
        self._on_died()

    def close(self) -> None:
        if self._fd >= 0:
            if self._loop is not None:
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def gone(self) -> bool:
        """Is the owner dead (or dying)? Decides whether we are the last one out.

        When the owner dies, the kernel sends our supervisor its PDEATHSIG (forwarded to
        us as SIGTERM) a moment *before* the owner turns into a zombie and its pidfd fires;
        on a busy machine this reporter can finish its flush inside that moment. If our
        process chain no longer leads to the owner, it is dying: wait for the pidfd briefly.
        """
        if self.dead:
            return True
        if self._fd >= 0:
            # A leader that already exited while other threads of its process are still being
            # torn down (a gevent or daemon thread killed by exit_group) shows as a zombie
            # before the pidfd fires and before we are reparented (seen with celery -P gevent).
            wait = 1.0 if self._chain_broken() or zombie(self.owner_pid) else 0.0
            ready, _, _ = select.select([self._fd], [], [], wait)
            return bool(ready)
        return not process_alive(self.owner_pid, 0)

    def _chain_broken(self) -> bool:
        ppid = os.getppid()
        return ppid != self.owner_pid and parent_of(ppid) != self.owner_pid


def _stat(pid: int) -> bytes:
    """``/proc/<pid>/stat`` after the command name (which may contain spaces and parens)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rfind(b")") + 2 :]


def zombie(pid: int) -> bool:
    try:
        return _stat(pid)[:1] in (b"Z", b"X")
    except OSError:
        return False


def parent_of(pid: int) -> int:
    try:
        return int(_stat(pid).split()[1])
    except (OSError, ValueError, IndexError):
        return 0
