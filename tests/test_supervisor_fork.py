"""The supervisor when the system cannot fork (EAGAIN, ENOMEM): it stays and tries again.

A failed fork used to end the supervisor, so a reporter that crashed while the host was out
of processes was never replaced. The supervisor's pauses are faked (recorded, not slept), so
these tests wait for nothing.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
from collections.abc import Callable, Iterator

import pytest

from reporter_proc.exits import EXIT_OK
from reporter_proc.settings import ReporterSettings
from reporter_proc.supervisor import Supervisor

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
ForkReporter = Callable[[str, ReporterSettings, int, int, tuple[int, ...]], int]


@pytest.fixture(autouse=True)
def _signals_restored() -> Iterator[None]:
    """Supervisor.run installs its handlers and wake-up fd in this (the test) process."""
    handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    yield
    signal.set_wakeup_fd(wakeup)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def _close(sup: Supervisor) -> None:
    for fd in (sup._wake_r, sup._wake_w, sup._owner_fd):
        if fd >= 0:
            os.close(fd)


def _fork_failing(times: int, attempts: list[int]) -> ForkReporter:
    def fork_reporter(
        arena_path: str, settings: ReporterSettings, owner_pid: int, restarts: int, close_fds: tuple[int, ...]
    ) -> int:
        attempts.append(restarts)
        if len(attempts) <= times:
            raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        pid = os.fork()
        if pid == 0:
            os._exit(EXIT_OK)  # a reporter that ends on purpose: the supervisor is done then
        return pid

    return fork_reporter


def test_a_failed_fork_is_retried_with_a_capped_backoff_until_it_succeeds(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[int] = []
    settings = ReporterSettings(restart_backoff_base_s=0.5, restart_backoff_max_s=2.0)
    sup = Supervisor("/nonexistent.arena", settings, os.getpid(), fork_reporter=_fork_failing(4, attempts))
    pauses: list[float] = []
    monkeypatch.setattr(sup, "_pause", pauses.append)  # the fake clock: pauses are recorded
    try:
        with caplog.at_level(logging.WARNING, logger="swmp.reporter"):
            assert sup.run() == EXIT_OK
    finally:
        _close(sup)
    assert len(attempts) == 5  # four failures, then the reporter
    assert pauses == [0.5, 1.0, 2.0, 2.0]
    assert sup.restarts == 0 and sup.fork_failures == 0  # no reporter died: no restart
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot fork a reporter" in m for m in messages) == 1, messages  # once per outage
    assert any("forked a reporter after 4 failed attempts" in m for m in messages), messages


def test_a_supervisor_whose_owner_is_gone_stops_trying_to_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    owner = os.fork()
    if owner == 0:
        os._exit(0)
    os.waitpid(owner, 0)  # the application is gone
    attempts: list[int] = []
    sup = Supervisor(
        "/nonexistent.arena", ReporterSettings(), owner, fork_reporter=_fork_failing(1_000, attempts)
    )
    pauses: list[float] = []
    monkeypatch.setattr(sup, "_pause", pauses.append)  # the fake clock: pauses are recorded
    try:
        assert sup.run() == EXIT_OK
    finally:
        _close(sup)
    assert len(attempts) == 1 and pauses == []
