"""The per-process sinks (``swmp._runtime``) and where the agent thinks it runs (``swmp.agent``).

No servers here: real arenas in a temporary directory, real forks, a reporter thread with
the in-memory sender.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ipc import Arena
from reporter_proc import records as R
from reporter_proc.process import start_reporter_thread
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from swmp import _server_position, _spawned, agent, lifecycle
from swmp._arena_sink import ArenaSink
from swmp._runtime import prefork_master, worker_instance_name
from swmp._thread_sink import ThreadSink
from swmp.tracing.identity import identity
from tests.slot_holder import SlotHolder


@pytest.fixture(autouse=True)
def _keep_identity() -> Iterator[None]:
    before = (identity.service, identity.instance)
    yield
    identity.set(*before)


@pytest.fixture
def arena(tmp_path: Path) -> Iterator[Arena]:
    a = Arena.create(str(tmp_path / "t.arena"), slots=4, ring_capacity=1 << 16)
    yield a
    a.close()


def read_all(arena: Arena, slot: int) -> list[tuple[int, list[Any]]]:
    return [(t, orjson.loads(p)) for t, p in arena.reader(slot).read(10_000)]


def segment(instance: str, op: str = "/x") -> bytes:
    span = [0, -1, 1, 2, op, "", 0, 3, 7001, False, False, [], [], []]
    return orjson.dumps(["trace", "seg", "svc", instance, False, [span]])


def sink_for(arena: Arena, **kw: Any) -> ArenaSink:
    # owner_pid: our parent, so this process is never taken for a prefork master.
    return ArenaSink(arena, "svc", "base", owner_pid=os.getppid(), **kw)


# -- process mode ----------------------------------------------------------------------------
def test_first_write_claims_a_slot_and_announces_the_instance(arena: Arena) -> None:
    sink = sink_for(arena, namespace="ns", properties={"team": "blue"})
    assert sink.slot is None
    assert sink.write(R.SEGMENT, segment("whatever"))
    assert sink.slot == 0 and sink.role == "worker"
    assert identity.instance == worker_instance_name("base", 0) == "base-w0"
    (t1, start), (t2, seg) = read_all(arena, 0)
    assert (t1, t2) == (R.WORKER_START, R.SEGMENT)
    pid, slot, service, instance, flat, layer, namespace = start
    assert (pid, slot, service, instance, layer, namespace) == (os.getpid(), 0, "svc", "base-w0", "", "ns")
    props = dict(zip(flat[::2], flat[1::2], strict=True))
    assert props["Process No."] == str(os.getpid()) and props["slot"] == "0"
    assert props["team"] == "blue" and props["namespace"] == "ns" and props["language"] == "python"
    # The record was built before this process had its name: it is re-stamped.
    assert seg[R.SEG_INSTANCE] == "base-w0"


def child_writes(sink: Any, expected_slot: int) -> int:
    """Fork a server worker that writes one segment through ``sink``; assert it wrote into
    ``expected_slot``; the child's pid."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            # Forked by a reporting process: a helper unless a server hook says it is a
            # worker (as Celery's worker_process_init does); helpers: tests/test_fork_children.py
            lifecycle.declare_server_worker()
            ok = sink.write(R.SEGMENT, segment(identity.instance, "/child"))
            os.write(w, b"1" if ok and sink.slot == expected_slot else b"0")
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.close(r)
    os.waitpid(pid, 0)
    return pid


def test_a_forked_child_without_hooks_takes_its_own_slot_and_restamps(arena: Arena) -> None:
    sink = sink_for(arena)
    assert sink.write(R.SEGMENT, segment("base-w0"))
    # No agent hook registered here: the per-write pid check must notice.
    pid = child_writes(sink, expected_slot=1)
    (t1, start), (t2, seg) = read_all(arena, 1)
    assert (t1, t2) == (R.WORKER_START, R.SEGMENT)
    assert start[0] == pid and start[3] == "base-w1"
    assert seg[R.SEG_INSTANCE] == "base-w1"  # re-stamped: it was built with the parent's name
    assert seg[R.SEG_SPANS][0][R.SPAN_OPERATION] == "/child"
    assert identity.instance == "base-w0"  # the parent is untouched
    assert sink.write(R.SEGMENT, segment("base-w0")) and sink.slot == 0


