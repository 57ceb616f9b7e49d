"""benchmarks/_ring.py: the benchmarks' ring goes round once before anything is timed.

The benchmarks' writes should pay what a worker's pay once it has served for a while: its
ring has gone round, and gives the pages the reader has read back at every stretch
(ipc/ring_pages.py), as a worker's does. These tests hold what the benchmarks rely on: after
``Ring()`` (and after ``warm()``) a lap has been written and its read pages given back,
nothing is pending, nothing was dropped, and records written afterwards arrive intact and in
order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks._ring import Ring, agent_ring_size
from swmp import _sink

CAPACITY = 1 << 20


@pytest.fixture
def ring() -> Iterator[Ring]:
    r = Ring(CAPACITY)
    try:
        yield r
    finally:
        r.close()


def allocated_ring_bytes(r: Ring) -> int:
    return os.stat(r.arena.path).st_blocks * 512


def test_a_new_ring_has_gone_round_once_and_given_its_read_pages_back(ring: Ring) -> None:
    assert ring.writer.tail >= CAPACITY  # one lap written
    assert allocated_ring_bytes(ring) < CAPACITY // 2  # read, then given back as a worker's
    assert not ring.reader.pending()
    stats = ring.writer.stats()
    assert stats.dropped_records == 0
    assert _sink.get_sink() is ring.writer


def test_records_after_the_warm_lap_arrive_intact(ring: Ring) -> None:
    payloads = [f"record {i}".encode() * (i + 1) for i in range(50)]
    for p in payloads:
        assert ring.writer.write(9, p)
    got = ring.reader.read(1000)
    assert got == [(9, p) for p in payloads]
    ring.reader.rewind()
    assert ring.drain() == len(payloads)  # the count the gRPC cost benchmarks check
    assert ring.drain() == 0


def test_warm_reads_what_is_pending_first_and_drops_nothing(ring: Ring) -> None:
    for _ in range(100):
        assert ring.writer.write(9, b"x" * 3000)  # ~300 KiB unread when warm() starts
    before = ring.writer.tail
    ring.warm()
    assert ring.writer.tail >= before + CAPACITY
    assert ring.writer.stats().dropped_records == 0
    assert not ring.reader.pending()


def test_the_default_size_is_the_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    assert agent_ring_size() == 4 << 20
    monkeypatch.setenv("SW_AGENT_RING_SIZE", str(1 << 19))
    assert agent_ring_size() == 1 << 19
    r = Ring()
    try:
        assert r.capacity == 1 << 19
        assert Path(r.arena.path).exists()
    finally:
        r.close()
