"""Thread mode (``SW_AGENT_REPORTER_PROCESS=false``) and a program that closes every descriptor
it did not open, then opens files of its own: they take the numbers the reporter thread's
event loop (its epoll and self-pipe) and gRPC had. Reuses the program of
``tests/test_process_edges.py`` (where process mode is tested with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ipc import Arena
from reporter_proc.intake import Intake
from reporter_proc.loop import Reporter
from reporter_proc.loopguard import DescriptorsLost
from reporter_proc.plumbing import _run_loop
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from tests import test_process_edges as edges
from tests.collector import Collector
from tests.test_process_edges import CLOSES_ITS_FDS, _env, _swmp_run

pytestmark = pytest.mark.timeout(120)

collector = edges.collector  # the fixture

FILES = 64  # enough to take every number the agent had open in the program


def _run_the_program(tmp_path: Path, collector: Collector, ring: int, burst: int, **extra: str) -> Any:
    """``CLOSES_ITS_FDS`` under ``swmp run`` in thread mode, ``FILES`` files of its own opened
    after the close; checked: it exited cleanly and each of its files holds what it wrote."""
    script = tmp_path / "closes_fds.py"
    script.write_text(CLOSES_ITS_FDS)
    env = _env(tmp_path, collector, SW_AGENT_RING_SIZE=str(ring), SW_AGENT_REPORTER_PROCESS="false", **extra)
    done = subprocess.run(
        _swmp_run(sys.executable, str(script), str(tmp_path), str(burst), str(FILES)),
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    contents = [(tmp_path / f"app{k}.log").read_bytes() for k in range(FILES)]
    assert contents == [b"".join(b"line %d\n" % i for i in range(5))] + [b""] * (FILES - 1)
    return done


def test_the_reporter_thread_never_closes_a_file_of_the_program(
    tmp_path: Path,
    collector: Collector,
) -> None:
    """Before, the reporter thread's loop failed on its closed epoll descriptor and, closing
    itself, closed its self-pipe's number: one of the program's files by then (the program's
    write or its check failed). Now the loop closes only descriptors that still name its own
    objects and abandons the others."""
    done = _run_the_program(tmp_path, collector, 65536, 60)
    # gRPC's sender cannot start again in this process: said once, with the way out.
    assert done.stderr.count("a new grpc sender cannot start in this process") == 1, done.stderr[-3000:]
    assert "SW_AGENT_REPORTER_PROCESS=true" in done.stderr


@pytest.fixture
def http_collector() -> Iterator[Collector]:
    with Collector() as c:
        yield c


@pytest.mark.parametrize(("ring", "burst"), [(65536, 60), (4 << 20, 400)], ids=["doorbell", "room"])
def test_with_the_http_sender_a_new_reporter_delivers_what_is_recorded_after_the_close(
    tmp_path: Path, http_collector: Collector, ring: int, burst: int
) -> None:
    """Before, the reporter thread died with its loop and the records made after the close
    were never delivered (60 of 360, 400 of 2400). Now the handle starts a new reporter (new
    loop, new sender) and every segment arrives; the program's files stay intact. (With gRPC
    it cannot: see docs/reporter.md, Thread mode.)"""
    done = _run_the_program(
        tmp_path,
        http_collector,
        ring,
        burst,
        SW_AGENT_PROTOCOL="http",
        SW_AGENT_COLLECTOR_BACKEND_SERVICES=http_collector.http_address,
    )
    assert http_collector.wait_for(lambda: len(http_collector.segments) >= 6 * burst, 30), len(
        http_collector.segments
    )
    assert "starting a new reporter" in done.stderr  # logged once


def _loop_numbers() -> list[int]:
    """The descriptors of the running loop: its epoll, then its self-pipe's two ends."""
    loop = asyncio.get_running_loop()
    return [loop._selector._selector.fileno(), loop._ssock.fileno(), loop._csock.fileno()]  # type: ignore[attr-defined]


