"""The prefork master's own log ring (``swmp._runtime``): claimed on the master's first LOG
record, on the highest free slot, announced as ``<base>-master``; nothing but LOG records go
there; freed at exit. Real arenas in a temporary directory (the Gunicorn version is in
tests/test_logs_gunicorn.py)."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ipc import Arena
from reporter_proc import records as R
from swmp import lifecycle
from swmp._arena_sink import ArenaSink
from swmp.tracing.identity import identity


@pytest.fixture()
def master_arena(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Arena]:
    """An arena, with this process looking like Gunicorn's arbiter (the owner, arbiter imported)."""
    monkeypatch.setitem(sys.modules, "gunicorn.arbiter", types.ModuleType("gunicorn.arbiter"))
    before = (identity.service, identity.instance)
    a = Arena.create(str(tmp_path / "m.arena"), slots=4, ring_capacity=1 << 16)
    yield a
    a.close()
    identity.set(*before)
    # The sink announced this process as a prefork master (swmp.lifecycle): later tests in
    # this process must not see that role (meters, for one, start no thread in a master).
    lifecycle.announce_unbound()


def read_all(arena: Arena, slot: int) -> list[tuple[int, list[Any]]]:
    return [(t, orjson.loads(p)) for t, p in arena.reader(slot).read(10_000)]


def log_record(instance: str, body: str) -> bytes:
    return orjson.dumps([1, "svc", instance, "", "text", body, "", "", -1, [], ""])


def test_the_masters_first_log_claims_the_highest_slot(master_arena: Arena) -> None:
    sink = ArenaSink(master_arena, "svc", "base", owner_pid=os.getpid())
    assert sink.write(R.SEGMENT, b"[]") is False  # a master serves no requests: not its ring
    assert master_arena.own_slots() == set()
    assert sink.role == "master"
    assert sink.write(R.LOG, log_record(identity.instance, "WORKER TIMEOUT (pid:1)")) is True
    assert sink.write(R.LOG, log_record(identity.instance, "second")) is True
    assert master_arena.own_slots() == {3}
    assert sink.slot is None  # not a worker's slot
    records = read_all(master_arena, 3)
    assert [t for t, _ in records] == [R.WORKER_START, R.LOG, R.LOG]
    start = records[0][1]
    assert start[0] == os.getpid() and start[1] == 3 and start[3] == "base-master"
    assert [rec[2] for _, rec in records[1:]] == ["base-master", "base-master"]  # re-stamped
    assert identity.instance == "base-master"
    # A worker claims the lowest slot as always: names stay -w0 ... -w<N-1>.
    worker = master_arena.claim_slot()
    assert worker is not None and worker.slot == 0
    master_arena.release_slot(0)

    sink.leave()
    assert master_arena.own_slots() == set()
    assert read_all(master_arena, 3)[-1] == (R.WORKER_STOP, [os.getpid(), 3])
    assert sink.write(R.SEGMENT, b"[]") is False


def test_no_free_slot_drops_and_counts(master_arena: Arena) -> None:
    held = [master_arena.claim_slot() for _ in range(4)]
    assert all(w is not None for w in held)
    master_arena.release_slot()  # the arena's own process: give them back, then fill from another view
    other = Arena.open(master_arena.path)
    try:
        for _ in range(4):
            assert other.claim_slot() is not None
        sink = ArenaSink(master_arena, "svc", "base", owner_pid=os.getpid())
        assert sink.write(R.LOG, log_record("x", "lost")) is False
        assert sink.dropped_no_slot == 1
    finally:
        other.release_slot()
        other.close()
