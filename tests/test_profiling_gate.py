"""The gate's limits, driven by explicit calls: the sampler thread never runs here, the test
plays it (``Sampler.sample_due`` with a clock of its own), so no test sleeps or times."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from ipc import Arena
from reporter_proc import records as R
from reporter_proc.taskboard import BoardTask
from swmp import _sink, tracing
from swmp.config import load
from swmp.profiling.gate import active_task, by_endpoint, gate
from swmp.profiling.sampler import Profiled, Sampler
from swmp.tracing.context import new_entry_span
from tests.test_profiling import now_ms, post
from tests.test_profiling import task as profiling_task


class ManualSampler(Sampler):
    """A sampler whose thread does nothing: the test samples with ``sample_due``."""

    def _run(self) -> None:
        return


@pytest.fixture()
def sink(profiling_arena: Arena) -> Iterator[_sink.MemorySink]:
    s = _sink.MemorySink()
    _sink.set_sink(s)
    tracing.configure(load({}))
    gate.reset_after_fork()
    gate.configure(max_parallel=5, depth=500, duration_min=10)
    gate.sampler = ManualSampler()
    gate.attach(profiling_arena.board)
    yield s
    gate.attach(None)
    gate.reset_after_fork()
    _sink.set_sink(None)


def task(endpoint: str = "/slow", **kw: Any) -> BoardTask:
    """test_profiling's task, with a threshold: fast requests end before it."""
    kw.setdefault("min_duration_ms", 200)
    return profiling_task(endpoint, **kw)


def snapshots(sink: _sink.MemorySink) -> list[list[Any]]:
    return [orjson.loads(p) for t, p in sink.records if t == R.PROFILE_SNAPSHOT]


def past_threshold(item: Profiled) -> float:
    """The monotonic time of the item's first sample: the request ran for the threshold."""
    return item.next_due


class FakeSegment:
    def __init__(self, segment_id: str) -> None:
        self.segment_id = segment_id
        self.profile: Profiled | None = None


class FakeSpan:
    """A first span still running: the tracing core would stop its item when it ends."""

    def __init__(self, op: str, segment_id: str) -> None:
        self.op = op
        self.start = now_ms()
        self.segment = FakeSegment(segment_id)


def watch(op: str, segment_id: str) -> Any:
    """Start a segment on ``op`` (it runs until the test says otherwise); the gate's item."""
    span = FakeSpan(op, segment_id)
    gate.first_span(span)
    return span.segment.profile


def fast_request(op: str) -> bool:
    """A request that ends before the threshold; whether the gate watched it."""
    with new_entry_span(op) as span:
        watched = span.segment.profile is not None
    return watched


def slow_request(op: str) -> Profiled | None:
    """A request the sampler sees past its threshold (one sample); its item, if watched."""
    with new_entry_span(op) as span:
        item: Profiled | None = span.segment.profile
        if item is not None:
            Sampler.sample_due([item], past_threshold(item))
    return item


# -- bug: fast requests used up the max sampling count ---------------------------------------
def test_requests_ending_before_the_threshold_do_not_use_up_the_count(
    profiling_arena: Arena, sink: _sink.MemorySink
) -> None:
    """Counted at admission, five 1 ms requests took the five places and the slow ones were
    never profiled: the task had no snapshot. SkyWalking counts a segment at its first dump."""
    post(profiling_arena, task(max_sampling_count=5))
    for _ in range(5):
        assert fast_request("/slow")  # watched, but it ends before the threshold
    assert snapshots(sink) == [] and gate.started.get("t1", 0) == 0
    profiled = [slow_request("/slow") for _ in range(6)]
    assert all(p is not None for p in profiled[:5]) and profiled[5] is None  # the sixth: no room
    assert gate.started == {"t1": 5}
    assert len({s[R.SNAP_SEGMENT_ID] for s in snapshots(sink)}) == 5


def test_segments_in_flight_beyond_the_count_are_not_sampled(
    profiling_arena: Arena, sink: _sink.MemorySink
) -> None:
    """Watched at once, more segments than places left: the first ones to reach their first
    snapshot take the places, the others stop without a snapshot; no new one is watched."""
    post(profiling_arena, task(max_sampling_count=2))
    items = [watch("/slow", f"seg{n}") for n in range(3)]
    assert all(isinstance(i, Profiled) for i in items)
    due = max(past_threshold(i) for i in items)
    Sampler.sample_due(items, due)
    assert [i.stopped for i in items] == [False, False, True] and gate.started == {"t1": 2}
    assert {s[R.SNAP_SEGMENT_ID] for s in snapshots(sink)} == {items[0].segment_id, items[1].segment_id}
    Sampler.sample_due(items, due + 1)  # the two go on being sampled, the third never is
    assert len(snapshots(sink)) == 4 and gate.started == {"t1": 2}
    assert not fast_request("/slow")  # the count is full: not even watched


