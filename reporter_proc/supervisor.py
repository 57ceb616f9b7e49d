"""The reporter's supervisor: a tiny process between the application and the reporter.

It forks the reporter, restarts it with exponential backoff when it dies abnormally (never
for a configuration error, exit status 78), forwards stop signals, and gives a reporter
that is draining after the owner's death its full deadline before killing it. Once the owner
is gone it lets go of the standard output and error it inherited where they are pipes (see
``plumbing.release_std_pipes``), as the reporter does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import time
from collections.abc import Callable

from ipc import process_alive
from reporter_proc.exits import EXIT_CONFIG, EXIT_ERROR, EXIT_OK
from reporter_proc.plumbing import release_std_pipes
from reporter_proc.settings import ReporterSettings

log = logging.getLogger("swmp.reporter")

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


class Supervisor:
    """Restarts a reporter that died abnormally, with backoff; ends with the owner.

    ``fork_reporter(arena_path, settings, owner_pid, restarts, close_fds)`` forks one
    reporter process and returns its pid.
    """

    def __init__(
        self,
        arena_path: str,
        settings: ReporterSettings,
        owner_pid: int,
        *,
        fork_reporter: Callable[[str, ReporterSettings, int, int, tuple[int, ...]], int],
        adopt: int = 0,
        still_reporter: Callable[[int], bool] | None = None,
    ) -> None:
        self._fork_reporter = fork_reporter
        # A replacement supervisor (the previous one was killed) starts by watching the
        # reporter that started it, which is not its child: no exit status to wait for, so
        # ``still_reporter(pid)`` (does the arena still name that pid as its reporter?) tells
        # a death (the role was never given back) from a clean exit.
        self._adopt = adopt
        self._still_reporter = still_reporter
        self.arena_path = arena_path
        self.settings = settings
        self.owner_pid = owner_pid
        self.stop_signal = 0
        self.owner_dead = False
        self.restarts = 0
        self.fork_failures = 0  # consecutive forks of a reporter that failed (EAGAIN, ENOMEM)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._owner_fd = -1

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stop_signal = signum

    def _owner_gone(self) -> None:
        if not self.owner_dead:
            self.owner_dead = True
            release_std_pipes(self.owner_pid, announce=False)  # the reporter says it

    def run(self) -> int:
        for sig in _STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.set_wakeup_fd(self._wake_w)  # a signal wakes select()
        try:
            self._owner_fd = os.pidfd_open(self.owner_pid)
        except ProcessLookupError:
            self._owner_gone()
        except OSError:
            self._owner_fd = -1  # no pidfd: poll the owner below
        s = self.settings
        delay = s.restart_backoff_base_s
        fork_delay = s.restart_backoff_base_s
        while True:
            if self.stop_signal:
                return EXIT_OK
            started = time.monotonic()
            if self._adopt:
                pid, self._adopt = self._adopt, 0
                code = self._wait(pid, child=False)
            else:
                pid = self._fork()
                if pid < 0:
                    # No reporter exists and nothing else would start one: try again, with
                    # a capped backoff, for as long as the application lives.
                    if self.stop_signal or self.owner_dead or not self._owner_alive():
                        return EXIT_OK
                    self._pause(fork_delay)
                    fork_delay = min(s.restart_backoff_max_s, fork_delay * 2)
                    continue
                fork_delay = s.restart_backoff_base_s
                code = self._wait(pid)
            if self.stop_signal or self.owner_dead or not self._owner_alive():
                return EXIT_OK
            if code == EXIT_OK:
                return EXIT_OK  # it finished on purpose (another reporter owns the arena...)
            if code == EXIT_CONFIG:
                log.error("reporter cannot run with these settings; not restarting it")
                return EXIT_CONFIG
            if time.monotonic() - started >= s.restart_stable_s:
                delay = s.restart_backoff_base_s
            self.restarts += 1
            log.warning(
                "reporter %d died (%s); restart %d in %.1f s", pid, _describe(code), self.restarts, delay
            )
            self._pause(delay)
            delay = min(s.restart_backoff_max_s, delay * 2)

    def _fork(self) -> int:
        """A new reporter's pid, or -1 when the system cannot fork now (out of processes or
        memory): a failure that passes, which once ended the supervisor, leaving the
        application without a reporter for good. Logged once per such outage."""
        try:
            pid = self._fork_reporter(
                self.arena_path, self.settings, self.owner_pid, self.restarts, (self._wake_r, self._wake_w)
            )
        except OSError as exc:
            self.fork_failures += 1
            if self.fork_failures == 1:
                log.error("cannot fork a reporter (%s); trying again until it can", exc)
            return -1
        if self.fork_failures:
            log.warning("forked a reporter after %d failed attempts", self.fork_failures)
            self.fork_failures = 0
        return pid

    def _owner_alive(self) -> bool:
        return process_alive(self.owner_pid, 0)

    def _drain_wake(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self._wake_r, 512):
                pass

    def _pause(self, seconds: float) -> None:
        """Sleep, but wake for a stop signal or the owner's death."""
        end = time.monotonic() + seconds
        while not self.stop_signal and not self.owner_dead:
            left = end - time.monotonic()
            if left <= 0:
                return
            fds = [self._wake_r] + ([self._owner_fd] if self._owner_fd >= 0 else [])
            ready, _, _ = select.select(fds, [], [], min(left, 1.0))
            self._drain_wake()
            if self._owner_fd in ready or (self._owner_fd < 0 and not self._owner_alive()):
                self._owner_gone()

    def _adopted_exit(self, pid: int) -> int:
        """Exit status of an adopted reporter (not our child), as far as the arena tells."""
        try:
            died = self._still_reporter is not None and self._still_reporter(pid)
        except Exception:  # arena gone or unreadable: the application ended
            died = False
        return EXIT_ERROR if died else EXIT_OK

    def _wait(self, pid: int, *, child: bool = True) -> int:
        """Wait for the reporter to exit, forwarding stop signals; returns its exit code
        (negative: killed by that signal). ``child=False``: an adopted reporter."""
        try:
            child_fd = os.pidfd_open(pid)
        except OSError:
            child_fd = -1
        grace = self.settings.shutdown_deadline_s + 3.0
        kill_at = 0.0
        forwarded = False
        try:
            while True:
                fds = [self._wake_r]
                if child_fd >= 0:
                    fds.append(child_fd)
                if self._owner_fd >= 0 and not self.owner_dead:
                    fds.append(self._owner_fd)
                timeout = 1.0 if child_fd < 0 else None
                if kill_at:
                    timeout = max(0.0, min(timeout or 1.0, kill_at - time.monotonic()))
                try:
                    ready, _, _ = select.select(fds, [], [], timeout)
                except InterruptedError:
                    ready = []
                self._drain_wake()
                if self.stop_signal and not forwarded:
                    forwarded = True
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
                    kill_at = time.monotonic() + grace
                if not self.owner_dead and (
                    (self._owner_fd >= 0 and self._owner_fd in ready)
                    or (self._owner_fd < 0 and not self._owner_alive())
                ):
                    # The reporter watches the owner too and is draining; give it its deadline.
                    self._owner_gone()
                    kill_at = kill_at or time.monotonic() + grace
                if not child:
                    if (child_fd >= 0 and child_fd in ready) or (child_fd < 0 and not process_alive(pid, 0)):
                        return self._adopted_exit(pid)
                else:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        return os.waitstatus_to_exitcode(status)
                if kill_at and time.monotonic() >= kill_at:
                    log.error("reporter %d missed its shutdown deadline; killing it", pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    kill_at = 0.0
                    if not child:
                        return EXIT_ERROR
                    _, status = os.waitpid(pid, 0)
                    return os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            return EXIT_ERROR
        finally:
            if child_fd >= 0:
                os.close(child_fd)


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