@pytest.mark.parametrize("taken_by", ["files", "an epoll"])
def test_a_loop_whose_descriptors_name_other_files_never_touches_them(tmp_path: Path, taken_by: str) -> None:
    """The application closes the loop's descriptors and its own files take their numbers (the
    epoll's: a file, or an epoll of its own). Before, the loop waited on the number (or failed,
    EINVAL) and closing it closed them; now it stops without using or closing any of them."""
    held: list[tuple[int, tuple[int, int]]] = []
    app_epoll = select.epoll()

    async def app_closes_our_descriptors() -> int:
        for k, number in enumerate(_loop_numbers()):
            if k == 0 and taken_by == "an epoll":
                mine = os.dup(app_epoll.fileno())
            else:
                mine = os.open(tmp_path / f"app{k}.log", os.O_WRONLY | os.O_CREAT, 0o600)
            os.dup2(mine, number)  # closes ours, the number is the application's now
            os.close(mine)
            st = os.fstat(number)
            held.append((number, (st.st_dev, st.st_ino)))
        await asyncio.sleep(0.01)  # the loop's next wait
        return 0

    with pytest.raises(OSError) as failed:  # before: EINVAL for a file; nothing for an epoll
        _run_loop(app_closes_our_descriptors(), guarded=True)
    try:
        for number, key in held:
            st = os.fstat(number)  # still open...
            assert (st.st_dev, st.st_ino) == key  # ...and still the application's
        for k in range(1 if taken_by == "an epoll" else 0, 3):
            assert (tmp_path / f"app{k}.log").read_bytes() == b""
    finally:
        for number, _ in held:
            with contextlib.suppress(OSError):
                os.close(number)
        app_epoll.close()
    assert isinstance(failed.value, DescriptorsLost)  # what the reporter thread says it was


def test_a_stop_from_another_thread_never_writes_into_a_socket_of_the_program() -> None:
    """``call_soon_threadsafe`` (how the handle's stop reaches the loop) writes a wake-up byte
    into the loop's self-pipe. Before, after the program had closed the loop's descriptors, it
    wrote that byte into whatever the number named: here one of the program's sockets, whose
    peer read a stray NUL. Now it writes only into the loop's own socket."""
    app, peer = socket.socketpair()
    peer.setblocking(False)

    async def app_takes_the_self_pipe_number() -> int:
        number = _loop_numbers()[2]  # the writing end
        os.dup2(app.fileno(), number)
        try:
            asyncio.get_running_loop().call_soon_threadsafe(lambda: None)  # a stop, say
        finally:
            os.dup2(_placeholder, number)
        return 0

    _placeholder = os.open(os.devnull, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            _run_loop(app_takes_the_self_pipe_number(), guarded=True)
        with pytest.raises(BlockingIOError):
            print(peer.recv(16))  # nothing was written to the program's socket
    finally:
        os.close(_placeholder)
        app.close()
        peer.close()


def test_a_reporter_whose_descriptors_are_closed_while_it_starts_never_closes_the_programs_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reporter thread still starting (its imports can take seconds on a busy machine) when
    the program closes everything: its spool's lock is open, its intake not yet registered.
    Before, registering the doorbell failed with EINVAL (the epoll's number named a file of
    the program), the reporter took that for an ordinary failure and ran its teardown, which
    closed the spool lock's number: one of the program's files by then. Now the registration
    raises DescriptorsLost and the reporter leaves without a teardown."""
    arena = Arena.create(str(tmp_path / "t.arena"), slots=2, ring_capacity=64 * 1024)
    settings = ReporterSettings(spool_dir=str(tmp_path / "spool"), shutdown_deadline_s=1.0)
    held: list[tuple[int, tuple[int, int]]] = []
    real_start = Intake.start

    def program_closes_everything(intake: Intake, loop: asyncio.AbstractEventLoop) -> None:
        spool = reporters[0].spool
        assert spool is not None
        for k, number in enumerate([*_loop_numbers(), spool._lock_fd]):
            mine = os.open(tmp_path / f"app{k}.log", os.O_WRONLY | os.O_CREAT, 0o600)
            os.dup2(mine, number)  # ours closed, the number the program's now
            os.close(mine)
            st = os.fstat(number)
            held.append((number, (st.st_dev, st.st_ino)))
        real_start(intake, loop)

    monkeypatch.setattr(Intake, "start", program_closes_everything)
    reporters = [Reporter(arena, settings, sender=MemorySender(), mode="thread")]
    try:
        with pytest.raises(OSError):
            _run_loop(reporters[0].run(), guarded=True)
        for number, key in held:
            st = os.fstat(number)  # still open...
            assert (st.st_dev, st.st_ino) == key  # ...and still the program's
    finally:
        for number, _ in held:
            with contextlib.suppress(OSError):
                os.close(number)
        arena.close()