# -- bug: a later task on the same endpoint hid the running one ------------------------------
def test_a_scheduled_task_does_not_hide_the_running_one(
    profiling_arena: Arena, sink: _sink.MemorySink
) -> None:
    """The OAP accepts a second task for the endpoint once the first one's time is taken:
    both are on the board. Keyed by endpoint alone, the later one replaced the running one
    and, not active yet, left the endpoint unprofiled in every worker. The board's order
    does not matter."""
    running = task(task_id="running")
    later = task(task_id="later", start_ms=running.end_ms, end_ms=running.end_ms + 60_000)
    for order in ((running, later), (later, running)):
        post(profiling_arena, *order)
        item = slow_request("/slow")
        assert item is not None and item.task == running, order
    assert {s[R.SNAP_TASK_ID] for s in snapshots(sink)} == {"running"}


def test_the_task_of_an_endpoint_is_the_one_whose_time_covers_now() -> None:
    first = BoardTask("a", "/e", 1_000, 2_000, 0, 10, 5)
    second = BoardTask("b", "/e", 3_000, 4_000, 0, 10, 5)
    other = BoardTask("c", "/o", 0, 9_000, 0, 10, 5)
    table = by_endpoint([second, other, first])
    assert table == {"/e": (first, second), "/o": (other,)}
    assert [active_task(table["/e"], now) for now in (999, 1_000, 1_999, 2_500, 3_000, 4_000)] == [
        None,
        first,
        first,
        None,
        second,
        None,
    ]


# -- bug: the counts of tasks long over were kept for ever -----------------------------------
def test_counts_of_tasks_taken_off_the_board_are_dropped(
    profiling_arena: Arena, sink: _sink.MemorySink
) -> None:
    """One entry per task ever profiled, never removed but at fork: a worker that lives
    through many tasks grew without limit. The counts of the tasks still posted stay."""
    first, second = task(task_id="first"), task("/other", task_id="second")
    post(profiling_arena, first, second)
    assert slow_request("/slow") is not None and slow_request("/other") is not None
    assert gate.started == {"first": 1, "second": 1}
    post(profiling_arena, second)  # the reporter took "first" off the board: it is over
    assert not fast_request("/elsewhere")  # the next segment reads the new board
    assert gate.started == {"second": 1}
    profiling_arena.board.publish(b"not a task table")  # unreadable: nothing is forgotten
    assert not fast_request("/elsewhere")
    assert gate.started == {"second": 1}


# -- bug: the agent stopping while a segment reads the board ---------------------------------
# The stop (another thread: swmp.stop(), the exit hooks) detaches the gate, then the sink
# closes the arena, which releases the board's views. A request thread that passed the gate's
# generation check reads the board after that; the reads below put the stopping thread's work
# exactly where a thread switch can put it.
def stop_agent(arena: Arena) -> None:
    gate.attach(None)  # swmp.profiling's leave hook
    arena.close()  # the sink leaving: the board's memoryviews are released


def test_the_arena_closed_just_before_the_board_is_read_raises_nothing(
    profiling_arena: Arena, sink: _sink.MemorySink
) -> None:
    post(profiling_arena, task())
    board = profiling_arena.board
    read = board.read

    def read_after_the_stop(attempts: int = 1000) -> tuple[int, bytes] | None:
        stop_agent(profiling_arena)
        return read(attempts)  # a released view: ValueError, raised into the request

    board.read = read_after_the_stop  # type: ignore[method-assign]
    with new_entry_span("/slow") as span:  # the application's request: it must not see the stop
        assert span.segment.profile is None
    assert gate.board is None and gate.by_endpoint == {}


def test_a_gate_stopped_while_it_read_the_board_keeps_no_tasks(
    profiling_arena: Arena, sink: _sink.MemorySink
) -> None:
    """The table read from a board the gate no longer has is not installed: a stopped agent
    (or a forked child) profiles nothing until it attaches a board again."""
    post(profiling_arena, task())
    board = profiling_arena.board
    read = board.read

    def stopped_during_the_read(attempts: int = 1000) -> tuple[int, bytes] | None:
        got = read(attempts)
        gate.attach(None)
        return got

    board.read = stopped_during_the_read  # type: ignore[method-assign]
    with new_entry_span("/slow") as span:
        assert span.segment.profile is None
    assert gate.board is None and gate.by_endpoint == {} and gate.seen == -1
    del board.read  # type: ignore[method-assign]
    gate.attach(board)  # attached again: the tasks are read afresh
    assert slow_request("/slow") is not None