def test_leave_says_goodbye_and_frees_the_slot(arena: Arena) -> None:
    sink = sink_for(arena)
    sink.write(R.SEGMENT, segment("x"))
    sink.leave()
    records = read_all(arena, 0)
    assert records[-1] == (R.WORKER_STOP, [os.getpid(), 0])
    assert not arena.own_slots()
    assert not sink.owns_ring()
    assert sink.write(R.SEGMENT, segment("x"))  # a later write claims again
    assert sink.slot == 0


def test_after_leaving_for_good_records_are_counted_and_a_child_still_claims(arena: Arena) -> None:
    sink = sink_for(arena)
    assert sink.write(R.SEGMENT, segment("x"))
    sink.leave(for_good=True)  # the process exits (atexit, a worker's shutdown signal)
    # Records of atexit handlers that run after ours: dropped and counted, never a new claim.
    assert not sink.write(R.SEGMENT, segment("late"))
    assert not sink.write(R.LOG, b"[]")
    sink.rebind()  # as the instance name's binder would
    assert not arena.own_slots() and sink.slot is None
    assert [t for t, _ in read_all(arena, 0)] == [R.WORKER_START, R.SEGMENT, R.WORKER_STOP]
    lost = arena.lost_counts()
    assert (lost.late_records, lost.no_slot_records) == (2, 0)
    child_writes(sink, expected_slot=0)  # forked now (by an atexit handler...): a new process claims
    assert [t for t, _ in read_all(arena, 0)][-2:] == [R.WORKER_START, R.SEGMENT]


def test_all_slots_taken_drops_counts_and_logs_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    arena = Arena.create(str(tmp_path / "one.arena"), slots=1, ring_capacity=1 << 16)
    try:
        with SlotHolder(arena):  # another process holds the only slot
            sink = sink_for(arena)
            with caplog.at_level(logging.ERROR, logger="swmp.agent"):
                assert not sink.write(R.SEGMENT, segment("x"))
                assert not sink.write(R.SEGMENT, segment("x"))
            assert sink.dropped_no_slot == 2
            assert sink.role == "unavailable"
            assert len([rec for rec in caplog.records if "ring slots" in rec.getMessage()]) == 1
    finally:
        arena.close()


@pytest.mark.parametrize("server", ["uwsgi", "gunicorn"])
def test_the_prefork_master_never_takes_a_slot(
    arena: Arena, monkeypatch: pytest.MonkeyPatch, server: str
) -> None:
    if server == "uwsgi":
        fake = types.ModuleType("uwsgi")
        fake.masterpid = os.getpid  # type: ignore[attr-defined]
        fake.worker_id = lambda: 0  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "uwsgi", fake)
    else:
        monkeypatch.delitem(sys.modules, "uwsgi", raising=False)
        monkeypatch.setitem(sys.modules, "gunicorn.arbiter", types.ModuleType("gunicorn.arbiter"))
    assert prefork_master(os.getpid())
    assert not prefork_master(os.getppid())  # only the owner is the master
    sink = ArenaSink(arena, "svc", "base", owner_pid=os.getpid())
    assert not sink.write(R.SEGMENT, segment("x"))
    assert sink.role == "master" and sink.dropped_no_slot == 1
    assert not arena.own_slots()
    assert arena.reader(0).read(10) == []


def test_write_never_raises(arena: Arena) -> None:
    sink = sink_for(arena)
    assert not sink.write(R.SEGMENT, "not bytes")  # type: ignore[arg-type]
    assert sink.write(R.SEGMENT, segment("x"))


