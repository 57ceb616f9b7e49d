"""The reader against garbage: random bytes in the data area and in the head/tail words.

Whatever the garbage, no exception escapes, reading terminates, the corruption counters
move, and the ring recovers: a valid record written afterwards is read back exactly.
"""

from __future__ import annotations

import logging
import random

import hypothesis.strategies as st
from hypothesis import HealthCheck, assume, example, given, settings

from ipc import _layout as L
from ipc.ring import RingReader, RingWriter, anonymous_ring
from tests.fuzz_budget import examples

CAP = 4096
U64 = st.integers(0, 2**64 - 1)
FUZZ = settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def header_is_valid(word: int, position: int) -> bool:
    n, rtype = word & 0xFFFFFFFF, (word >> 32) & 0xFFFF
    return word >> 48 == L.check_word(n, rtype, position, CAP)


def payloads(sizes: list[int], tag: int) -> list[bytes]:
    return [bytes([tag, i % 256]) + b"." * n for i, n in enumerate(sizes)]


def drain(r: RingReader, rounds: int = 8) -> list[tuple[int, bytes]]:
    """Read (and commit) until two empty reads in a row; bounded: no endless loop."""
    out: list[tuple[int, bytes]] = []
    empty = 0
    for _ in range(rounds):
        got = r.read(10_000)
        r.commit()
        out += got
        empty = 0 if got else empty + 1
        if empty == 2:
            return out
    raise AssertionError("reader did not settle")


