"""Thread mode: a live reporter adopts the private arena of a process that died without
leaving (``ipc.adopt``, ``reporter_proc.adoption``), with the in-memory sender.

"Dead" processes are forked children that create a private arena, write records and
``os._exit`` (no atexit, as under ``Pool.terminate()``'s SIGTERM).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ipc import Arena, _files
from ipc.adopt import DAMAGED_MIN_AGE_S, adopt, dead_private_arenas, finish
from ipc.private import private_directory
from reporter_proc import adoption
from reporter_proc import records as R
from reporter_proc.process import ReporterThread
from reporter_proc.senders.memory import MemorySender
from tests.children import fork, reap
from tests.test_reporter_helpers import segment, wait_for, worker_start
from tests.test_reporter_loop import settings

pytestmark = pytest.mark.timeout(60)

CAPACITY = 64 * 1024
ROOT = Path(__file__).resolve().parent.parent


def private_name(directory: str, pid: int) -> str:
    return os.path.join(directory, f"swmp-{os.getuid()}-{pid}-t{os.urandom(4).hex()}.arena")


def dead_arena(
    directory: str, records: list[tuple[int, bytes]], *, read_first: int = 0, meta: bytes = b""
) -> str:
    """A private arena left by a process that wrote ``records`` and died; its own reader had
    committed the first ``read_first`` of them. Returns its path."""
    r, w = os.pipe()

    def child() -> None:
        os.close(r)
        path = private_name(directory, os.getpid())
        arena = Arena.create(path, slots=1, ring_capacity=CAPACITY, meta=meta)
        writer = arena.claim_slot()
        assert writer is not None
        for rtype, payload in records:
            assert writer.write(rtype, payload)
        if read_first:
            reader = arena.reader(0)
            assert len(reader.read(read_first)) == read_first
            reader.commit()
        os.write(w, arena.path.encode())

    pid = fork(child)
    os.close(w)
    path = os.read(r, 4096).decode()
    os.close(r)
    assert reap(pid) == 0 and path
    return path


def dead_process_records(pid: int, tag: str, n: int) -> list[tuple[int, bytes]]:
    """What a pool process writes: its WORKER_START (registry slot 3), then its segments."""
    recs = [(R.WORKER_START, worker_start(pid, 3, instance=f"dead-{tag}"))]
    return recs + [(R.SEGMENT, segment(f"{tag}-{i}", instance=f"dead-{tag}")) for i in range(n)]


@pytest.fixture
def directory(tmp_path: Any) -> str:
    return private_directory(str(tmp_path))


@pytest.fixture
def own(directory: str) -> Iterator[Arena]:
    """This process's own private arena, holding its slot as the thread sink does."""
    arena = Arena.create(private_name(directory, os.getpid()), slots=1, ring_capacity=CAPACITY)
    writer = arena.claim_slot()
    assert writer is not None
    # Our own instance has registry slot 3 too (a dead process's slot is free for the next).
    assert writer.write(R.WORKER_START, worker_start(os.getpid(), 3, instance="mine"))
    yield arena
    arena.close()


def start(own: Arena, sender: MemorySender, **kw: Any) -> ReporterThread:
    handle = ReporterThread(own.path, settings(**kw), arena=own, sender=sender)
    handle.start()
    wait_for(lambda: handle.reporter is not None and handle.reporter.ready, 5, "reporter ready")
    return handle


