"""Counters that outlive the reporter: the arena's counter table, the exit summary, and the
records lost to the rings' corruption recovery in ``swmp status`` / ``swmp health``.

Real reporter processes (an owner subprocess spawns them, ``protocol="memory"``), real
writer processes, the real command line.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from ipc import Arena
from ipc import _layout as L
from reporter_proc import records as R
from reporter_proc.status import Counters, exit_summary
from tests.test_reporter_helpers import (
    ROOT,
    Owner,
    pid_alive,
    segment,
    spawn_writer,
    status_doc,
    wait_for,
    write_all,
)
from tests.test_reporter_process import settings_json


def segs(tag: str, n: int) -> list[tuple[int, bytes]]:
    return [(R.SEGMENT, segment(f"{tag}-{i}")) for i in range(n)]


def committed(arena: Arena) -> bool:
    return all(arena.ring_stats(s).head == arena.ring_stats(s).tail for s in range(arena.slots))


def test_the_status_block_keeps_named_counters(tmp_path: Path) -> None:
    arena = Arena.create(str(tmp_path / "c.arena"), slots=1, ring_capacity=4096)
    try:
        st = arena.status
        assert st.snapshot().counters == {}
        assert st.store_counters({"sent.segment": 5, "dropped.backend": 2}) == 0
        assert st.publish(b"{}", {"sent.segment": 7, "retried": 1})
        assert st.snapshot().counters == {"sent.segment": 7, "dropped.backend": 2, "retried": 1}
        # Another process (a restarted reporter) sees the same table.
        with Arena.open(arena.path) as again:
            assert again.status.snapshot().counters["sent.segment"] == 7
        # Full table, name too long: refused and counted, never an error.
        many = {f"k{i}": i for i in range(L.COUNTERS_MAX)}
        assert st.store_counters(many) == 3  # 3 entries were already taken
        assert st.store_counters({"x" * (L.COUNTER_NAME_MAX + 1): 1}) == 1
        assert len(st.snapshot().counters) == L.COUNTERS_MAX
    finally:
        arena.unlink()
        arena.close()


def test_counters_seed_and_flatten_round_trip() -> None:
    c = Counters()
    c.add(c.sent, "segment", 3)
    c.dropped["backend"] = 2
    c.retried, c.spooled = 4, 1
    flat = c.flat()
    assert flat["sent.segment"] == 3 and flat["dropped.backend"] == 2 and flat["retried"] == 4
    d = Counters()
    d.seed(flat | {"read.segment": 9, "dropped.spool": 5})
    d.add(d.sent, "segment")
    # read.* and dropped.spool come from their sources, which the publisher adds to.
    assert d.sent == {"segment": 4} and d.dropped["backend"] == 2 and d.dropped["spool"] == 0
    assert (d.retried, d.spooled) == (4, 1)


def test_exit_summary_says_what_was_lost() -> None:
    kinds = frozenset({"segment", "log"})
    level, msg = exit_summary({"sent.segment": 10, "sent.keepalive": 3, "dropped.disabled": 4}, kinds, 0, 0)
    assert level == 20 and msg == "delivered segment 10; spooled 0, replayed 0; lost 0"
    level, msg = exit_summary({"sent.log": 1, "dropped.backend": 2, "spooled": 5}, kinds, 3, 1)
    assert level == 30
    assert msg == "delivered log 1; spooled 5, replayed 0; lost 6 (backend 2, ring 3, corrupt 1)"


def test_counts_continue_across_a_restart_and_the_last_reporter_logs_the_totals(tmp_path: Path) -> None:
    o = Owner(str(tmp_path), settings_json(str(tmp_path)), "log")
    try:
        first = o.reporter_pid()
        write_all(o.arena_path, segs("a", 100))
        wait_for(lambda: status_doc(o.arena).get("sent", {}).get("segment") == 100, 20, "first delivery")
        wait_for(lambda: committed(o.arena), 10, "rings committed")
        os.kill(first, signal.SIGKILL)
        second = o.reporter_pid(not_pid=first)
        write_all(o.arena_path, segs("b", 50))

        def continued() -> bool:
            doc = status_doc(o.arena)
            return doc.get("pid") == second and doc.get("sent", {}).get("segment") == 150

        wait_for(continued, 20, "the restarted reporter to continue the count")
        doc = status_doc(o.arena)
        assert doc["read"]["segment"] == 150 and doc["counted_since_ns"] == o.arena.info().created_ns
        table = o.arena.status.snapshot().counters
        assert table["sent.segment"] == 150 and table["read.segment"] == 150

        # `swmp status` shows the totals since the arena was created.
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "swmp.cli",
                "status",
                "--json",
                "--interval",
                "0",
                "--arena",
                o.arena_path,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            check=False,
        )
        agent = json.loads(out.stdout)["agents"][0]
        assert agent["totals"]["sent"] >= 150, out.stdout

        o.kill()  # the owner dies: the reporter drains, removes the arena and says what happened
        wait_for(lambda: not pid_alive(second), 20, "reporter exit")
        log = Path(o.ready + ".log").read_text()
        assert "since the arena was created: delivered segment 150; spooled 0, replayed 0; lost 0" in log, log
        assert not os.path.exists(o.arena_path)
    finally:
        o.cleanup()


def _clobber_slot(arena_path: str, slot: int, capacity: int, position: int) -> None:
    """Overwrite one record header in ``slot``'s ring with bytes no writer produces."""
    with open(arena_path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        base = L.SLOTS_OFFSET + slot * L.slot_stride(capacity) + L.CONTROL_SIZE
        off = base + position % capacity
        mm[off : off + 8] = b"\xff" * 8


def test_records_skipped_by_corruption_recovery_are_counted_and_fail_the_drops_check(
    tmp_path: Path,
) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    from tests.test_cli_support import cli, make_arena

    arena = make_arena(shm, slots=2, ring_capacity=64 * 1024)
    writer = spawn_writer(arena.path, segs("c", 20), hold=True)
    try:
        slot = writer.wait_written()
        start = arena.ring_stats(slot).head
        span = L.record_span(len(segment("c-0")))
        _clobber_slot(arena.path, slot, arena.ring_capacity, start + 5 * span)
        reader = arena.reader(slot)
        assert len(reader.read()) == 5
        assert reader.read() == []  # the bad header's second chance: skipped to the tail
        reader.commit()
        st = arena.ring_stats(slot)
        assert st.skipped_records == 15 and st.read_records == 5

        status = cli("status", "--dir", str(shm), "--interval", "0", "--json")
        agent: dict[str, Any] = json.loads(status.stdout)["agents"][0]
        assert agent["totals"]["ring_skipped"] == 15, status.stdout
        health = cli("health", "--dir", str(shm), "--interval", "0", "--json")
        assert health.returncode == 1
        checks = {c["name"]: c for c in orjson.loads(health.stdout)["agents"][0]["checks"]}
        drops = checks["drops"]
        assert drops["status"] == "fail" and drops["figures"]["ring_dropped"] == 15, drops
    finally:
        writer.release()
        arena.unlink()
        arena.close()
