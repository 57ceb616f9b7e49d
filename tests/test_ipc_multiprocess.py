"""Real processes: forked writers, one reader, SIGKILL mid-stream, slot reclaim.

Every record is numbered and checksummed (writer id, sequence, crc32 of the body), so the
reader can prove it got each committed record exactly once, whole, in order per writer.
"""

from __future__ import annotations

import os
import signal
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ipc import Arena, RingReader, RingWriter, arena_path
from ipc import _layout as L
from tests.children import fork, reap

HEAD = struct.Struct("<IIQ")  # writer id, sequence, crc32 of the body


def make_record(wid: int, seq: int, size: int) -> bytes:
    body = bytes([(seq + i) % 251 for i in range(min(size, 64))]) * (size // 64 + 1)
    body = body[:size]
    return HEAD.pack(wid, seq, zlib.crc32(body)) + body


def parse_record(payload: bytes) -> tuple[int, int]:
    wid, seq, crc = HEAD.unpack_from(payload)
    assert zlib.crc32(payload[HEAD.size :]) == crc, f"torn or corrupt record {wid}/{seq}"
    return wid, seq


def body_size(seq: int) -> int:
    return (seq * 37) % 700


@pytest.fixture
def arena(tmp_path: Path) -> Iterator[Arena]:
    a = Arena.create(arena_path(os.getpid(), str(tmp_path)), slots=8, ring_capacity=64 * 1024)
    yield a
    a.close()
    a.unlink()


def write_all(writer: RingWriter, wid: int, seqs: range, size: Callable[[int], int] = body_size) -> None:
    for seq in seqs:
        rec = make_record(wid, seq, size(seq))
        while not writer.write(1, rec):
            time.sleep(0.0002)  # full: the reader makes room (the writer itself never blocks)


def wait_for(cond: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def test_several_writers_every_record_exactly_once_in_order(arena: Arena) -> None:
    writers, per = 4, 3000
    readers = [arena.reader(s) for s in range(arena.slots)]

    def child(wid: int) -> Callable[[], None]:
        def run() -> None:
            w = arena.claim_slot()
            assert w is not None
            write_all(w, wid, range(per))

        return run

    pids = [fork(child(wid)) for wid in range(writers)]
    try:
        seen: dict[int, list[int]] = {wid: [] for wid in range(writers)}
        deadline = time.monotonic() + 60
        while sum(map(len, seen.values())) < writers * per:
            assert time.monotonic() < deadline, f"missing records: { {k: len(v) for k, v in seen.items()} }"
            for r in readers:
                for rtype, payload in r.read(500):
                    assert rtype == 1
                    wid, seq = parse_record(payload)
                    seen[wid].append(seq)
                r.commit()
        for wid in range(writers):
            assert seen[wid] == list(range(per)), f"writer {wid} out of order or duplicated"
    finally:
        statuses = [reap(pid) for pid in pids]
    assert statuses == [0] * writers
    assert all(r.stats().corrupt_events == 0 for r in readers)
    assert not any(r.pending() for r in readers)
    assert arena.live_slots() == {}  # every writer exited: the kernel released its lock


def test_sigkill_mid_stream_loses_nothing_published_and_the_slot_is_reused(arena: Arena) -> None:
    """Kill a busy writer at an arbitrary point; a new process continues its ring."""

    def forever() -> None:
        w = arena.claim_slot()
        assert w is not None and w.slot == 0
        write_all(w, 1, range(10**9), size=lambda seq: 1000 + (seq * 131) % 3000)

    pid = fork(forever)
    r = arena.reader(0)
    got: list[int] = []
    try:
        wait_for(lambda: arena.slot_owner(0) == pid, what="the writer to claim slot 0")
        while len(got) < 1500:  # it is mid-stream, writing as fast as the ring allows
            got += [parse_record(p)[1] for _, p in r.read(100)]
            r.commit()
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    # The kernel released its lock: the slot is free, with no cooperation from the dead.
    assert arena.slot_owner(0) is None and arena.live_slots() == {}
    got += [parse_record(p)[1] for _, p in r.read(100_000)]
    r.commit()
    assert got == list(range(len(got)))  # whole records, none lost, none twice
    s = r.stats()
    assert s.corrupt_events == 0
    # The count is stored just after the tail: a kill between the two leaves it one short.
    assert s.written_records in (len(got), len(got) - 1)

    def successor() -> None:
        w = arena.claim_slot()
        assert w is not None and w.slot == 0, "the lowest free slot is the dead writer's"
        write_all(w, 2, range(500))

    pid2 = fork(successor)
    later: list[tuple[int, int]] = []
    try:
        wait_for(lambda: collect(r, later) >= 500, what="500 records from the successor")
    finally:
        assert reap(pid2) == 0
    assert later == [(2, seq) for seq in range(500)]
    assert r.stats().corrupt_events == 0
    assert arena.slot_identity(0)[1] == 2  # claimed twice


def collect(r: RingReader, into: list[tuple[int, int]]) -> int:
    into += [parse_record(p) for _, p in r.read(1000)]
    r.commit()
    return len(into)


def test_writer_killed_inside_a_record_exposes_nothing(arena: Arena) -> None:
    """A writer dies after copying half a record but before publishing it."""

    def torn() -> None:
        w = arena.claim_slot()
        assert w is not None
        write_all(w, 1, range(3))
        # What write() does up to the publishing store, then death: header and half the
        # payload in place, tail untouched.
        tail = w.tail
        rec = make_record(1, 3, 500)
        data = arena.views.data(w.slot)
        off = tail % arena.ring_capacity
        data[off : off + 8] = L.header_word(len(rec), 1, tail, arena.ring_capacity).to_bytes(8, "little")
        data[off + 8 : off + 8 + len(rec) // 2] = rec[: len(rec) // 2]
        os.kill(os.getpid(), signal.SIGKILL)

    pid = fork(torn)
    assert reap(pid) == -signal.SIGKILL
    r = arena.reader(0)
    assert [parse_record(p) for _, p in r.read()] == [(1, 0), (1, 1), (1, 2)]
    assert not r.pending()
    r.commit()

    def successor() -> None:
        w = arena.claim_slot()
        assert w is not None and w.slot == 0
        write_all(w, 2, range(3, 10))

    assert reap(fork(successor)) == 0
    assert [parse_record(p) for _, p in r.read()] == [(2, seq) for seq in range(3, 10)]
    assert r.stats().corrupt_events == 0


def test_a_restarted_reader_resumes_from_the_committed_head(arena: Arena) -> None:
    """Uncommitted reads are delivered again to the next reader (at-least-once)."""

    def producer() -> None:
        w = arena.claim_slot()
        assert w is not None
        write_all(w, 1, range(20))

    assert reap(fork(producer)) == 0
    first = arena.reader(0)
    assert [parse_record(p)[1] for _, p in first.read(5)] == list(range(5))
    first.commit()
    assert [parse_record(p)[1] for _, p in first.read(5)] == list(range(5, 10))  # not committed
    second = arena.reader(0)  # the reporter crashed and a new one started
    assert [parse_record(p)[1] for _, p in second.read()] == list(range(5, 20))