# -- thread mode -----------------------------------------------------------------------------
def test_thread_sink_reports_on_its_own_thread(tmp_path: Path) -> None:
    registry = Arena.create(str(tmp_path / "names.arena"), slots=4, ring_capacity=4096)
    sender = MemorySender()
    settings = ReporterSettings(service="svc", flush_interval_s=0.01, keepalive_interval_s=0.1)
    started = []

    def start_thread(path: str, s: ReporterSettings, arena: Arena) -> Any:
        return start_reporter_thread(path, s, arena=arena, sender=sender)

    sink = ThreadSink(
        registry,
        settings,
        start_thread,
        arena_dir=str(tmp_path),
        ring_capacity=1 << 16,
        meta=b"{}",
        service="svc",
        instance_base="base",
        owner_pid=os.getppid(),
        on_started=lambda: started.append(os.getpid()),
    )
    try:
        for i in range(20):
            assert sink.write(R.SEGMENT, segment(identity.instance, f"/op{i}"))
        assert started == [os.getpid()]
        assert registry.own_slots() == {0}
        private = sink.private
        assert private is not None and os.path.exists(private.path)
        deadline = time.monotonic() + 10
        while len(sender.segments) < 20 or not sender.properties:
            assert time.monotonic() < deadline, (len(sender.segments), sender.properties)
            time.sleep(0.02)
        assert sender.properties[0][:2] == ("svc", "base-w0")
        assert identity.instance == "base-w0"
    finally:
        sink.leave(timeout=5)
    assert not os.path.exists(private.path)
    assert not registry.own_slots()
    assert sink.handle is None
    assert {s[R.SEG_INSTANCE] for s in sender.segments} == {"base-w0"}
    registry.close()


# -- where does the agent run ------------------------------------------------------------------
def _fake_uwsgi(monkeypatch: pytest.MonkeyPatch, master: int, worker: int) -> None:
    fake = types.ModuleType("uwsgi")
    fake.masterpid = lambda: master  # type: ignore[attr-defined]
    fake.worker_id = lambda: worker  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "uwsgi", fake)


def test_server_position_under_uwsgi(monkeypatch: pytest.MonkeyPatch) -> None:
    me = os.getpid()
    _fake_uwsgi(monkeypatch, master=me, worker=0)
    assert agent.server_position() == (me, False)  # the master imports the app
    _fake_uwsgi(monkeypatch, master=12345, worker=2)
    assert agent.server_position() == (12345, True)  # lazy-apps: a worker imports it
    _fake_uwsgi(monkeypatch, master=0, worker=1)
    assert agent.server_position() == (me, True)  # no master: the lone worker owns it


def test_server_position_under_gunicorn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "uwsgi", raising=False)
    monkeypatch.delitem(sys.modules, "gunicorn.arbiter", raising=False)
    assert agent.server_position() == (os.getpid(), False)
    monkeypatch.setitem(sys.modules, "gunicorn.arbiter", types.ModuleType("gunicorn.arbiter"))
    assert agent.server_position() == (os.getpid(), False)  # the arbiter itself (or --preload)
    # A worker runs inside Arbiter.spawn_worker, whose ``self.pid`` is the master's.
    source = "class Arbiter:\n    pid = 4242\n    def spawn_worker(self, probe):\n        return probe()\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, os.path.join("site-packages", "gunicorn", "arbiter.py"), "exec"), namespace)
    assert namespace["Arbiter"]().spawn_worker(agent.server_position) == (4242, True)


def test_server_position_of_a_sanic_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "uwsgi", raising=False)
    monkeypatch.delitem(sys.modules, "gunicorn.arbiter", raising=False)
    monkeypatch.delenv("SANIC_WORKER_NAME", raising=False)
    monkeypatch.delenv(_spawned.ENV, raising=False)
    assert agent.server_position() == (os.getpid(), False)
    # Sanic's worker manager spawns its server workers with their name in the environment:
    # the manager (the parent) owns the application, as a Gunicorn arbiter does.
    monkeypatch.setenv("SANIC_WORKER_NAME", "Sanic-Server-1-0")
    assert agent.server_position() == (os.getppid(), True)
    monkeypatch.setenv("SANIC_WORKER_NAME", "Sanic-Reloader-0")  # serves no requests
    assert agent.server_position() == (os.getpid(), False)


