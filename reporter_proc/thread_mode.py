"""The reporter on a daemon thread of the application process (``SW_AGENT_REPORTER_PROCESS=false``):
the same reporter, its own event loop, no fork."""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import TYPE_CHECKING

from ipc import Arena
from reporter_proc.exits import EXIT_ERROR
from reporter_proc.plumbing import _run_loop
from reporter_proc.senders.base import Sender
from reporter_proc.settings import ReporterSettings

if TYPE_CHECKING:
    from reporter_proc.loop import Reporter

log = logging.getLogger("swmp.reporter")

# A reporter thread whose descriptors the application closed is replaced (new event loop, new
# sender, the reporter lock taken again) at most this many times, with the process
# supervisor's backoff. Only for senders measured to start again in such a process: gRPC
# keeps process-wide descriptors of its own (its completion queue's wake-up socket, its
# poller's epoll and eventfd) and a new channel failed on their numbers (docs/reporter.md,
# Thread mode); Kafka's was not measured.
RESTARTS_MAX = 5
RESTARTABLE = frozenset({"http"})


class ReporterThread:
    """Handle on a reporter running on a daemon thread of the application process."""

    def __init__(
        self,
        arena_path: str,
        settings: ReporterSettings,
        *,
        arena: Arena | None = None,
        sender: Sender | None = None,
    ) -> None:
        self.arena_path = arena_path
        self.settings = settings
        self.reporter: Reporter | None = None
        self.exit_code: int | None = None
        self._arena = arena
        self._sender = sender
        self._created = threading.Event()
        self._settled = threading.Event()  # set once the thread imports nothing more
        self._stop_reason = ""
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._main, name="swmp-reporter", daemon=True)

    def start(self) -> None:
        _importing.add(self)
        self._thread.start()
        self._created.wait(5.0)

    def _main(self) -> None:
        try:
            self._start_up_and_run()
        finally:
            self._settle()  # (a start-up that failed)

    def _settle(self) -> None:
        """This thread imports nothing more: the application's forks need not wait for it."""
        self._settled.set()
        _importing.discard(self)

    def _start_up_and_run(self) -> None:
        # Here, not at the top: loopguard needs asyncio, which the application may never
        # import (the agent imports this module in the application's processes).
        from reporter_proc.loopguard import DescriptorsLost  # noqa: PLC0415

        try:
            arena = self._arena
            if arena is None:
                # Deliberately never closed: closing any descriptor of the arena file would
                # drop this process's POSIX locks, including the ring slot its app holds.
                arena = Arena.open(self.arena_path)
            reporter = self._new_reporter(arena, 0)
        except Exception as exc:
            log.error("reporter thread cannot start: %s", exc)
            self.exit_code = EXIT_ERROR
            self._created.set()
            return
        self._created.set()
        if self._sender is None:
            _import_what_reporting_imports(self.settings)
        self._settle()
        delay = self.settings.restart_backoff_base_s
        for restarts in range(1, RESTARTS_MAX + 2):
            try:
                self.exit_code = _run_loop(reporter.run(), guarded=True)
                return
            except DescriptorsLost:
                # The application closed them (loopguard): its loop is abandoned, not closed.
                self.exit_code = EXIT_ERROR
                if not self._may_restart(restarts):
                    return
            except Exception:
                log.exception("reporter thread failed")
                self.exit_code = EXIT_ERROR
                return
            self._stopping.wait(delay)  # a stop cuts it short: the new reporter flushes
            delay = min(self.settings.restart_backoff_max_s, delay * 2)
            try:
                # Its reporter lock went with the closed descriptor: take it again.
                arena.release_reporter()
                reporter = self._new_reporter(arena, restarts)
            except Exception as exc:
                log.error("reporter thread cannot start again: %s", exc)
                return

    def _new_reporter(self, arena: Arena, restarts: int) -> Reporter:
        from reporter_proc.loop import Reporter  # noqa: PLC0415 (see the imports)

        reporter = Reporter(arena, self.settings, sender=self._sender, mode="thread", restarts=restarts)
        with self._lock:
            self.reporter = reporter
            if self._stop_reason:
                reporter.stop_threadsafe(self._stop_reason)
        return reporter

    def _may_restart(self, restarts: int) -> bool:
        """After the application closed the thread's descriptors: start a new reporter (new
        loop, new sender) where that works, and say so once either way."""
        protocol = self.settings.protocol
        works = self._sender is None and protocol in RESTARTABLE
        if restarts > RESTARTS_MAX or not works:
            why = (
                f"gave up after {RESTARTS_MAX} restarts"
                if works
                else f"a new {protocol} sender cannot start in this process"
                if protocol == "grpc"
                else f"not restarted with the {protocol} sender"
            )
            log.error(
                "the reporter thread stopped: the application closed its descriptors (as daemonizing "
                "code does: os.closerange), and %s; what is recorded from now on is not delivered. "
                "Process mode (SW_AGENT_REPORTER_PROCESS=true, the default) handles such programs",
                why,
            )
            return False
        if restarts == 1:
            log.warning(
                "the application closed the reporter thread's descriptors (as daemonizing code does: "
                "os.closerange): starting a new reporter (at most %d times)",
                RESTARTS_MAX,
            )
        return True

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> bool:
        """Flush and stop; True when the thread ended within ``timeout`` (default: the
        shutdown deadline plus a second)."""
        with self._lock:
            self._stop_reason = "stop"
            self._stopping.set()
            if self.reporter is not None:
                self.reporter.stop_threadsafe("stop")
        if timeout is None:
            timeout = self.settings.shutdown_deadline_s + 1.0
        if self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _at_exit(self) -> None:
        if self._thread.is_alive():
            self.stop(self.settings.shutdown_deadline_s + 1.0)


