"""Thread mode's sink (``SW_AGENT_REPORTER_PROCESS=false``): a private one-slot arena and a
reporter thread per process that reports.

What it shares with process mode (one claim per process, the announce, the re-stamp, the
leave, dropping and counting where there is no ring) is ``swmp._runtime.ProcessSink``. The
application's shared arena is only a *registry* here: its slot locks number the processes
(``<base>-w<slot>``), its rings stay empty, and its header counts what no ring took (helpers,
the master, a process that could not start reporting), where ``swmp status`` reads it.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any

from ipc import Arena, RingWriter, still_linked
from ipc.private import private_directory
from reporter_proc.settings import ReporterSettings
from swmp._runtime import ProcessSink, header_counts

__all__ = ["ThreadSink", "ThreadStarter"]

log = logging.getLogger("swmp.agent")

# How long past its shutdown deadline a reporter thread is waited for at a process's exit
# (ReporterThread.stop's own default wait is the deadline plus the same): one that is not
# done by then leaves its private arena for the next process (see _release).
STOP_GRACE_S = 1.0

ThreadStarter = Callable[[str, ReporterSettings, Arena], Any]


class ThreadSink(ProcessSink):
    """Thread mode: a private one-slot arena and a reporter thread per process.

    ``registry`` is the application's shared arena, used for its slot locks (the instance
    name) and its header's drop counters; its rings stay empty. ``start_thread(path,
    settings, arena)`` returns a handle with ``stop(timeout)``
    (``reporter_proc.process.start_reporter_thread``).
    """

    def __init__(
        self,
        registry: Arena | None,
        settings: ReporterSettings,
        start_thread: ThreadStarter,
        *,
        arena_dir: str,
        ring_capacity: int,
        meta: bytes,
        service: str,
        instance_base: str,
        namespace: str = "",
        properties: dict[str, str] | None = None,
        owner_pid: int = 0,
        on_started: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(
            service, instance_base, namespace=namespace, properties=properties, owner_pid=owner_pid
        )
        self.on_started = on_started  # called in each process once its reporter thread runs
        self.registry = registry
        self.settings = settings
        self._start_thread = start_thread
        self._arena_dir = arena_dir
        self._ring_capacity = ring_capacity
        self._meta = meta
        self.private: Arena | None = None
        self.handle: Any = None
        self._private_pid = -1

    def _attach(self, pid: int) -> tuple[RingWriter, int] | None:
        slot = self._claim_name(pid)
        try:
            return self._start_reporting(pid, slot)
        except BaseException:
            # Give back what this attempt took: the caller retries later, and every attempt
            # that kept a name slot (or left a private arena behind) would use one up.
            self._give_back(slot)
            raise

    def _claim_name(self, pid: int) -> int:
        """A slot of the registry, held for the instance name (never written); -1 if none."""
        if self.registry is None:
            return -1
        name_writer = self.registry.claim_slot()
        if name_writer is not None:
            return name_writer.slot
        self._warn_once(
            "full", "swmp: no free name slot in %s; process %d is named by its pid", self.registry.path, pid
        )
        return -1

    def _start_reporting(self, pid: int, slot: int) -> tuple[RingWriter, int] | None:
        # A fresh name per process: a pid can come back (uWSGI re-exec keeps the master's).
        name = f"swmp-{os.getuid()}-{pid}-t{uuid.uuid4().hex[:8]}.arena"
        base = os.path.join(private_directory(self._arena_dir), name)  # 0700, ours (ipc.private)
        arena = Arena.create(base, slots=1, ring_capacity=self._ring_capacity, meta=self._meta, owner_pid=pid)
        self.private = arena
        self._private_pid = pid
        writer = arena.claim_slot()
        if writer is None:  # cannot happen on a fresh one-slot arena; be explicit anyway
            self._give_back(slot)
            return None
        # The reporter shares our Arena object: a second descriptor of the file, once
        # closed, would drop this process's lock on the slot.
        _check_uwsgi_threads()
        self.handle = self._start_thread(base, self.settings, arena)
        if self.on_started is not None:
            self.on_started()
        self._name_and_announce(writer, pid, slot)
        return writer, slot

    def _give_back(self, slot: int) -> None:
        """Undo a failed attach: the thread, the private arena, the name slot. Never raises."""
        handle, arena = self.handle, self.private
        self.handle = None
        self.private = None
        stopped = True
        try:
            if handle is not None:
                stopped = bool(handle.stop(1.0))  # it has nothing to send yet
            if arena is not None:
                arena.unlink()
                if stopped:  # a thread still running may still read the mapping
                    arena.close()
            if slot >= 0 and self.registry is not None:
                self.registry.release_slot(slot)
        except Exception:
            log.debug("swmp: undoing a failed attach failed", exc_info=True)

    def _release(self, timeout: float) -> None:
        handle, arena = self.handle, self.private
        self.handle = None
        self.private = None
        if arena is not None and self._private_pid == os.getpid():
            # Its writer refuses (and counts, ``stale``) from now on: nothing reads the ring
            # after the flush below, so a record written there later (a thread that took the
            # writer just before) would be lost uncounted.
            arena.release_slot()
        stopped = True
        if handle is not None and self._private_pid == os.getpid():
            try:
                # Flushes what is in the ring, WORKER_STOP included. ``timeout`` is the thread's
                # own deadline too: its loop's last turn and its exit take a little longer.
                stopped = bool(handle.stop(timeout + STOP_GRACE_S))
            except Exception:
                stopped = False
                log.debug("reporter thread stop failed", exc_info=True)
        if arena is not None and stopped:
            arena.unlink()
        elif arena is not None:
            # A thread still sending past the deadline has not committed the rest: the file
            # stays, and the next process of this application to report adopts and delivers
            # what is unread (ipc.adopt; at least once: some of it may arrive twice).
            log.warning(
                "swmp: the reporter thread did not finish within %.1f s; %s is left for the next "
                "process to deliver",
                timeout + STOP_GRACE_S,
                arena.path,
            )
        if self.registry is not None:
            self.registry.release_slot()

    def _publish(self, counts: dict[str, int]) -> bool:
        # The registry is the one file every process of the application shares: the private
        # arenas belong to processes that report, and these counts are of those that do not.
        # The owner removes it at its goodbye: its own later drops (and those of a process
        # outliving it) then stay with the sink, which reports them at exit.
        registry = self.registry
        if registry is None or not still_linked(registry):
            return False
        registry.add_counts(header_counts(counts))
        return True

    def report_arena(self) -> Arena | None:
        """This process's private arena: its reporter thread posts profile tasks there."""
        return self.private if self._private_pid == os.getpid() else None


def _check_uwsgi_threads() -> None:
    """The reporter thread needs Python threads, which uWSGI before 2.0.26 left off by default."""
    uwsgi = sys.modules.get("uwsgi")
    if uwsgi is not None and not getattr(uwsgi, "has_threads", True):
        log.error(
            "swmp: SW_AGENT_REPORTER_PROCESS=false runs a reporter thread, but this uWSGI has Python "
            "threads disabled: add --enable-threads (or use the reporter process, the default)"
        )
