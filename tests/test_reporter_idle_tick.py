"""An idle reporter's tick: only the rings a writer moved are visited, and the periodic jobs
due at the same instant share one timer (docs/performance.md, "An idle tick in fewer
calls"). What must not change with it: a slot claimed after the reporter started is read,
a slot given back with records left is drained, the passes stay round-robin."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ipc import Arena, RingReader
from ipc.ring_reader import moved
from reporter_proc import intake as intake_mod
from reporter_proc import records as R
from reporter_proc import ticks
from reporter_proc.delivery import Delivery
from reporter_proc.intake import Intake
from reporter_proc.ledger import Ledger
from reporter_proc.lifecycle import StopState
from reporter_proc.process import ReporterThread
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from reporter_proc.ticks import forget_wake, sleep_until, wake_at
from tests.test_reporter_helpers import segment, spawn_writer, wait_for
from tests.test_reporter_parts import journal


@pytest.fixture
def arena(tmp_path: Path) -> Iterator[Arena]:
    a = Arena.create(str(tmp_path / "idle.arena"), slots=64, ring_capacity=64 * 1024)
    yield a
    a.close()


def _intake(arena: Arena, **kw: Any) -> tuple[Intake, list[RingReader], Delivery]:
    j = journal(**kw)
    readers = [arena.reader(s) for s in range(arena.slots)]
    ledger = Ledger(lambda slot, pos: readers[slot].commit(pos))
    d = Delivery(j, ledger, MemorySender(), None, StopState())
    intake = Intake(
        arena,
        readers,
        ledger,
        journal=j,
        delivery=d,
        stop=StopState(),
        on_worker_record=lambda t, rec: None,
        spill=None,
        drained_for_stop=lambda now: True,
    )
    return intake, readers, d


def _segments_held(intake: Intake, d: Delivery) -> list[bytes]:
    intake.seal_all()
    return [p for b in d.queues["segment"] for p in b.payloads]


# -- which rings are visited -------------------------------------------------------------------
def test_moved_lists_the_rings_whose_tail_is_not_at_the_cursor(arena: Arena) -> None:
    readers = [arena.reader(s) for s in range(arena.slots)]
    assert moved(readers) == []  # nothing claimed: nothing to visit
    w = arena.claim_slot(highest=True)  # a slot never used, claimed after the readers exist
    assert w is not None and w.slot == 63
    assert moved(readers) == []  # claimed, not written yet
    assert w.write(R.SEGMENT, segment("a"))
    assert moved(readers) == [readers[63]]
    assert len(readers[63].read()) == 1
    assert moved(readers) == []  # read up to the tail, even before the commit
    assert w.write(R.SEGMENT, segment("b"))
    arena.release_slot(63)  # given back with a record unread
    assert moved(readers) == [readers[63]]


def test_a_ring_whose_tail_is_behind_the_cursor_is_still_looked_into(arena: Arena) -> None:
    """A tail word behind the reader's cursor (garbage) is not "quiet": pending() counts and
    follows it as before, so such a ring stays among the visited ones."""
    readers = [arena.reader(s) for s in range(arena.slots)]
    w = arena.claim_slot()
    assert w is not None
    assert w.write(R.SEGMENT, segment("a"))
    readers[w.slot].read()
    arena.views.control(w.slot)[8] = 0  # C_TAIL: behind the cursor
    assert moved(readers) == [readers[w.slot]]
    assert not readers[w.slot].pending()
    assert readers[w.slot].stats().corrupt_events == 1
    arena.release_slot()


def test_an_idle_intake_asks_no_ring_whether_it_has_records(arena: Arena, monkeypatch: Any) -> None:
    """With one ring written out of 64, a pass asks that ring alone; idle, it asks none
    (before: a pending() and a backlog() per slot on every pass and before every sleep)."""
    intake, _readers, _d = _intake(arena)
    asked: list[int] = []
    real_pending, real_backlog = RingReader.pending, RingReader.backlog

    def pending(self: RingReader) -> bool:
        asked.append(self.slot)
        return real_pending(self)

    def backlog(self: RingReader) -> int:
        asked.append(self.slot)
        return real_backlog(self)

    monkeypatch.setattr(RingReader, "pending", pending)
    monkeypatch.setattr(RingReader, "backlog", backlog)
    assert intake.drain_pass() == 0 and not intake._filling() and not intake.pending()
    assert asked == []
    w = arena.claim_slot()
    assert w is not None
    assert w.write(R.SEGMENT, segment("a"))
    assert intake.pending() and asked == [w.slot]
    asked.clear()
    assert intake.drain_pass() == 1 and asked == [w.slot]
    asked.clear()
    assert intake.drain_pass() == 0 and not intake._filling() and not intake.pending()
    assert asked == []
    arena.release_slot()


def test_a_slot_claimed_after_the_intake_started_is_read(arena: Arena) -> None:
    intake, _readers, d = _intake(arena)
    assert intake.drain_pass() == 0  # passes over an arena nobody uses yet
    assert intake.drain_pass() == 0
    held = [arena.claim_slot() for _ in range(10)]  # a slot in the middle, never used before
    w = arena.claim_slot()
    assert w is not None and w.slot == 10
    late = segment("late")  # (a segment's bytes hold the time it was made)
    assert w.write(R.SEGMENT, late)
    assert intake.drain_pass() == 1
    assert _segments_held(intake, d) == [late]
    assert all(h is not None for h in held)
    arena.release_slot()


def test_a_slot_given_back_with_records_left_is_drained(arena: Arena) -> None:
    intake, readers, d = _intake(arena)
    w = arena.claim_slot(highest=True)
    assert w is not None
    payloads = [segment(f"t{i}") for i in range(3)]
    assert intake.drain_pass() == 0
    for p in payloads:
        assert w.write(R.SEGMENT, p)
    arena.release_slot(w.slot)  # its process leaves before the next tick
    assert intake.drain_pass() == 3
    assert _segments_held(intake, d) == payloads
    assert moved(readers) == []


def test_a_pass_stopped_by_its_budget_goes_on_from_the_ring_it_stopped_at(
    arena: Arena, monkeypatch: Any
) -> None:
    """Round-robin as before: rings 0-3 fill the pass budget (256 records each); the next
    pass starts at ring 4, then comes back to the rest."""
    intake, _readers, _d = _intake(arena, batch_max_records=100_000)
    order: list[int] = []
    real_read = RingReader.read

    def read(self: RingReader, *a: Any) -> list[tuple[int, bytes]]:
        order.append(self.slot)
        return real_read(self, *a)

    monkeypatch.setattr(RingReader, "read", read)
    writers = [arena.claim_slot() for _ in range(5)]
    for w in writers:
        assert w is not None
        for i in range(300):
            assert w.write(R.METER, b"[]" + b" " * (i % 3))
    assert intake_mod._PASS_BUDGET == 4 * intake_mod._READ_CHUNK  # what the counts below assume
    assert intake.drain_pass() == 1024 and order == [0, 1, 2, 3]
    order.clear()
    assert intake.drain_pass() == 256 + 4 * 44 and order == [4, 0, 1, 2, 3]
    order.clear()
    assert intake.drain_pass() == 44 and order == [4]
    arena.release_slot()


def test_a_reporter_reads_a_worker_that_claims_a_slot_after_it_started(tmp_path: Path) -> None:
    """End to end, default ticks but a fast flush: the intake's pass visits rings by their
    tail word, so a worker forked long after the reporter started is read on its next tick."""
    arena = Arena.create(str(tmp_path / "late.arena"), slots=64, ring_capacity=64 * 1024)
    sender = MemorySender()
    settings = ReporterSettings(service="late", flush_interval_s=0.1, poll_interval_s=0.1)
    handle = ReporterThread(arena.path, settings, arena=arena, sender=sender)
    handle.start()
    held = [arena.claim_slot() for _ in range(5)]  # the worker gets slot 5, never used before
    writer = None
    try:
        wait_for(lambda: handle.reporter is not None and handle.reporter.ready, 5, "reporter ready")
        reporter = handle.reporter
        assert reporter is not None and reporter.intake is not None
        intake = reporter.intake
        passes = intake.passes
        wait_for(lambda: intake.passes >= passes + 2, 10, "two idle passes")
        writer = spawn_writer(arena.path, [(R.SEGMENT, segment("late"))], hold=True, announce=True)
        assert writer.wait_written() == 5
        wait_for(lambda: len(sender.segments) == 1, 10, "the late worker's segment sent")
        wait_for(lambda: 5 in reporter.instances, 10, "the late worker announced")
    finally:
        if writer is not None:
            writer.release()
        assert all(h is not None for h in held)
        assert handle.stop(10)
        arena.close()


# -- one timer per tick --------------------------------------------------------------------------
def _counting_call_at(loop: asyncio.AbstractEventLoop, armed: list[float]) -> None:
    real = loop.call_at

    def call_at(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
        armed.append(when)
        return real(when, callback, *args, **kw)

    loop.call_at = call_at  # type: ignore[method-assign,assignment]


def test_jobs_due_at_the_same_instant_share_one_timer_and_all_wake() -> None:
    async def scenario() -> tuple[list[float], list[str]]:
        loop = asyncio.get_running_loop()
        armed: list[float] = []
        woke: list[str] = []
        _counting_call_at(loop, armed)
        when = loop.time() + 0.05

        async def job(name: str) -> None:
            await sleep_until(when)
            assert loop.time() >= when
            woke.append(name)

        await asyncio.gather(job("a"), job("b"), job("c"))
        return armed, woke

    armed, woke = asyncio.run(scenario())
    assert len(armed) == 1 and sorted(woke) == ["a", "b", "c"]


def test_a_cancelled_sleeper_leaves_the_others_on_time_and_the_last_one_disarms_the_timer() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        when = loop.time() + 0.1
        a = asyncio.ensure_future(sleep_until(when))
        b = asyncio.ensure_future(sleep_until(when))
        await asyncio.sleep(0)
        due = ticks._tables[loop][when]
        timer = due.timer
        assert timer is not None and len(due.waiters) == 2
        a.cancel()
        await asyncio.gather(a, return_exceptions=True)
        assert a.cancelled() and not timer.cancelled() and len(due.waiters) == 1
        await b  # still woken by the shared timer
        assert loop.time() >= when and when not in ticks._tables[loop]
        # Every sleeper gone before the deadline: the timer goes too.
        later = loop.time() + 10
        c = asyncio.ensure_future(sleep_until(later))
        await asyncio.sleep(0)
        timer = ticks._tables[loop][later].timer
        c.cancel()
        await asyncio.gather(c, return_exceptions=True)
        assert timer is not None and timer.cancelled() and later not in ticks._tables[loop]

    asyncio.run(scenario())


def test_a_future_resolved_early_is_forgotten_by_its_timer() -> None:
    """The intake's sleep ends early on a poke (the doorbell, a stop): forget_wake takes its
    future off the shared timer, which is disarmed if nobody else waits for it."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        when = loop.time() + 10
        poked: asyncio.Future[None] = loop.create_future()
        other: asyncio.Future[None] = loop.create_future()
        wake_at(when, poked)
        wake_at(when, other)
        timer = ticks._tables[loop][when].timer
        poked.set_result(None)
        forget_wake(when, poked)
        assert ticks._tables[loop][when].waiters == [other]
        forget_wake(when, poked)  # twice: nothing
        forget_wake(when, other)
        assert timer is not None and timer.cancelled() and when not in ticks._tables[loop]
        forget_wake(when, other)  # after the entry is gone: nothing

    asyncio.run(scenario())
