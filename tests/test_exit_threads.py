"""A thread-mode reporter on Python 3.12.0 / 3.12.1 while the program exits.

Those releases refuse to start a thread from the program's first exit hook on, and grpc.aio's
channel starts one: a program that recorded within ~0.1 s of its end, its reporter thread
still starting up, died by SIGSEGV (measured on 3.12.1, grpcio 1.85: ``swmp run -- python
prog.py`` in thread mode, every time). The reporter now asks before it starts its sender and
gives up with an error. The refusal is made here by a probe that cannot start (this
interpreter allows threads at exit); by hand on 3.12.1 the same program ends with status 0 and
the error line.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from ipc import Arena
from reporter_proc import exit_threads
from reporter_proc import records as R
from reporter_proc.exits import EXIT_ERROR
from reporter_proc.loop import Reporter
from reporter_proc.process import ReporterThread
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from tests.test_reporter_helpers import segment, spawn_writer

THIS_RELEASE = tuple(sys.version_info[:3])


class RefusedThread(threading.Thread):
    """What 3.12.0 and 3.12.1 do with a new thread once the exit has begun."""

    def start(self) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")


@pytest.fixture
def refusing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exit_threads, "REFUSING_RELEASES", (THIS_RELEASE,))
    monkeypatch.setattr(exit_threads, "threading", SimpleNamespace(Thread=RefusedThread))


@pytest.fixture
def arena(tmp_path: Any) -> Iterator[Arena]:
    a = Arena.create(str(tmp_path / "t.arena"), slots=4, ring_capacity=64 * 1024)
    yield a
    a.close()


def test_other_releases_never_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exit_threads, "REFUSING_RELEASES", ((3, 12, 0), (3, 12, 1)))
    monkeypatch.setattr(exit_threads, "threading", SimpleNamespace(Thread=RefusedThread))
    assert exit_threads.threads_refused() is (THIS_RELEASE in ((3, 12, 0), (3, 12, 1)))


def test_a_refusing_release_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exit_threads, "REFUSING_RELEASES", (THIS_RELEASE,))
    assert exit_threads.threads_refused() is False  # not exiting: the probe starts
    monkeypatch.setattr(exit_threads, "threading", SimpleNamespace(Thread=RefusedThread))
    assert exit_threads.threads_refused() is True


def test_the_reporter_thread_gives_up_with_an_error_instead_of_starting_its_sender(
    arena: Arena, refusing: None, caplog: pytest.LogCaptureFixture
) -> None:
    writer = spawn_writer(arena.path, [(R.SEGMENT, segment("late-0"))])
    writer.wait_written()
    assert writer.release() == 0
    sender = MemorySender()
    settings = ReporterSettings(flush_interval_s=0.02, poll_interval_s=0.02, shutdown_deadline_s=3.0)
    handle = ReporterThread(arena.path, settings, arena=arena, sender=sender)
    with caplog.at_level(logging.ERROR, logger="swmp.reporter"):
        handle.start()
        assert handle.stop(10)
    assert handle.exit_code == EXIT_ERROR
    assert not sender.started and sender.segments == []
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "the program is exiting" in errors[0] and "Process mode" in errors[0]


def test_the_process_mode_reporter_never_asks(arena: Arena, refusing: None) -> None:
    """Its process is not exiting when it starts; nothing there needs the probe."""
    sender = MemorySender()
    reporter = Reporter(arena, ReporterSettings(), sender=sender, mode="process")
    assert asyncio.run(reporter._start_sender()) is sender and sender.started
