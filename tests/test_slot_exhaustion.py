"""More workers than ring slots: nothing is lost silently.

A worker that finds every slot taken drops its records, counts every one of them in the
arena header, tries the claim again now and then (a freed slot is taken), and ``swmp
health`` fails its ``drops`` check while ``swmp status`` shows the count. First on the sink
with a real arena and a real second process, then with real Gunicorn, the real reporter
and the in-test collector. A claim that fails (thread mode: a full /dev/shm, a thread that
cannot start) is treated the same way, and gives back what it took.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ipc import Arena
from ipc.private import private_directory
from reporter_proc import records as R
from reporter_proc.process import start_reporter_thread
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from swmp import _runtime, lifecycle
from swmp._arena_sink import ArenaSink
from swmp._thread_sink import ThreadSink
from swmp.tracing.identity import identity
from tests.collector import free_port
from tests.servers import (
    agent_env,
    collector_process,
    gunicorn_command,
    request,
    run_server,
    segments_of,
    wait_segments,
    wait_until,
)
from tests.slot_holder import SlotHolder
from tests.test_cli_support import cli, cli_json


@pytest.fixture(autouse=True)
def _give_back_process_state() -> Iterator[None]:
    """The sink names this process and gives it a role: later tests must not inherit them."""
    before = (identity.service, identity.instance)
    yield
    identity.set(*before)
    lifecycle.announce_unbound()


def _segment(op: str = "/x") -> bytes:
    span = [0, -1, 1, 2, op, "", 0, 3, 7001, False, False, [], [], []]
    return orjson.dumps(["trace", "seg", "svc", "inst", False, [span]])


def test_a_worker_without_a_slot_counts_its_drops_and_claims_a_freed_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_runtime, "CLAIM_RETRY_S", 0.05)
    arena = Arena.create(str(tmp_path / "one.arena"), slots=1, ring_capacity=1 << 16)
    holder = SlotHolder(arena)  # another process holds the only slot
    try:
        sink = ArenaSink(arena, "svc", "base", owner_pid=os.getppid())
        for _ in range(5):
            assert not sink.write(R.SEGMENT, _segment())
        assert sink.role == "unavailable"
        # The first drop is published at once (at most once a second after that).
        lost = arena.lost_counts()
        assert lost.no_slot_workers == 1 and lost.no_slot_records >= 1
        holder.release()  # the holder leaves: its slot is free
        dropped = 5
        deadline = time.monotonic() + 30
        while not sink.write(R.SEGMENT, _segment("/after")):
            dropped += 1
            assert time.monotonic() < deadline, "the freed slot was never claimed"
            time.sleep(0.01)
        assert sink.role == "worker" and sink.slot == 0
        records = list(arena.reader(0).read(100))
        assert [t for t, _ in records] == [R.WORKER_START, R.SEGMENT]
        assert orjson.loads(records[1][1])[R.SEG_INSTANCE] == "base-w0"  # re-stamped
        sink.leave()  # publishes what was still counted locally
        lost = arena.lost_counts()
        assert (lost.no_slot_records, lost.no_slot_workers, lost.helper_records) == (dropped, 1, 0)
    finally:
        holder.release()
        arena.close()


def _full_shm(*_: Any, **__: Any) -> Any:
    raise OSError(errno.ENOSPC, "No space left on device")


def _private_arenas(arena_dir: Path) -> list[str]:
    return sorted(p.name for p in Path(private_directory(str(arena_dir))).glob("*-t*.arena"))


@pytest.mark.parametrize("failing", ["arena", "thread"])
def test_a_failed_claim_in_thread_mode_gives_back_its_name_and_backs_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    registry = Arena.create(str(tmp_path / "names.arena"), slots=4, ring_capacity=4096)
    sender = MemorySender()
    fail = [True]
    attempts = {"arena": 0, "thread": 0}
    real_create = Arena.create

    def create(*args: Any, **kw: Any) -> Arena:
        attempts["arena"] += 1
        if fail[0] and failing == "arena":
            _full_shm()
        return real_create(*args, **kw)

    def start_thread(path: str, s: ReporterSettings, arena: Arena) -> Any:
        attempts["thread"] += 1
        if fail[0] and failing == "thread":
            _full_shm()
        return start_reporter_thread(path, s, arena=arena, sender=sender)

    monkeypatch.setattr(Arena, "create", staticmethod(create))
    sink = ThreadSink(
        registry,
        ReporterSettings(service="svc", flush_interval_s=0.01),
        start_thread,
        arena_dir=str(tmp_path),
        ring_capacity=1 << 16,
        meta=b"{}",
        service="svc",
        instance_base="base",
        owner_pid=os.getppid(),
    )
    try:
        for _ in range(100):
            assert not sink.write(R.SEGMENT, _segment())
        assert sink.role == "unavailable"
        # One attempt in the retry interval (a second), not one per record...
        assert attempts[failing] == 1, attempts
        # ... and it kept nothing: no name slot (each used to keep one: after 64 records
        # every other worker was named by its pid), no private arena file.
        assert registry.own_slots() == set()
        assert _private_arenas(tmp_path) == []
        assert sink.private is None and sink.handle is None
        # Counted as a worker without a slot, where `swmp status` reads it.
        lost = registry.lost_counts()
        assert (lost.no_slot_workers, lost.no_slot_records) == (1, 100)

        # The cause goes away: the next claim after the retry interval succeeds.
        fail[0] = False
        monkeypatch.setattr(_runtime, "CLAIM_RETRY_S", 0.05)
        sink._retry_at = 0.0
        assert sink.write(R.SEGMENT, _segment("/after"))
        assert sink.role == "worker" and sink.slot == 0 and registry.own_slots() == {0}
        assert len(_private_arenas(tmp_path)) == 1
    finally:
        sink.leave(timeout=5)
        registry.close()
    assert _private_arenas(tmp_path) == []


@pytest.mark.servers
@pytest.mark.timeout(240)
def test_gunicorn_with_more_workers_than_slots_counts_every_lost_segment(tmp_path: Path) -> None:
    workers, slots = 3, 2
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(
            tmp_path, col.grpc_address, service="tight", extra={"SW_AGENT_ARENA_SLOTS": str(slots)}
        )
        cmd = gunicorn_command(port, app="tests.e2e_apps.fork_app:app", workers=workers)
        with run_server(
            "gunicorn", tmp_path, cmd, env, port=port, workers=workers, wait_claims=False
        ) as server:
            server.wait_workers_claimed(slots)
            served: dict[int, int] = {}

            def slotless() -> int:
                held = set(server.live_slots().values())
                (pid,) = set(server.worker_pids()) - held
                return pid

            def one() -> None:
                res = request(port, "/pid")
                assert res.status == 200
                pid = int(orjson.loads(res.body)["worker"])
                served[pid] = served.get(pid, 0) + 1

            # Load until every worker served some requests (sync workers: one at a time).
            wait_until(lambda: (one(), len(served) == workers)[1], 120, "requests on every worker")
            lost_pid = slotless()
            slotted = sum(n for pid, n in served.items() if pid != lost_pid)
            # Every request of a worker with a slot arrives; none of the slotless one's.
            wait_segments(col, slotted, service="tight")
            assert len(segments_of(col, "tight")) == slotted

            shm = str(server.arena_dir)
            rc, health = cli_json("health", "--dir", shm, "--interval", "0")
            drops = {c["name"]: c for c in health["agents"][0]["checks"]}["drops"]
            assert rc != 0 and drops["status"] == "fail", health
            assert drops["figures"]["no_slot_dropped"] >= 1

            # The counts are published at the first drop, then at most once a second: keep
            # asking (one request at a time) until every dropped segment is counted.
            def all_counted() -> bool:
                one()
                with Arena.open(str(server.arena_path()), wait_s=0) as arena:
                    lost = arena.lost_counts()
                return lost.no_slot_records == served.get(lost_pid, 0) and lost.no_slot_workers == 1

            wait_until(all_counted, 120, "every lost segment counted", interval=0.3)
            assert slotless() == lost_pid

            rc, status = cli_json("status", "--dir", shm, "--interval", "0")
            (agent,) = status["agents"]
            assert agent["totals"]["no_slot_dropped"] >= served[lost_pid]
            assert agent["totals"]["no_slot_workers"] == 1
            text = cli("status", "--dir", shm, "--interval", "0").stdout
            assert "no slot:" in text and "by 1 worker(s)" in text, text