# Reporter threads still importing what they need: a fork in the application waits for them.
# Why: a module such a thread is still importing when the application forks stays locked in
# the child for good (importlib's per-module locks are not reset at fork), and the child hangs
# at its first import of it. Seen: a program that recorded and then daemonized at once, its
# daemon hanging on ``import grpc`` as the agent started there anew; and any child importing
# grpc within ~0.1 s of its parent's first record.
_importing: set[ReporterThread] = set()
SETTLE_WAIT_S = 5.0  # at most this long, once: the imports take ~0.1 s (seconds when busy)


def _wait_for_imports_before_fork() -> None:
    try:
        for handle in list(_importing):
            if handle._thread is not threading.current_thread():
                handle._settled.wait(SETTLE_WAIT_S)
    except Exception:
        pass  # never into the application's fork


os.register_at_fork(before=_wait_for_imports_before_fork, after_in_child=_importing.clear)


def _import_what_reporting_imports(settings: ReporterSettings) -> None:
    """Import the modules the reporter imports as it starts (its sender's client library, the
    instance properties' psutil) at once, so that the thread imports nothing afterwards and a
    fork waits only this long (see ``_importing``). tests/test_thread_mode_imports.py checks
    that nothing is left for later."""
    from reporter_proc.instances import host_properties  # noqa: PLC0415
    from reporter_proc.senders import import_sender  # noqa: PLC0415

    try:
        import_sender(settings.protocol)
    except Exception:
        pass  # the reporter says why when it makes the sender
    host_properties()


def start_reporter_thread(
    arena_path: str,
    settings: ReporterSettings,
    *,
    arena: Arena | None = None,
    sender: Sender | None = None,
) -> ReporterThread:
    """Run the reporter on a daemon thread with its own event loop (no fork).

    Flushes at interpreter exit (atexit) within the shutdown deadline. ``arena`` lets the
    caller share its own Arena object; ``sender`` overrides the protocol (tests).
    """
    # gRPC core's own fork handlers (on by default) resume its pollers in every child the
    # application forks while this thread's channel is busy: a helper forked then (uWSGI,
    # subprocess with preexec_fn) aborted in epoll_wait on a descriptor subprocess had
    # closed. No child ever uses this channel, so the handlers buy nothing; an explicit
    # setting of the application wins. Read by gRPC when it initializes, on first use.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    handle = ReporterThread(arena_path, settings, arena=arena, sender=sender)
    handle.start()
    atexit.register(handle._at_exit)
    return handle