def test_adopted_rings_are_delivered_once_as_the_dead_process_and_removed(
    directory: str, own: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(adoption, "SCAN_EVERY_S", 0.2)
    parked = len(_files._parked)
    # Left before this process starts reporting (adopted at its start); its WORKER_START and
    # 3 of its 8 segments were sent and committed by its own thread: never sent again.
    early = dead_arena(directory, dead_process_records(11, "a", 8), read_first=4)
    sender = MemorySender()
    handle = start(own, sender)
    # Left while it runs (a long-running parent's `with Pool()` blocks): the periodic scan.
    late = dead_arena(directory, dead_process_records(12, "b", 5))
    want = [f"a-{i}" for i in range(3, 8)] + [f"b-{i}" for i in range(5)]
    wait_for(lambda: len(sender.segments) >= len(want), 10, "adopted segments")
    wait_for(lambda: not os.path.exists(early) and not os.path.exists(late), 5, "adopted arenas removed")
    assert not os.path.exists(late + ".wake")
    reporter = handle.reporter
    assert reporter is not None and reporter.adoption is not None
    assert reporter.adoption.adopted == 2 and reporter.adoption.held == {}
    # A dead instance whose WORKER_START was unread is announced once, never kept alive (the
    # other one was announced by its own thread); our own instance (the same registry slot)
    # stays in the table.
    wait_for(lambda: any(p[1] == "mine" for p in sender.properties), 5, "own instance announced")
    time.sleep(0.6)  # three keep-alive intervals
    assert handle.stop(10)
    assert sorted(s[0] for s in sender.segments) == sorted(want)
    assert {s[0]: s[3] for s in sender.segments} == {t: f"dead-{t[0]}" for t in want}
    announced = Counter(p[1] for p in sender.properties)
    assert announced["dead-a"] == 0 and announced["dead-b"] == 1, announced
    pings = Counter(k[1] for k in sender.keepalives)
    assert pings["dead-a"] == 0 and pings["dead-b"] == 1 and pings["mine"] >= 2, pings
    assert [i.instance for i in reporter.instances.values()] == ["mine"]
    assert len(_files._parked) == parked  # the adopted mappings were unmapped, not kept alive


def test_the_final_flush_adopts_what_died_just_before(directory: str, own: Arena) -> None:
    sender = MemorySender()
    handle = start(own, sender)
    path = dead_arena(directory, dead_process_records(13, "c", 4))
    assert handle.stop(10)  # the periodic scan (5 s) did not come yet
    assert sorted(s[0] for s in sender.segments) == [f"c-{i}" for i in range(4)]
    assert not os.path.exists(path)


def test_of_two_live_processes_racing_for_one_dead_arena_one_adopts_it(directory: str) -> None:
    for _ in range(5):
        path = dead_arena(directory, [(R.SEGMENT, segment(f"r-{i}")) for i in range(20)])
        go_r, go_w = os.pipe()
        out_r, out_w = os.pipe()

        def racer(go: int = go_r, out: int = out_w, path: str = path) -> None:
            os.read(go, 1)
            arena = adopt(path)
            n = 0
            if arena is not None:
                reader = arena.reader(0)
                while reader.pending():
                    n += len(reader.read())
                reader.commit()
                reader.release()
                finish(arena, unlink=True)
            os.write(out, f"{n}\n".encode())

        pids = [fork(racer), fork(racer)]
        os.write(go_w, b"gg")
        assert [reap(p) for p in pids] == [0, 0]
        os.close(out_w)
        counts = sorted(int(x) for x in os.read(out_r, 100).split())
        for fd in (go_r, go_w, out_r):
            os.close(fd)
        assert counts == [0, 20]
        assert not os.path.exists(path)


def test_an_arena_whose_owner_is_alive_is_never_touched(
    directory: str, own: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(adoption, "SCAN_EVERY_S", 0.1)
    r, w = os.pipe()
    hold_r, hold_w = os.pipe()

    def alive() -> None:
        arena = Arena.create(private_name(directory, os.getpid()), slots=1, ring_capacity=CAPACITY)
        writer = arena.claim_slot()
        assert writer is not None
        assert writer.write(R.SEGMENT, segment("alive-0"))
        os.write(w, arena.path.encode())
        os.read(hold_r, 1)  # alive, holding its slot, until told

    pid = fork(alive)
    try:
        path = os.read(r, 4096).decode()
        assert dead_private_arenas(directory) == []
        assert adopt(path) is None
        sender = MemorySender()
        handle = start(own, sender)
        time.sleep(0.5)  # several scans
        assert handle.stop(10)
        assert sender.segments == [] and os.path.exists(path)
        with Arena.open(path) as arena:
            assert arena.ring_stats(0).read_records == 0  # not a record read from its ring
    finally:
        os.write(hold_w, b"x")
        assert reap(pid) == 0
        for fd in (r, w, hold_r, hold_w):
            os.close(fd)


def test_half_created_or_damaged_arenas_are_refused_without_crashing(directory: str, own: Arena) -> None:
    dead = fork(lambda: None)
    assert reap(dead) == 0  # its pid names the files below: a process that is gone
    empty = private_name(directory, dead)  # created, not sized yet
    garbage = private_name(directory, dead)  # the right size for nothing
    for path, data in ((empty, b""), (garbage, os.urandom(4096) * 40)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, data)
        os.close(fd)
    truncated = dead_arena(directory, [(R.SEGMENT, segment("t-0"))])
    os.truncate(truncated, 8192)  # a valid magic word, a header that lies about the size
    damaged = [empty, garbage, truncated]
    assert sorted(dead_private_arenas(directory)) == sorted(damaged)
    assert [adopt(p) for p in damaged] == [None, None, None]
    assert all(os.path.exists(p) for p in damaged)  # young: a creator may still be at work
    sender = MemorySender()
    handle = start(own, sender)  # scans at start: refused, no crash
    reporter = handle.reporter
    assert reporter is not None and reporter.adoption is not None and reporter.adoption.adopted == 0
    old = time.time() - DAMAGED_MIN_AGE_S - 5
    for p in damaged:
        os.utime(p, (old, old))
    assert handle.stop(10) and handle.exit_code == 0  # the final scan removes the old ones
    assert not any(os.path.exists(p) for p in damaged)


def meta(*backends: str) -> bytes:
    doc = {"service": "s", "protocol": "grpc", "backends": list(backends), "authentication": "", "pid": 1}
    return orjson.dumps(doc)


def test_only_arenas_sending_to_the_same_backend_are_adopted(directory: str) -> None:
    """Another application of the same user (same private directory) may send elsewhere: its
    records must not reach our backend."""
    ours = dead_arena(directory, [(R.SEGMENT, segment("ours"))], meta=meta("oap:11800"))
    theirs = dead_arena(directory, [(R.SEGMENT, segment("theirs"))], meta=meta("elsewhere:11800"))
    own = Arena.create(
        private_name(directory, os.getpid()), slots=1, ring_capacity=CAPACITY, meta=meta("oap:11800")
    )
    try:
        sender = MemorySender()
        handle = start(own, sender)
        assert handle.stop(10)
        assert [s[0] for s in sender.segments] == ["ours"]
        assert not os.path.exists(ours) and os.path.exists(theirs)
        with Arena.open(theirs) as arena:
            assert arena.ring_stats(0).read_records == 0
    finally:
        own.close()


# Run in a fresh interpreter: the parent role is an application's (a process whose child just
# exited), not the pytest process's, which earlier tests leave with threads, at-fork hooks and
# open arenas of their own (the same scenario once failed inside the whole suite only).
ZOMBIE = """
import os, sys, time
from ipc import Arena
from ipc.adopt import adopt, dead_private_arenas, finish
from reporter_proc import records as R
from tests.children import fork, reap
from tests.test_reporter_helpers import segment

directory, capacity = sys.argv[1], int(sys.argv[2])
r, w = os.pipe()


def child():
    path = os.path.join(directory, f"swmp-{os.getuid()}-{os.getpid()}-t0123abcd.arena")
    arena = Arena.create(path, slots=1, ring_capacity=capacity)
    writer = arena.claim_slot()
    assert writer is not None and writer.write(R.SEGMENT, segment("zombie"))
    os.write(w, arena.path.encode())


def state(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rfind(b")") + 2 :].split()[0].decode()


pid = fork(child)
path = os.read(r, 4096).decode()
deadline = time.monotonic() + 10
while state(pid) != "Z":
    assert time.monotonic() < deadline, "the child is no zombie"
    time.sleep(0.005)
assert dead_private_arenas(directory) == []  # the cheap look (kill 0) sees a process
assert dead_private_arenas(directory, zombies=True) == [path]
arena = adopt(path)
assert arena is not None
reader = arena.reader(0)
assert [t for t, _p in reader.read()] == [R.SEGMENT]
reader.release()
finish(arena, unlink=False)
assert reap(pid) == 0
print("adopted")
"""


def test_the_arena_of_a_process_not_reaped_yet_is_adopted(directory: str) -> None:
    """A zombie exited (its locks are gone): a ``forkserver`` pool's workers are reaped by the
    fork server when it gets to it, after ``Pool.terminate()`` returned, and the program's
    final flush came first: their arenas were left unread."""
    done = subprocess.run(
        [sys.executable, "-c", ZOMBIE, directory, str(CAPACITY)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "adopted", done.stderr[-3000:]
