"""The arena file: creation, permissions, discovery, stale clean-up, locks, status, doorbell."""

from __future__ import annotations

import json
import os
import select
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import ipc
from ipc import Arena, ArenaError, DoorbellListener, arena_path, cleanup_stale, discover
from ipc import _layout as L
from ipc.private import private_directory
from ipc.wakeup import fifo_path
from tests.children import fork, reap


class Pipe:
    """A one-way byte channel to a forked child; reads wait (bounded) for data."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()

    def send(self, data: bytes) -> None:
        os.write(self.w, data)

    def recv(self, timeout: float = 30.0) -> bytes:
        ready, _, _ = select.select([self.r], [], [], timeout)
        assert ready, "child did not answer"
        return os.read(self.r, 65536)

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


@pytest.fixture
def pipes() -> Iterator[Callable[[], Pipe]]:
    made: list[Pipe] = []

    def make() -> Pipe:
        made.append(Pipe())
        return made[-1]

    yield make
    for p in made:
        p.close()


@pytest.fixture
def path(tmp_path: Path) -> str:
    return arena_path(os.getpid(), str(tmp_path))


def test_default_location_name_and_mode() -> None:
    assert ipc.DEFAULT_DIRECTORY == "/dev/shm"
    assert (ipc.DEFAULT_SLOTS, ipc.DEFAULT_RING_CAPACITY) == (64, 4 * 1024 * 1024)
    p = arena_path(os.getpid())
    ticks = ipc.process_start_ticks(os.getpid())
    assert p == f"/dev/shm/swmp-{os.getuid()}/swmp-{os.getuid()}-{os.getpid()}-{ticks}.arena"
    assert os.lstat(os.path.dirname(p)).st_mode & 0o7777 == 0o700  # the private directory
    a = Arena.create(p, slots=2, ring_capacity=4096)
    try:
        assert os.stat(p).st_mode & 0o777 == 0o600
        assert p in list(discover())
    finally:
        a.close()
        a.unlink()
    assert not os.path.exists(p) and not os.path.exists(fifo_path(p))


def test_mode_is_0600_whatever_the_umask(path: str) -> None:
    old = os.umask(0)
    try:
        a = Arena.create(path, slots=1, ring_capacity=4096)
    finally:
        os.umask(old)
    try:
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert os.stat(fifo_path(path)).st_mode & 0o777 == 0o600
    finally:
        a.close()


def test_header_and_layout(path: str) -> None:
    a = Arena.create(path, slots=3, ring_capacity=8192, meta=b'{"service":"s"}')
    try:
        regions = L.HEADER_SIZE + L.STATUS_SIZE + L.BOARD_SIZE
        assert os.path.getsize(path) == regions + 3 * (L.CONTROL_SIZE + 8192)
        info = ipc.read_info(path)
        assert (info.slots, info.ring_capacity) == (3, 8192)
        assert (info.owner_pid, info.uid) == (os.getpid(), os.getuid())
        assert info.meta == b'{"service":"s"}' and info.owner_alive
        with pytest.raises(FileExistsError):
            Arena.create(path)
    finally:
        a.close()


def test_bad_files_are_refused(tmp_path: Path) -> None:
    junk = tmp_path / "swmp-junk.arena"
    junk.write_bytes(b"\0" * (L.SLOTS_OFFSET + 64))
    with pytest.raises(ArenaError):
        Arena.open(str(junk), wait_s=0)
    with pytest.raises(ArenaError):
        Arena.create(str(tmp_path / "x.arena"), ring_capacity=5000)


def test_exactly_one_of_many_racing_processes_creates(path: str, pipes: Callable[[], Pipe]) -> None:
    n = 6
    go, answers = pipes(), pipes()

    def racer() -> None:
        os.read(go.r, 1)
        a = Arena.create_or_open(path, slots=4, ring_capacity=4096)
        st = os.fstat(a._shared.descriptor())
        answers.send(json.dumps([a.created, st.st_ino, a.slots]).encode() + b"\n")
        a.close()

    pids = [fork(racer) for _ in range(n)]
    go.send(b"g" * n)  # released together
    out = b""
    while out.count(b"\n") < n:
        out += answers.recv()
    assert [reap(pid) for pid in pids] == [0] * n
    results = [json.loads(line) for line in out.splitlines()]
    assert sum(created for created, _, _ in results) == 1
    assert len({ino for _, ino, _ in results}) == 1
    assert all(slots == 4 for _, _, slots in results)


def test_slot_claims_are_exclusive_lowest_first_and_released_by_death(
    path: str, pipes: Callable[[], Pipe]
) -> None:
    a = Arena.create(path, slots=3, ring_capacity=4096)
    try:
        done, hold = pipes(), pipes()

        def holder() -> None:
            w = a.claim_slot()
            done.send(b"%d" % (w.slot if w else -1))
            os.read(hold.r, 1)  # keep it until told (or killed)

        pid = fork(holder)
        assert done.recv() == b"0"
        assert a.slot_owner(0) == pid and a.live_slots() == {0: pid}
        mine = a.claim_slot()
        assert mine is not None and mine.slot == 1
        assert a.own_slots() == {1} and a.live_slots() == {0: pid}  # own slots are not "live"
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert a.slot_owner(0) is None  # no cooperation from the dead process needed
        again = a.claim_slot()
        assert again is not None and again.slot == 0
        assert a.claim_slot() is not None
        assert a.claim_slot() is None  # all three are ours now
        assert a.slot_identity(0)[:2] == (os.getpid(), 2)
    finally:
        a.close()


def test_one_process_never_claims_a_slot_twice_and_closing_a_second_handle_keeps_locks(
    path: str, pipes: Callable[[], Pipe]
) -> None:
    """POSIX locks are per process and die with *any* close(): the registry prevents both."""
    a = Arena.create(path, slots=4, ring_capacity=4096)
    b = Arena.open(path)
    try:
        w1 = a.claim_slot()
        w2 = b.claim_slot()
        assert w1 is not None and w2 is not None and (w1.slot, w2.slot) == (0, 1)
        assert b.try_become_reporter() and not a.try_become_reporter()
        info = ipc.read_info(path)  # opens and closes the file again
        assert info.slots == 4
        b2 = Arena.open(path)
        b2.close()
        answer = pipes()

        def probe() -> None:
            probe_arena = Arena.open(path)
            answer.send(json.dumps([probe_arena.live_slots(), probe_arena.reporter_pid()]).encode())

        pid = fork(probe)
        slots, reporter = json.loads(answer.recv())
        assert reap(pid) == 0
        assert slots == {"0": os.getpid(), "1": os.getpid()} and reporter == os.getpid()
        b.close()  # releases what b took (slot 1, the reporter role), nothing of a's
        assert a.own_slots() == {0}
        assert w2.write(1, b"x") is False  # its slot is gone: the writer is disabled
        assert w1.write(1, b"x") is True
        assert a.try_become_reporter()
    finally:
        a.close()
        b.close()


def test_a_child_that_closed_the_inherited_descriptor_claims_through_the_arena_again(
    path: str, tmp_path: Path, pipes: Callable[[], Pipe]
) -> None:
    """A forked child closes every inherited descriptor (billiard's ``close_open_fds`` in
    Celery's embedded beat) and the number goes to another file: the child's claim must not
    lock a byte of that file (it would take slot 0, held by the parent) nor close it."""
    arena = Arena.create(path, slots=4, ring_capacity=4096)
    try:
        w0 = arena.claim_slot()
        assert w0 is not None and w0.slot == 0
        arena._doorbell()  # the parent rang once: its descriptor of the FIFO is open
        assert arena._doorbell._fd >= 0
        answer = pipes()

        def child() -> None:
            fds = sorted((arena._shared.fd, arena._doorbell._fd))
            for fd in fds:
                os.close(fd)
            # Other files take exactly those numbers (dup2: a lower number left free by
            # earlier tests must not decide which number the new file gets).
            others = []
            for i, fd in enumerate(fds):
                new = os.open(str(tmp_path / f"other{i}"), os.O_RDWR | os.O_CREAT, 0o600)
                if new != fd:
                    os.dup2(new, fd)
                    os.close(new)
                others.append(fd)
            writer = arena.claim_slot()
            assert writer is not None and writer.write(1, b"y")
            slots = arena.live_slots()
            arena.release_slot()
            arena.close()
            for fd in others:  # still open: never closed a number that is not the agent's
                os.fstat(fd)
            answer.send(json.dumps([writer.slot, slots]).encode())

        pid = fork(child)
        slot, slots = json.loads(answer.recv())
        assert reap(pid) == 0
        assert slot == 1 and slots == {"0": os.getpid()}
        assert arena.live_slots() == {} and arena.own_slots() == {0}
    finally:
        arena.close()


def _close_the_arena_descriptor(arena: Arena, other: Path) -> None:
    """What a program that closes every descriptor it did not open does to the arena's: the
    number closed (the kernel drops the process's slot locks with it), then another file of
    the program's takes it."""
    fd = arena._shared.fd
    os.close(fd)
    new = os.open(str(other), os.O_RDWR | os.O_CREAT, 0o600)
    if new != fd:
        os.dup2(new, fd)
        os.close(new)


@pytest.mark.parametrize("taken_meanwhile", [False, True], ids=["free", "claimed-meanwhile"])
def test_a_process_that_closed_the_arena_descriptor_holds_its_slot_again(
    path: str, tmp_path: Path, pipes: Callable[[], Pipe], taken_meanwhile: bool
) -> None:
    """The slot lock went with the closed descriptor: the next use of the arena (which opens
    it again) takes it again, so no other process claims the ring this one still writes and
    readers see the slot held. Before, the slot showed free for good. If another process
    claimed it in between, the slot is not this process's any more."""
    arena = Arena.create(path, slots=4, ring_capacity=4096)
    try:
        closed, go_on, answer, hold = pipes(), pipes(), pipes(), pipes()

        def child() -> None:
            writer = arena.claim_slot()
            assert writer is not None and writer.slot == 0
            _close_the_arena_descriptor(arena, tmp_path / "app.log")
            closed.send(b"1")
            go_on.recv()
            arena.slot_owner(3)  # any use of the arena opens it again
            answer.send(json.dumps([sorted(arena.own_slots()), writer.write(1, b"z")]).encode())
            hold.recv()
            os.fstat(arena._shared.fd)
            assert os.path.getsize(tmp_path / "app.log") == 0  # never touched

        pid = fork(child)
        try:
            closed.recv()
            assert arena.slot_owner(0) is None  # the lock went with the descriptor
            if taken_meanwhile:
                mine = arena.claim_slot()
                assert mine is not None and mine.slot == 0
            go_on.send(b"1")
            held, wrote = json.loads(answer.recv())
            if taken_meanwhile:  # the child's writer stops: the ring is this process's now
                assert held == [] and not wrote
                assert arena.slot_owner(0) is None and arena.own_slots() == {0}
            else:
                assert held == [0] and wrote and arena.slot_owner(0) == pid and arena.live_slots() == {0: pid}
        finally:
            hold.send(b"1")
            assert reap(pid) == 0
    finally:
        arena.close()


def test_reporter_lock_is_exclusive_across_processes(path: str, pipes: Callable[[], Pipe]) -> None:
    a = Arena.create(path, slots=1, ring_capacity=4096)
    try:
        ready, hold = pipes(), pipes()

        def reporter() -> None:
            ready.send(b"1" if a.try_become_reporter() else b"0")
            os.read(hold.r, 1)

        pid = fork(reporter)
        assert ready.recv() == b"1"
        assert a.reporter_pid() == pid
        assert not a.try_become_reporter()
        assert a.status.snapshot().reporter_pid == pid
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert a.reporter_pid() is None
        assert a.try_become_reporter() and a.is_reporter
        snap = a.status.snapshot()
        assert snap.reporter_pid == os.getpid() and snap.reporter_starts == 2
    finally:
        a.close()


def dead_pid() -> int:
    pid = fork(lambda: None)
    assert reap(pid) == 0
    return pid


def test_cleanup_stale_removes_only_arenas_nobody_uses(tmp_path: Path, pipes: Callable[[], Pipe]) -> None:
    d = str(tmp_path)
    p = private_directory(d)  # where the agent puts them (0700, ours)
    gone = dead_pid()
    stale = Arena.create(os.path.join(p, f"swmp-{os.getuid()}-{gone}-0.arena"), 1, 4096, owner_pid=gone)
    stale.close()
    alive = Arena.create(arena_path(os.getpid(), d), 1, 4096)
    guarded = Arena.create(os.path.join(p, f"swmp-{os.getuid()}-{gone}-1.arena"), 2, 4096, owner_pid=gone)
    working = Arena.create(os.path.join(p, f"swmp-{os.getuid()}-{gone}-2.arena"), 2, 4096, owner_pid=gone)
    young_junk = Path(p) / f"swmp-{os.getuid()}-{gone}-9.arena"
    young_junk.write_bytes(b"half-created")
    old_junk = Path(p) / f"swmp-{os.getuid()}-{gone}-8.arena"
    old_junk.write_bytes(b"")
    os.utime(old_junk, (time.time() - 60, time.time() - 60))
    orphan_fifo = Path(p) / f"swmp-{os.getuid()}-{gone}-7.arena.wake"
    os.mkfifo(orphan_fifo)
    ready, hold = pipes(), pipes()

    def orphaned_reporter_and_worker() -> None:
        assert guarded.try_become_reporter()  # a reporter still draining: keep
        assert working.claim_slot() is not None  # a worker that outlived its master: keep
        ready.send(b"ok")
        os.read(hold.r, 1)

    pid = fork(orphaned_reporter_and_worker)
    try:
        assert ready.recv() == b"ok"
        removed = cleanup_stale(d)
        assert sorted(removed) == sorted([stale.path, str(old_junk)])
        assert not os.path.exists(fifo_path(stale.path)) and not orphan_fifo.exists()
        for kept in (alive.path, guarded.path, working.path, str(young_junk)):
            assert os.path.exists(kept)
    finally:
        hold.send(b"x")
        assert reap(pid) == 0
    assert sorted(cleanup_stale(d)) == sorted([guarded.path, working.path])  # now unused
    for a in (alive, guarded, working):
        a.close()


def test_a_reused_owner_pid_does_not_keep_an_arena_alive(tmp_path: Path) -> None:
    """The owner's start time is part of its identity: same pid, other process = gone."""
    name = f"swmp-{os.getuid()}-{os.getpid()}-0.arena"
    a = Arena.create(os.path.join(private_directory(str(tmp_path)), name), 1, 4096)
    assert a.info().owner_alive
    a._header[L.H_OWNER_START] = ipc.process_start_ticks(os.getpid()) + 1  # "an earlier process"
    assert not a.info().owner_alive
    assert not ipc.process_alive(os.getpid(), ipc.process_start_ticks(os.getpid()) + 1)
    a.close()
    assert cleanup_stale(str(tmp_path)) == [a.path]


def test_discover_lists_our_arenas_newest_first(tmp_path: Path) -> None:
    d = str(tmp_path)
    p = private_directory(d)  # where the agent puts them (0700, ours)
    older = Arena.create(os.path.join(p, f"swmp-{os.getuid()}-1-1.arena"), 1, 4096)
    os.utime(older.path, (time.time() - 100, time.time() - 100))
    newer = Arena.create(os.path.join(p, f"swmp-{os.getuid()}-2-2.arena"), 1, 4096)
    (Path(p) / f"swmp-{os.getuid() + 1}-3-3.arena").write_bytes(b"")  # another user's name
    (tmp_path / "other-0-1.arena").write_bytes(b"")
    try:
        assert list(discover(d)) == [newer.path, older.path]
    finally:
        older.close()
        newer.close()


def test_stale_file_with_our_name_is_replaced(tmp_path: Path) -> None:
    """A directory that survives a reboot can hold a dead owner's file under our name."""
    p = arena_path(os.getpid(), str(tmp_path))
    old = Arena.create(p, 1, 4096)
    old._header[L.H_CREATED_NS] = 1  # created before this boot
    old.close()
    a = Arena.create_or_open(p, 2, 4096)
    try:
        assert a.created and a.slots == 2
    finally:
        a.close()


def test_status_seqlock_never_shows_a_torn_document(path: str, pipes: Callable[[], Pipe]) -> None:
    a = Arena.create(path, slots=1, ring_capacity=4096)
    try:
        ready = pipes()

        def publisher() -> None:
            assert a.try_become_reporter()
            ready.send(b"go")
            deadline = time.monotonic() + 20
            i = 0
            while time.monotonic() < deadline:
                body = str(i) * (1 + i % 500)  # length and content change every time
                a.status.publish(json.dumps({"i": i, "body": body}).encode())
                a.status.heartbeat()
                i += 1

        pid = fork(publisher)
        try:
            assert ready.recv() == b"go"
            seen: set[int] = set()
            checked = 0
            deadline = time.monotonic() + 15
            while (len(seen) < 50 or checked < 2000) and time.monotonic() < deadline:
                doc = a.status.snapshot().document
                if doc:
                    d = json.loads(doc)  # a torn document would not even parse...
                    assert d["body"] == str(d["i"]) * (1 + d["i"] % 500)  # ...or not match
                    seen.add(d["i"])
                    checked += 1
            assert len(seen) >= 2 and checked > 0  # it really was rewritten while we read
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert not a.status.publish(b"x" * (L.DOC_MAX + 1))
    finally:
        a.close()


def test_doorbell_wakes_a_sleeping_reader_in_another_process(path: str, pipes: Callable[[], Pipe]) -> None:
    a = Arena.create(path, slots=1, ring_capacity=4096)
    try:
        asleep, result = pipes(), pipes()

        def reader() -> None:
            listener = DoorbellListener(path)
            r = a.reader(0)
            a.status.set_sleeping(True)
            if r.pending():  # the protocol: re-check after announcing sleep
                result.send(b"pending before sleep")
                return
            asleep.send(b"z")
            rung = listener.wait(60.0)  # the bounded poll; the bell must come long before
            a.status.set_sleeping(False)
            result.send(json.dumps([rung, r.read()[0][1].decode()]).encode())

        pid = fork(reader)
        try:
            assert asleep.recv() == b"z"
            assert a.status.snapshot().reader_sleeping
            w = a.claim_slot()
            assert w is not None
            t0 = time.monotonic()
            # A quarter of the ring unread: the writer rings (less stays for the reader's timer).
            big = "wake up".ljust(4096 >> L.WAKE_FILL_SHIFT)
            assert w.write(1, big.encode())
            assert json.loads(result.recv(timeout=30)) == [True, big]
            assert time.monotonic() - t0 < 30
        finally:
            assert reap(pid) == 0
    finally:
        a.close()


def test_writers_ring_only_a_sleeping_reader_whose_ring_fills_up(path: str) -> None:
    a = Arena.create(path, slots=1, ring_capacity=4096)
    listener = DoorbellListener(path)
    try:
        w = a.claim_slot()
        assert w is not None
        a.status.set_sleeping(False)
        for i in range(100):
            assert w.write(1, b"%d" % i)
        assert listener.drain() == 0 and not listener.wait(0)
        a.status.set_sleeping(True)
        r = a.reader(0)
        r.read()
        r.commit()
        # Asleep, but the ring is nearly empty: its timer will do, no system call per record.
        assert w.write(1, b"small")
        assert not listener.wait(0)
        # Filling up: now it rings.
        assert w.write(1, b"x" * (4096 >> L.WAKE_FILL_SHIFT))
        assert listener.wait(5.0)
    finally:
        listener.close()
        a.close()
