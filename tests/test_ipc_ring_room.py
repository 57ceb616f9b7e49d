"""The file system's room for the arena's pages is taken before they are touched
(``ipc/ring_room.py``): a full tmpfs drops and counts records instead of killing the writer
with SIGBUS.

The end-to-end test mounts a 1 MiB tmpfs (it needs the right to mount: root here, skipped
elsewhere) and fills it from a writer in a child process, as a container's small
``/dev/shm`` fills up with busy workers' rings."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipc import Arena, ring_room

ROOT = Path(__file__).resolve().parent.parent


class Reservations:
    """Stands in for fallocate: records the ranges asked for; refuses while ``full``."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.full = False

    def __call__(self, fd: int, offset: int, length: int) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.calls.append((offset, length))


@pytest.fixture()
def reservations(monkeypatch: pytest.MonkeyPatch) -> Reservations:
    r = Reservations()
    monkeypatch.setattr(ring_room, "reserve", r)
    monkeypatch.setattr(ring_room, "_now", lambda: 100.0)
    return r


def test_a_stretch_at_a_time_then_nothing_once_a_lap_is_backed(reservations: Reservations) -> None:
    room = ring_room.RingRoom(lambda: 3, 4096, 1 << 16, stretch=1 << 12, tail=0)
    assert room.make(100) and room.reserved == 4096
    assert reservations.calls == [(4096, 4096)]
    assert room.make(4096) and len(reservations.calls) == 1  # already reserved: no call
    assert room.make(5000) and reservations.calls[-1] == (4096 + 4096, 4096)
    assert room.make((1 << 16) - 8)  # the rest of the lap in one call
    assert room.reserved == ring_room.EVERYTHING
    calls = len(reservations.calls)
    assert room.make(10 << 16) and len(reservations.calls) == calls  # every page is backed


def test_freed_pages_are_reserved_again_before_their_next_use(reservations: Reservations) -> None:
    cap = 1 << 16
    room = ring_room.RingRoom(lambda: 3, 0, cap, stretch=1 << 12, tail=0)
    assert room.make(cap) and room.reserved == ring_room.EVERYTHING
    room.freed(8192, 20000)  # the returner punched out what the reader was done with
    assert room.reserved == 8192 + cap
    reservations.calls.clear()
    assert room.make(8192 + cap + 10)  # the first freed page comes round again
    assert reservations.calls == [(8192, 4096)]  # the same bytes of the file, a lap later
    assert room.make(20000 + 2 * cap)  # past the freed stretch and a whole lap: all backed
    assert room.reserved == ring_room.EVERYTHING


def test_a_range_across_the_end_of_the_ring_wraps(reservations: Reservations) -> None:
    cap = 1 << 16
    room = ring_room.RingRoom(lambda: 3, 4096, cap, stretch=1 << 13, tail=cap - 4096)
    assert room.make(cap + 100)
    assert reservations.calls == [(4096 + cap - 4096, 4096), (4096, 8192)]  # up to the stretch after


def test_no_room_refuses_and_asks_again_after_a_while(
    reservations: Reservations, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [100.0]
    monkeypatch.setattr(ring_room, "_now", lambda: clock[0])
    room = ring_room.RingRoom(lambda: 3, 0, 1 << 16, stretch=1 << 12, tail=0)
    reservations.full = True
    assert not room.make(10)
    reservations.full = False
    assert not room.make(10)  # within RETRY_SECONDS: no system call
    assert reservations.calls == []
    clock[0] += 2 * ring_room.RETRY_SECONDS
    assert room.make(10) and reservations.calls == [(0, 4096)]


# -- a real, full tmpfs ------------------------------------------------------------------------
@pytest.fixture()
def small_tmpfs() -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    where = Path(tempfile.mkdtemp(prefix="swmp-small-shm-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(where)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


FILL = """
import sys
from ipc import Arena

arena = Arena.create(sys.argv[1], slots=4, ring_capacity=1 << 20)
writers = [arena.claim_slot() for _ in range(2)]
written = dropped = 0
for i in range(4000):  # 2 x 1 MiB of rings on a 1 MiB file system
    for w in writers:
        if w.write(1, b"x" * 1000):
            written += 1
        else:
            dropped += 1
stats = [w.stats() for w in writers]
print(written, dropped, sum(s.dropped_records for s in stats))
"""


def test_a_full_file_system_drops_records_instead_of_killing_the_writer(small_tmpfs: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", FILL, str(small_tmpfs / "full.arena")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode != -signal.SIGBUS, "the writer died of SIGBUS on the full tmpfs"
    assert proc.returncode == 0, proc.stderr
    written, dropped, counted = map(int, proc.stdout.split())
    assert written > 0 and dropped > 0  # it wrote while there was room, then dropped
    assert counted == dropped  # and counted what it dropped where `swmp status` reads it
    assert proc.stderr.count("no room for the ring's pages") <= 2  # logged once per writer


def test_an_arena_that_cannot_get_its_fixed_parts_is_not_created(small_tmpfs: Path) -> None:
    # 4096 slots' control blocks (1 MiB apart) need more than the 1 MiB file system has.
    with pytest.raises(OSError) as info:
        Arena.create(str(small_tmpfs / "big.arena"), slots=4096, ring_capacity=1 << 20)
    assert info.value.errno == errno.ENOSPC
    assert not (small_tmpfs / "big.arena").exists()
