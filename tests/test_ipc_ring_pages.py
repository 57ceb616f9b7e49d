"""A ring gives the pages its reader is done with back to the system (ipc/ring_pages.py).

Proof on a real tmpfs arena, as the agent makes it: after a writer has written several laps
of its ring as fast as it can (a saturated worker), only a fraction of the ring stays
allocated in the file; records not read yet keep their pages until they are; every record
still arrives intact, also with a writer in another process freeing at every stretch against
a concurrent reader (a page freed too early would come back zeroed and fail the record
check); and a mapping that cannot free pages keeps working as before.
"""

from __future__ import annotations

import mmap
import os
import random
import shutil
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import ipc
from ipc import _layout as L
from ipc.ring_pages import PageReturner, page_returner
from ipc.ring_reader import RingReader
from ipc.ring_writer import RingWriter

ROOT = Path(__file__).resolve().parent.parent
RING = 4 << 20


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A private directory on tmpfs (where the agent puts its arena by default)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    d = Path(tempfile.mkdtemp(prefix="swmp-pages-", dir=base))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _record(seq: int, rng: random.Random) -> bytes:
    body = rng.randbytes(rng.randrange(100, 3000))
    return seq.to_bytes(8, "little") + zlib.crc32(body).to_bytes(4, "little") + body


def _check(seq: int, payload: bytes) -> None:
    assert int.from_bytes(payload[:8], "little") == seq
    assert zlib.crc32(payload[12:]) == int.from_bytes(payload[8:12], "little"), f"record {seq} damaged"


def _ring_allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512 - (L.SLOTS_OFFSET + L.CONTROL_SIZE)


def _write_laps(arena: ipc.Arena, writer: RingWriter, first: int, count: int) -> int:
    """``count`` records (~1.5 KiB each) in bursts, each burst read and committed after it."""
    reader = arena.reader(writer.slot)
    sent = got = first
    while sent < first + count:
        for _ in range(150):  # a burst of ~230 KiB, then the reporter reads it
            assert writer.write(5, _record(sent, random.Random(sent)))
            sent += 1
        for rtype, payload in reader.read():
            assert rtype == 5
            _check(got, payload)
            got += 1
        reader.commit()
    assert got == sent
    assert writer.stats().dropped_records == 0
    return sent


def test_a_busy_ring_written_round_several_times_keeps_little_of_it_allocated(shm_dir: Path) -> None:
    arena = ipc.Arena.create(str(shm_dir / "a.arena"), slots=1, ring_capacity=RING)
    try:
        writer = arena.claim_slot()
        assert writer is not None
        _write_laps(arena, writer, 0, 20_000)  # ~30 MiB as fast as it goes: seven laps
        # Without returning pages the whole 4 MiB ring stays allocated; with it, what was
        # read since the last stretch, the next stretch and the stretch being written.
        assert _ring_allocated(shm_dir / "a.arena") < RING // 4
    finally:
        arena.close()


def test_unread_records_keep_their_pages_until_read(shm_dir: Path) -> None:
    arena = ipc.Arena.create(str(shm_dir / "a.arena"), slots=1, ring_capacity=RING)
    try:
        writer = arena.claim_slot()
        assert writer is not None
        sent = _write_laps(arena, writer, 0, 6_000)  # two laps and more
        unread = waiting = 0
        while unread < RING // 2:  # a reporter that has not come round: half a ring waits
            record = _record(sent + waiting, random.Random(sent + waiting))
            assert writer.write(5, record)
            unread += len(record) + L.RECORD_HEADER_SIZE
            waiting += 1
        assert _ring_allocated(shm_dir / "a.arena") >= RING // 2 - RING // 32
        reader = arena.reader(writer.slot)
        records = reader.read(waiting + 1)
        assert len(records) == waiting
        for i, (_rtype, payload) in enumerate(records):
            _check(sent + i, payload)
        reader.commit()
        _write_laps(arena, writer, sent + waiting, 300)  # a few stretches: the read half goes
        assert _ring_allocated(shm_dir / "a.arena") < RING // 4
    finally:
        arena.close()


WRITER = """
import random, sys, zlib
sys.path.insert(0, sys.argv[1])
import ipc
arena = ipc.Arena.open(sys.argv[2])
w = arena.claim_slot()
rng = random.Random(11)
for seq in range(int(sys.argv[3])):
    body = rng.randbytes(rng.randrange(100, 3000))
    rec = seq.to_bytes(8, "little") + zlib.crc32(body).to_bytes(4, "little") + body
    while not w.write(5, rec):  # the ring is full: wait for the reader (counted as drops)
        pass
"""


@pytest.mark.parametrize("pure", [False, True], ids=["native-writer", "pure-writer"])
def test_records_arrive_intact_while_a_writer_in_another_process_races_the_reader(
    shm_dir: Path, pure: bool
) -> None:
    path = shm_dir / "a.arena"
    arena = ipc.Arena.create(str(path), slots=1, ring_capacity=RING)
    n = 12_000  # ~18 MiB, four laps and more
    env = {**os.environ, "SWMP_RING_PURE": "1" if pure else "0"}
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(ROOT), str(path), str(n)], env=env)
    try:
        reader = arena.reader(0)
        got = 0
        while got < n:
            records = reader.read()
            for _rtype, payload in records:
                _check(got, payload)
                got += 1
            reader.commit()
            if not records:
                assert child.poll() is None or got == n or reader.pending(), "the writer stopped early"
                os.sched_yield()
        child.communicate(timeout=60)
        assert child.returncode == 0
        assert reader.stats().corrupt_events == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        arena.close()


def test_a_mapping_that_cannot_free_pages_keeps_working() -> None:
    # A private anonymous mapping: MADV_REMOVE is refused (EINVAL), as on a file system
    # without hole punching.
    mm = mmap.mmap(-1, L.CONTROL_SIZE + RING, flags=mmap.MAP_PRIVATE)
    control = memoryview(mm)[: L.CONTROL_SIZE].cast("Q")
    data = memoryview(mm)[L.CONTROL_SIZE :]
    pages = page_returner(mm, L.CONTROL_SIZE, RING)
    assert isinstance(pages, PageReturner)
    writer = RingWriter(0, control, data, memoryview(bytearray(L.STATUS_SIZE)).cast("Q"), pages=pages)
    reader = RingReader(0, control, data)
    rng = random.Random(3)
    for seq in range(6_000):
        assert writer.write(5, _record(seq, rng))
        [(_rtype, payload)] = reader.read()
        _check(seq, payload)
        reader.commit()
    assert not pages.active  # tried once, then left alone
    assert writer.stats().dropped_records == 0


def test_small_rings_and_plain_buffers_are_left_alone() -> None:
    mm = mmap.mmap(-1, 1 << 20)
    assert page_returner(mm, 0, 64 * 1024) is None  # a few pages: not worth a system call
    assert page_returner(None, 0, RING) is None  # no mapping to free pages of
