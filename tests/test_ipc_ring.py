"""Ring semantics against an exact model (hypothesis), plus threads, fork and odd input.

The model predicts every writer decision (fits or dropped) from positions alone, so the
tests also prove the writer never drops a record that fits and never overwrites unread
bytes: every record read back is compared with what was written.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ipc import _layout as L
from ipc.ring import RingReader, anonymous_ring

CAP = 4096
MAX_PAYLOAD = CAP // 2 - 8


def span(n: int) -> int:
    return (n + 15) & -8


@dataclass
class Rec:
    start: int
    end: int
    rtype: int
    payload: bytes


class RingModel(RuleBasedStateMachine):
    """Writes, reads, commits and rewinds in any order, across many wrap-arounds."""

    def __init__(self) -> None:
        super().__init__()
        self.w, self.r, self.c = anonymous_ring(CAP)
        self.tail = 0
        self.head = 0
        self.cursor = 0
        self.recs: list[Rec] = []  # published, not yet committed, in ring order
        self.written = 0
        self.dropped = 0
        self.dropped_bytes = 0
        self.oversize = 0
        self.read_records = 0
        self.read_bytes = 0
        self.high_water = 0
        self.seq = 0

    def _fits(self, n: int) -> bool:
        used = self.tail - self.head
        room = CAP - self.tail % CAP
        extra = room if span(n) > room else 0
        return n <= MAX_PAYLOAD and used + extra + span(n) <= CAP

    @rule(
        n=st.one_of(st.integers(0, 64), st.integers(0, 700), st.integers(MAX_PAYLOAD - 8, MAX_PAYLOAD + 8)),
        rtype=st.integers(1, 65534),
    )
    def write(self, n: int, rtype: int) -> None:
        self.seq += 1
        payload = (self.seq.to_bytes(4, "little") * (n // 4 + 1))[:n]
        expect = self._fits(n)
        assert self.w.write(rtype, payload) is expect
        if expect:
            room = CAP - self.tail % CAP
            start = self.tail + (room if span(n) > room else 0)
            self.recs.append(Rec(start, start + span(n), rtype, payload))
            self.tail = start + span(n)
            self.written += 1
        else:
            self.dropped += 1
            self.dropped_bytes += n
            self.oversize += n > MAX_PAYLOAD

    @rule(sizes=st.lists(st.integers(0, 400), min_size=1, max_size=12), rtype=st.integers(1, 65534))
    def write_burst(self, sizes: list[int], rtype: int) -> None:
        for n in sizes:
            self.write(n, rtype)

    @rule(k=st.integers(1, 40))
    def read(self, k: int) -> None:
        if self.tail > self.cursor:
            self.high_water = max(self.high_water, self.tail - self.head)
        unread = [r for r in self.recs if r.start >= self.cursor]
        want = unread[:k]
        got = self.r.read(k)
        assert got == [(r.rtype, r.payload) for r in want]
        new_cursor = want[-1].end if len(want) == k else self.tail
        self.read_records += len(got)
        self.read_bytes += new_cursor - self.cursor
        self.cursor = new_cursor
        assert self.r.cursor == self.cursor

    @rule(k=st.integers(1, 5), max_bytes=st.integers(1, 600))
    def read_bounded_by_bytes(self, k: int, max_bytes: int) -> None:
        """At least one record; stops once ``max_bytes`` ring bytes are read."""
        if self.tail > self.cursor:
            self.high_water = max(self.high_water, self.tail - self.head)
        got = self.r.read(k, max_bytes)
        unread = [r for r in self.recs if r.start >= self.cursor]
        want: list[Rec] = []
        budget = 0  # ring bytes of the records taken (padding is not counted)
        for r in unread:
            if len(want) == k or budget >= max_bytes:
                break
            want.append(r)
            budget += r.end - r.start
        assert got == [(r.rtype, r.payload) for r in want]
        self.read_records += len(got)
        self.read_bytes += self.r.cursor - self.cursor
        self.cursor = self.r.cursor

    @rule()
    def commit(self) -> None:
        self.r.commit()
        self.head = self.cursor
        self.recs = [r for r in self.recs if r.start >= self.head]

    @precondition(lambda self: self.recs)
    @rule(data=st.data())
    def commit_part(self, data: st.DataObject) -> None:
        """Committing an earlier position (the reporter commits what was delivered)."""
        done = [r for r in self.recs if r.end <= self.cursor]
        if not done:
            return
        upto = data.draw(st.sampled_from(done)).end
        self.r.commit(upto)
        self.head = upto
        self.recs = [r for r in self.recs if r.start >= upto]

    @rule()
    def commit_stale_position(self) -> None:
        self.r.commit(self.head - 8)  # before the head: ignored
        assert self.r.head == self.head

    @rule()
    def rewind(self) -> None:
        self.r.rewind()
        self.cursor = self.head

    @invariant()
    def counters_match(self) -> None:
        s = self.w.stats()
        assert (s.head, s.tail, s.written_bytes) == (self.head, self.tail, self.tail)
        assert (s.written_records, s.dropped_records, s.dropped_bytes) == (
            self.written,
            self.dropped,
            self.dropped_bytes,
        )
        assert s.oversize_records == self.oversize
        assert (s.read_records, s.read_bytes) == (self.read_records, self.read_bytes)
        assert s.high_water == self.high_water
        assert (s.corrupt_events, s.skipped_bytes, s.skipped_records) == (0, 0, 0)
        assert 0 <= s.used <= CAP
        assert self.r.pending() is (self.cursor < self.tail)
        assert self.r.backlog() == self.tail - self.head


TestRingModel = RingModel.TestCase
TestRingModel.settings = settings(
    max_examples=120, stateful_step_count=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(0, 1500), min_size=1, max_size=300), batch=st.integers(1, 64))
def test_everything_written_is_read_once_in_order(sizes: list[int], batch: int) -> None:
    """A writer that retries after draining never loses or reorders a record."""
    w, r, _ = anonymous_ring(CAP)
    sent: list[bytes] = []
    got: list[tuple[int, bytes]] = []
    for i, n in enumerate(sizes):
        payload = bytes([i % 251]) * n
        if not w.write(7, payload):
            got += r.read(10_000)
            r.commit()
            assert w.write(7, payload), "an empty ring must take any record up to max_payload"
        sent.append(payload)
        if i % batch == 0:
            got += r.read(batch)
            r.commit()
    got += r.read(10_000)
    r.commit()
    assert got == [(7, p) for p in sent]
    assert w.stats().tail == r.cursor == r.head


def test_record_size_limits() -> None:
    w, r, _ = anonymous_ring(CAP)
    assert w.max_payload == MAX_PAYLOAD
    assert w.write(1, b"")
    assert w.write(2, b"x" * MAX_PAYLOAD)
    assert not w.write(3, b"x" * (MAX_PAYLOAD + 1))
    s = w.stats()
    assert (s.dropped_records, s.oversize_records, s.dropped_bytes) == (1, 1, MAX_PAYLOAD + 1)
    assert r.read() == [(1, b""), (2, b"x" * MAX_PAYLOAD)]


@pytest.mark.parametrize("payload", [bytearray(b"abc"), memoryview(b"abcdef")[1:4]])
def test_bytes_like_payloads(payload: bytearray | memoryview) -> None:
    w, r, _ = anonymous_ring(CAP)
    assert w.write(1, payload)  # type: ignore[arg-type]
    assert r.read() == [(1, bytes(payload))]


BAD_INPUT = [(-1, b"x"), (65536, b"x"), (1, "text"), (1, None), ("1", b"")]


@pytest.mark.parametrize(("rtype", "payload"), BAD_INPUT)
def test_bad_input_is_dropped_never_raised(rtype: object, payload: object) -> None:
    w, r, _ = anonymous_ring(CAP)
    assert w.write(rtype, payload) is False  # type: ignore[arg-type]
    assert w.stats().dropped_records == 1
    assert w.write(1, b"ok") and r.read() == [(1, b"ok")]


def test_reserved_and_unknown_types_are_skipped_by_the_reader() -> None:
    w, _, c = anonymous_ring(CAP)
    # Types 0 and 65535 are not checked on the writer's fast path (it takes one record
    # through the slow path first); the reader must skip them, counted, and go on.
    assert w.write(1, b"warm-up")
    for rtype in (0, 65535, 9, 2):
        w.write(rtype, b"r%d" % rtype)
    assert w.write(1, b"last")
    data = memoryview(c.obj)[L.CONTROL_SIZE :]
    r = RingReader(0, c, data, types={1, 2})
    out = r.read()
    assert out == [(1, b"warm-up"), (2, b"r2"), (1, b"last")]
    s = r.stats()
    assert s.corrupt_events == s.written_records - 3
    assert s.skipped_bytes == 16 * s.corrupt_events
    assert s.skipped_records == s.corrupt_events


def test_threads_of_one_process_are_serialized() -> None:
    w, r, _ = anonymous_ring(1 << 16)
    threads, per = 4, 3000
    got: list[tuple[int, bytes]] = []
    done = threading.Event()

    def produce(tid: int) -> None:
        for i in range(per):
            payload = b"%d:%d:" % (tid, i) + b"p" * (i % 97)
            while not w.write(tid + 1, payload):
                pass  # full: the reader thread makes room

    def consume() -> None:
        while not done.is_set() or r.pending():
            got.extend(r.read(256))
            r.commit()

    reader = threading.Thread(target=consume)
    reader.start()
    workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    done.set()
    reader.join()
    assert len(got) == threads * per
    for tid in range(threads):
        seq = [int(p.split(b":")[1]) for rtype, p in got if rtype == tid + 1]
        assert seq == list(range(per))
    assert r.stats().corrupt_events == 0


def test_writer_inherited_across_fork_is_disabled_in_the_child() -> None:
    w, r, _ = anonymous_ring(CAP)
    assert w.write(1, b"parent-1")
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        ok = w.write(1, b"child")
        os.write(wr, b"%d %d" % (ok, w.disabled_drops))
        os._exit(0)
    os.close(wr)
    answer = os.read(rd, 64)
    os.close(rd)
    os.waitpid(pid, 0)
    assert answer == b"0 1"
    assert w.write(1, b"parent-2")
    assert r.read() == [(1, b"parent-1"), (1, b"parent-2")]


def test_records_skipped_to_the_tail_are_counted_by_a_reader_that_never_caught_up() -> None:
    """A reader started on a backlog (a new reporter) has no catch-up point yet: it counts
    the records lost in the bytes it skips from the slot's lifetime words."""
    w, _, c = anonymous_ring(CAP)
    for i in range(6):
        assert w.write(1, b"r%d" % i)
    data = memoryview(c.obj)[L.CONTROL_SIZE :]
    third = 2 * 16  # each record: 8-byte header + 2-byte payload, padded to 16
    data[third : third + 8] = b"\xff" * 8
    r = RingReader(0, c, data)
    assert r.read() == [(1, b"r0"), (1, b"r1")]
    assert r.read() == []  # the bad header got its second chance: skipped to the tail
    assert r.cursor == int(c[L.C_TAIL])
    assert r.stats().skipped_records == 4
    assert w.write(1, b"after") and r.read() == [(1, b"after")]
    assert r.stats().skipped_records == 4