def test_the_children_of_a_sanic_worker_are_no_sanic_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every interpreter a worker starts inherits ``SANIC_WORKER_NAME``; its parent is the
    worker, not the main process that owns the application."""
    monkeypatch.delitem(sys.modules, "uwsgi", raising=False)
    monkeypatch.delitem(sys.modules, "gunicorn.arbiter", raising=False)
    monkeypatch.setenv("SANIC_WORKER_NAME", "Sanic-Server-0-0")
    parent, me = os.getppid(), (os.getpid(), False)
    # The agent upstream published the application's owner: the parent must be that owner.
    monkeypatch.setenv(_spawned.ENV, f"{parent}:/arena")
    assert agent.server_position() == (parent, True)  # the worker, spawned by the main process
    monkeypatch.setenv(_spawned.ENV, f"{parent + 100000}:/arena")
    assert agent.server_position() == me  # a child of the worker (the owner is its parent's parent)
    # No agent upstream: the main process was started without the variable, a worker with it.
    monkeypatch.delenv(_spawned.ENV)
    started_with: list[tuple[int, bytes]] = []

    def worker_parent(pid: int, variable: bytes) -> bool:
        started_with.append((pid, variable))
        return True

    monkeypatch.setattr(_server_position, "_started_with", worker_parent)
    assert agent.server_position() == me
    assert started_with == [(parent, b"SANIC_WORKER_NAME=")]
    monkeypatch.setattr(_server_position, "_started_with", lambda pid, variable: False)
    assert agent.server_position() == (parent, True)


def test_started_with_reads_the_environment_a_process_was_started_with() -> None:
    os.environ["SWMP_TEST_LATE"] = "1"  # set after the start: not in /proc/<pid>/environ
    try:
        assert _server_position._started_with(os.getpid(), b"PATH=")
        assert not _server_position._started_with(os.getpid(), b"SWMP_TEST_LATE=")
        assert not _server_position._started_with(2**22 + 1, b"PATH=")  # no such process: unknown
    finally:
        del os.environ["SWMP_TEST_LATE"]


# -- waiting for a reporter another process starts ---------------------------------------------
class _Clock:
    """A fake clock: the wall clock stepped back an hour after the arena was created; sleeping
    advances only the monotonic clock (and fails the test past a minute: the old wait spun on)."""

    def __init__(self, created_s: float) -> None:
        self.wall = created_s - 3600.0
        self.mono = 1000.0
        self.slept = 0.0

    def sleep(self, seconds: float) -> None:
        self.slept += seconds
        self.mono += seconds
        if self.slept > 60:
            raise AssertionError("the wait followed the stepped-back wall clock")


def test_reporter_wait_is_bounded_by_the_monotonic_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    created_s = 1_700_000_000.0
    info = types.SimpleNamespace(created_ns=int(created_s * 1e9))
    stub = types.SimpleNamespace(created=False, reporter_pid=lambda: None, info=lambda: info)
    clock = _Clock(created_s)
    monkeypatch.setattr(agent.time, "time", lambda: clock.wall)
    monkeypatch.setattr(agent.time, "monotonic", lambda: clock.mono)
    monkeypatch.setattr(agent.time, "sleep", clock.sleep)
    assert agent._needs_reporter(stub)  # type: ignore[arg-type]
    assert clock.slept <= agent._REPORTER_START_GRACE_S + 0.05
    # A reporter taking the lock meanwhile still ends the wait early.
    pids = iter([None, None, 4242])
    stub.reporter_pid = lambda: next(pids, 4242)
    clock.slept = 0.0
    assert not agent._needs_reporter(stub)  # type: ignore[arg-type]
    assert clock.slept < 0.1
