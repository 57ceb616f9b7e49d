"""Thread mode: what a process leaves unread in its private arena is not removed before an
adopter can deliver it - by the start-up clean-up of another process (``ipc.cleanup_stale``
with ``keep``, ``ipc.adopt.holds_unread``) or by the process itself when its reporter thread
did not finish (``ThreadSink._release``). The whole path, a killed program started again, is
in ``test_thread_adoption_real.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest

import ipc
from ipc import Arena
from ipc.adopt import holds_unread
from reporter_proc import records as R
from reporter_proc.adoption import kept_for_adoption
from reporter_proc.settings import ReporterSettings
from swmp import lifecycle
from swmp._thread_sink import STOP_GRACE_S, ThreadSink
from swmp.tracing.identity import identity
from tests.test_thread_adoption import dead_arena, dead_process_records, private_name

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _give_back_process_state() -> Any:
    """The sink names this process and gives it a role: later tests must not inherit them."""
    before = (identity.service, identity.instance)
    yield
    identity.set(*before)
    lifecycle.announce_unbound()


def meta(*backends: str) -> bytes:
    return orjson.dumps({"protocol": "grpc", "backends": list(backends), "authentication": ""})


def directory_of(tmp_path: Path) -> str:
    return ipc.private.private_directory(str(tmp_path))


def test_only_private_arenas_with_unread_records_hold_unread(tmp_path: Path) -> None:
    d = directory_of(tmp_path)
    recs = dead_process_records(12345, "a", 3)
    unread = dead_arena(d, recs)
    all_read = dead_arena(d, recs, read_first=len(recs))
    shared = os.path.join(d, f"swmp-{os.getuid()}-4242-1234.arena")  # a process-mode name
    with Arena.create(shared, slots=1, ring_capacity=1 << 16) as arena:
        writer = arena.claim_slot()
        assert writer is not None and writer.write(*recs[1])
        assert not holds_unread(arena)
    with Arena.open(unread, wait_s=0) as a, Arena.open(all_read, wait_s=0) as b:
        assert holds_unread(a)
        assert not holds_unread(b)


def test_cleanup_keeps_what_keep_asks_for_and_removes_the_rest(tmp_path: Path) -> None:
    d = directory_of(tmp_path)
    ours = dead_arena(d, dead_process_records(1, "ours", 2), meta=meta("oap:11800"))
    other = dead_arena(d, dead_process_records(2, "other", 2), meta=meta("elsewhere:11800"))
    done = dead_arena(d, dead_process_records(3, "done", 1), read_first=2, meta=meta("oap:11800"))
    removed = ipc.cleanup_stale(str(tmp_path), keep=kept_for_adoption(meta("oap:11800")))
    # Unread and going where this application's records go: left for its reporter thread.
    assert os.path.exists(ours)
    # Another destination's, and one read to the end: removed as before.
    assert sorted(removed) == sorted([other, done])
    assert not os.path.exists(other) and not os.path.exists(done)
    # Without ``keep`` (process mode), everything dead goes.
    assert ipc.cleanup_stale(str(tmp_path)) == [ours]


def test_a_keep_that_raises_keeps_the_arena(tmp_path: Path) -> None:
    d = directory_of(tmp_path)
    path = dead_arena(d, dead_process_records(1, "x", 1))

    def broken(arena: Arena) -> bool:
        raise RuntimeError("cannot say")

    assert ipc.cleanup_stale(str(tmp_path), keep=broken) == []
    assert os.path.exists(path)


class _Handle:
    """A reporter thread that did (or did not) finish its flush within the time given."""

    def __init__(self, finishes: bool) -> None:
        self.finishes = finishes
        self.stopped_with: list[float | None] = []

    def stop(self, timeout: float | None = None) -> bool:
        self.stopped_with.append(timeout)
        return self.finishes


@pytest.mark.parametrize("finishes", [True, False])
def test_a_process_whose_reporter_thread_did_not_finish_leaves_its_arena(
    tmp_path: Path, finishes: bool
) -> None:
    handle = _Handle(finishes)
    sink = ThreadSink(
        None,
        ReporterSettings(service="svc"),
        lambda path, s, arena: handle,
        arena_dir=str(tmp_path),
        ring_capacity=1 << 16,
        meta=meta("oap:11800"),
        service="svc",
        instance_base="base",
        owner_pid=os.getpid(),
    )
    span = [0, -1, 1, 2, "/x", "", 0, 3, 7001, False, False, [], [], []]
    assert sink.write(R.SEGMENT, orjson.dumps(["trace", "seg", "svc", "inst", False, [span]]))
    private = sink.private
    assert private is not None
    path = private.path
    sink.leave(1.5, for_good=True)
    assert handle.stopped_with == [1.5 + STOP_GRACE_S]  # the thread's deadline, and a little
    if finishes:  # everything flushed: the file goes
        assert not os.path.exists(path)
    else:  # the rest is the next process's to deliver
        assert os.path.exists(path)
        private.close()
        with Arena.open(path, wait_s=0) as arena:
            assert holds_unread(arena)


def test_private_name_is_what_holds_unread_recognises(tmp_path: Path) -> None:
    # The tests' private names and the sink's follow the same pattern (ipc.adopt).
    d = directory_of(tmp_path)
    with Arena.create(private_name(d, os.getpid()), slots=1, ring_capacity=1 << 16) as arena:
        writer = arena.claim_slot()
        assert writer is not None and writer.write(*dead_process_records(1, "y", 1)[1])
        assert holds_unread(arena)