@FUZZ
@given(
    done=st.lists(st.integers(0, 300), max_size=12),
    unread=st.lists(st.integers(0, 300), min_size=1, max_size=8),
    first_bad=st.integers(0, 7),
    garbage=st.binary(min_size=8, max_size=CAP),
)
def test_garbage_in_the_data_area(done: list[int], unread: list[int], first_bad: int, garbage: bytes) -> None:
    logging.getLogger("ipc").setLevel(logging.CRITICAL)
    w, r, c = anonymous_ring(CAP)
    for p in payloads(done, 1):
        assert w.write(1, p)
    r.read(10_000)
    r.commit()
    recs = payloads(unread, 2)
    starts = []
    for p in recs:
        starts.append(int(c[L.C_TAIL]))
        assert w.write(2, p)
    # Clobber from the start of one unread record (which may be a padding record before
    # it) up to the tail with garbage, as a stray write or a second writer would.
    first_bad = min(first_bad, len(recs) - 1)
    bad_at = starts[first_bad]
    tail = int(c[L.C_TAIL])
    data = memoryview(c.obj)[L.CONTROL_SIZE :]
    pos = bad_at
    chunk = (garbage * (CAP // len(garbage) + 1))[: tail - bad_at]
    for i in range(0, len(chunk), 8):
        off = (pos + i) % CAP
        data[off : off + 8] = chunk[i : i + 8].ljust(8, b"\0")
    words = data.cast("Q")
    assume(not header_is_valid(words[(bad_at % CAP) >> 3], bad_at))

    got = drain(r)
    assert got == [(2, p) for p in recs[:first_bad]]
    s = r.stats()
    assert s.corrupt_events >= 1
    assert s.skipped_bytes == tail - bad_at
    # Every record in the clobbered bytes is counted as lost, none more.
    assert s.skipped_records == len(recs) - first_bad
    assert r.cursor == tail

    assert w.write(3, b"after the garbage")
    assert r.read() == [(3, b"after the garbage")]
    assert r.stats().skipped_records == len(recs) - first_bad


@FUZZ
@given(
    data=st.tuples(st.binary(min_size=8, max_size=CAP), st.integers(0, 2**32)),
    head=st.one_of(U64, st.integers(0, 3 * CAP)),
    tail=st.one_of(U64, st.integers(0, 3 * CAP)),
    fresh_writer=st.booleans(),
    fresh_reader=st.booleans(),
)
# A head just under the position limit: rounded up to an aligned position it was the limit
# itself, which the writer never accepts, so the ring never recovered.
@example(data=(b"\0" * 8, 0), head=L.POSITION_LIMIT - 7, tail=0, fresh_writer=False, fresh_reader=True)
def test_everything_random(
    data: tuple[bytes, int], head: int, tail: int, fresh_writer: bool, fresh_reader: bool
) -> None:
    """Random ring bytes and random position words: bounded, no exception, recovers.

    ``fresh_*``: the writer (a process claiming the slot) or the reader (a restarted
    reporter) is created after the garbage, so it starts from the garbage words.
    """
    logging.getLogger("ipc").setLevel(logging.CRITICAL)
    w, r, c = anonymous_ring(CAP)
    ring = memoryview(c.obj)[L.CONTROL_SIZE :]
    given_bytes, seed = data  # the rest of the ring is filled from a seeded generator
    ring[:] = given_bytes + random.Random(seed).randbytes(CAP - len(given_bytes))
    c[L.C_HEAD] = head
    c[L.C_TAIL] = tail
    if fresh_writer:
        w = RingWriter(0, c, ring, memoryview(bytearray(L.STATUS_SIZE)).cast("Q"))
    if fresh_reader:
        r = RingReader(0, c, ring)
    drain(r)
    assert_recovers(w, r)


def assert_recovers(w: RingWriter, r: RingReader, rounds: int = 6) -> None:
    """Within a few write/read rounds a record comes through, and then every one does."""
    for i in range(rounds):
        marker = b"marker-%d" % i
        w.write(5, marker)
        got = drain(r)
        if got and got[-1] == (5, marker):
            break
    else:
        raise AssertionError(f"no record came through: {r.stats()}")
    for i in range(20):
        payload = b"steady-%d" % i + b"x" * (i * 37)
        assert w.write(6, payload)
        assert r.read() == [(6, payload)]
        r.commit()


@FUZZ
@given(
    done=st.lists(st.integers(0, 500), max_size=10),
    unread=st.lists(st.integers(0, 200), max_size=6),
    head=st.one_of(U64, st.integers(0, 3 * CAP)),
    tail=st.one_of(U64, st.integers(0, 3 * CAP)),
    writer_first=st.booleans(),
)
def test_garbage_in_head_and_tail_words(
    done: list[int], unread: list[int], head: int, tail: int, writer_first: bool
) -> None:
    """The same writer and reader carry on: nothing unread is lost or duplicated."""
    logging.getLogger("ipc").setLevel(logging.CRITICAL)
    w, r, c = anonymous_ring(CAP)
    for p in payloads(done, 1):
        assert w.write(1, p)
        r.read(10_000)
        r.commit()
    recs = payloads(unread, 2)
    boundaries = {int(c[L.C_TAIL])}
    for p in recs:
        assert w.write(2, p)
        boundaries.add(int(c[L.C_TAIL]))
    real_head, real_tail = int(c[L.C_HEAD]), int(c[L.C_TAIL])
    c[L.C_HEAD] = head
    c[L.C_TAIL] = tail

    got: list[tuple[int, bytes]] = []
    if not writer_first:
        got += r.read(10_000)
    if not w.write(3, b"after"):
        # Only possible when the write went the slow way and met the garbage head before
        # the reader rewrote it.
        assert writer_first
        got += r.read(10_000)
        assert w.write(3, b"after")
    got += drain(r)
    assert got == [(2, p) for p in recs] + [(3, b"after")]
    s = r.stats()
    if head != real_head:
        assert s.corrupt_events > 0  # the reader rewrote it
    if tail not in boundaries and not writer_first:
        assert s.corrupt_events > 0  # a tail the writer did not fix first is noticed
    assert s.skipped_bytes == 0
    assert int(c[L.C_HEAD]) == r.head == int(c[L.C_TAIL]) > real_tail
