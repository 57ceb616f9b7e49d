"""The reporter's lifecycle: the stop state every part consults, and the owner watch.

:class:`StopState` is the one place that knows whether the reporter is stopping and by when
it must be done; delivery shortens its retries by it, intake stops reading at its drain
deadline. :class:`OwnerWatch` notices the death of the process that owns the application
(a pidfd when the kernel has one, polling otherwise), which is what ends a reporter process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import time
from collections.abc import Callable

from ipc import Arena, process_alive, process_start_ticks
from reporter_proc.plumbing import release_std_pipes

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
            # Enabled in process mode only: a reporter thread's process is the owner itself.
            release_std_pipes(self.owner_pid, announce=True)
        self._on_died()

    def close(self) -> None:
        self._fd = close_pidfd(self._loop, self._fd)

    def gone_now(self) -> bool:
        """Is the owner gone? Without waiting (see :meth:`gone`)."""
        return self.dead or (self.enabled and not process_alive(self.owner_pid, 0))

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


class SupervisorWatch:
    """Replaces the supervisor if it dies while the application runs (process mode).

    Without it, a SIGKILLed supervisor leaves nobody to restart the next reporter that dies.
    The reporter watches its supervisor (pidfd; polling through :meth:`poll` otherwise) and,
    unless it is stopping or the owner is gone, starts a replacement that adopts it
    (``respawn()`` returns the new pid), after a backoff that doubles while they keep dying.
    """

    def __init__(
        self,
        pid: int,
        *,
        respawn: Callable[[], int],
        wanted: Callable[[], bool],
        backoff_s: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        self.pid = pid  # the supervisor being watched (0: none, not supervised)
        self.start_ticks = process_start_ticks(pid) if pid > 0 else 0
        self.replaced = 0
        self.missing_since = 0.0  # monotonic; 0 while the supervisor lives
        self._respawn = respawn
        self._wanted = wanted
        self._base, self._max = backoff_s
        self._delay = self._base
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._watch()

    def _watch(self) -> None:
        if self.pid <= 0 or self._loop is None:
            return
        try:
            self._fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            self._gone()
            return
        except (OSError, AttributeError):
            return  # old kernel: poll() notices
        if not process_alive(self.pid, self.start_ticks):  # reused pid, or gone meanwhile
            self._gone()
            return
        self._loop.add_reader(self._fd, self._gone)

    def poll(self) -> None:
        """Without a pidfd: the status task calls this about once a second."""
        if self._fd < 0 and self.pid > 0 and not self.missing_since and not self._running():
            self._gone()

    def _running(self) -> bool:
        return process_alive(self.pid, self.start_ticks) and not zombie(self.pid)

    def _gone(self) -> None:
        self.close()
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(self.pid, os.WNOHANG)  # a replacement is our child: reap it
        if self.missing_since:
            return
        self.missing_since = time.monotonic()
        if not self._wanted():
            return  # stopping, or the owner is gone: nothing left to supervise
        log.warning("supervisor %d is gone; starting a new one in %.1f s", self.pid, self._delay)
        if self._loop is not None:
            self._pending = self._loop.call_later(self._delay, self._replace)
        self._delay = min(self._max, self._delay * 2)

    def _replace(self) -> None:
        self._pending = None
        if not self._wanted():
            return
        try:
            pid = self._respawn()
        except Exception as exc:
            log.error("cannot start a new supervisor: %r; the reporter runs unsupervised", exc)
            return
        self.pid, self.start_ticks = pid, process_start_ticks(pid)
        self.replaced += 1
        self.missing_since = 0.0
        log.info("supervisor %d now supervises this reporter", pid)
        self._watch()

    def info(self) -> dict[str, int]:
        """For the status document: ``swmp health`` checks that this pid is alive."""
        return {"pid": self.pid, "start_ticks": self.start_ticks, "replaced": self.replaced}

    def close(self) -> None:
        self._fd = close_pidfd(self._loop, self._fd)

    def stop(self) -> None:
        """The reporter is ending: no replacement any more."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        self.close()


def close_pidfd(loop: asyncio.AbstractEventLoop | None, fd: int) -> int:
    """Stop watching and close a pidfd (if open); returns -1, the "no pidfd" value."""
    if fd >= 0:
        if loop is not None:
            loop.remove_reader(fd)
        os.close(fd)
    return -1


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
