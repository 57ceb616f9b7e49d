"""Profiling: the task board, the task poller, the per-request gate and limits, the sampler,
and the snapshot records (byte-identical to the generated ThreadSnapshot)."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ipc import Arena, BoardTooLarge
from ipc import _layout as L
from reporter_proc import encode, taskboard
from reporter_proc import records as R
from reporter_proc.journal import Journal
from reporter_proc.lifecycle import StopState
from reporter_proc.profile_tasks import (
    KnownTask,
    ProfileTaskPoller,
    Refused,
    parse_command,
    profiling_unavailable,
    read_command,
)
from reporter_proc.protocol.generated import profile_pb2
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from reporter_proc.taskboard import BoardTask
from swmp import _sink, tracing
from swmp.config import load
from swmp.profiling import sampler as sampler_module
from swmp.profiling import stacks
from swmp.profiling.gate import gate
from swmp.profiling.sampler import stats
from swmp.tracing.context import new_entry_span, new_local_span
from tests import pbref


@pytest.fixture()
def sink(profiling_arena: Arena, monkeypatch: pytest.MonkeyPatch) -> Iterator[_sink.MemorySink]:
    monkeypatch.setattr(sampler_module, "LINGER_S", 0.05)
    s = _sink.MemorySink()
    _sink.set_sink(s)
    tracing.configure(load({}))
    gate.reset_after_fork()
    gate.configure(max_parallel=5, depth=500, duration_min=10)
    gate.attach(profiling_arena.board)
    yield s
    gate.attach(None)
    _sink.set_sink(None)
    deadline = time.monotonic() + 5
    while gate.sampler_alive and time.monotonic() < deadline:
        time.sleep(0.01)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def task(endpoint: str = "/slow", **kw: Any) -> BoardTask:
    fields: dict[str, Any] = {
        "task_id": "t1",
        "endpoint": endpoint,
        "start_ms": now_ms() - 1000,
        "end_ms": now_ms() + 60_000,
        "min_duration_ms": 0,
        "dump_period_ms": 10,
        "max_sampling_count": 5,
    }
    fields.update(kw)
    return BoardTask(**fields)


def post(arena: Arena, *tasks: BoardTask) -> None:
    arena.board.publish(taskboard.encode(list(tasks)))


def records(sink: _sink.MemorySink, rtype: int) -> list[list[Any]]:
    return [orjson.loads(p) for t, p in sink.records if t == rtype]


def slow_function(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.002)


def request(op: str, seconds: float) -> None:
    with new_entry_span(op), new_local_span("inner"):
        slow_function(seconds)


# -- the board -------------------------------------------------------------------------------
def test_board_generation_and_document(profiling_arena: Arena) -> None:
    b = profiling_arena.board
    assert b.generation() == 0 and b.read() == (0, b"")
    g = b.publish(b"hello")
    assert g == 2 and b.generation() == 2 and b.read() == (2, b"hello")
    assert b.publish(b"x") == 4 and b.read() == (4, b"x")
    with pytest.raises(BoardTooLarge):
        b.publish(b"x" * (L.BOARD_DATA_MAX + 1))
    assert b.read() == (4, b"x")


def test_board_is_shared_between_processes(profiling_arena: Arena) -> None:
    pid = os.fork()
    if pid == 0:  # child: attach by path and post
        code = 1
        try:
            other = Arena.open(profiling_arena.path)
            other.board.publish(b"from-child")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert profiling_arena.board.read() == (2, b"from-child")


def test_board_writer_killed_mid_update_is_repaired(profiling_arena: Arena) -> None:
    words = profiling_arena._buf[L.BOARD_OFFSET : L.BOARD_OFFSET + 64].cast("Q")
    words[L.B_GENERATION] = 7  # odd: a writer died in the middle
    assert profiling_arena.board.read(attempts=3) is None
    words.release()
    assert profiling_arena.board.publish(b"ok") == 10
    assert profiling_arena.board.read() == (10, b"ok")


def test_taskboard_round_trip_and_garbage() -> None:
    tasks = [task(), task("/b", task_id="t2", dump_period_ms=1)]
    got = taskboard.decode(taskboard.encode(tasks))
    assert got[0] == tasks[0]
    assert got[1].dump_period_ms == taskboard.MIN_DUMP_PERIOD_MS  # clamped
    assert taskboard.decode(b"") == []
    assert taskboard.decode(b'[[1,2],"x",["a","b","c",1,1,1,1]]') == []


# -- commands --------------------------------------------------------------------------------
def command(**over: str) -> dict[str, str]:
    cmd = {
        "command": "ProfileTaskQuery",
        "SerialNumber": "s",
        "TaskId": "t1",
        "EndpointName": "/slow",
        "Duration": "5",
        "MinDurationThreshold": "100",
        "DumpPeriod": "20",
        "MaxSamplingCount": "3",
        "StartTime": "1000",
        "CreateTime": "900",
    }
    cmd.update(over)
    return cmd


def test_parse_command() -> None:
    parsed = parse_command(command())
    assert parsed == (BoardTask("t1", "/slow", 1000, 1000 + 5 * 60_000, 100, 20, 3), 900)
    assert parse_command(command(command="ConfigurationDiscoveryCommand")) is None
    assert parse_command(command(Duration="x")) is None
    assert parse_command({"command": "ProfileTaskQuery"}) is None
    assert parse_command(command(EndpointName="")) is None


def test_commands_with_numbers_out_of_range_are_refused() -> None:
    """The bounds are SkyWalking's (1 to 15 minutes, Java ints, times up to year 9999); a
    number past 64 bits reached the board's encoder and killed the reporter, in a loop."""
    assert parse_command(command(Duration="15")) is not None
    assert parse_command(command(Duration="1", MinDurationThreshold="", MaxSamplingCount="")) is not None
    got = parse_command(command(DumpPeriod="0"))
    assert got is not None and got[0].dump_period_ms == taskboard.MIN_DUMP_PERIOD_MS  # as before
    for bad in (
        {"Duration": "999999999999999"},
        {"Duration": "16"},
        {"Duration": "0"},
        {"Duration": "-5"},
        {"StartTime": "-1"},
        {"StartTime": str(2**70)},
        {"MinDurationThreshold": "-1"},
        {"MinDurationThreshold": str(2**31)},
        {"DumpPeriod": "-10"},
        {"DumpPeriod": str(2**64)},
        {"MaxSamplingCount": "-1"},
        {"MaxSamplingCount": str(2**40)},
        {"CreateTime": str(2**63)},
        {"CreateTime": "-1"},
    ):
        refused = read_command(command(**bad))
        assert isinstance(refused, Refused), bad
        assert parse_command(command(**bad)) is None
    refused = read_command(command(Duration="16", CreateTime="900"))
    assert isinstance(refused, Refused) and refused.create_ms == 900 and "Duration 16" in refused.reason


def test_the_poller_refuses_a_command_out_of_range_and_posts_the_others(
    profiling_arena: Arena, caplog: pytest.LogCaptureFixture
) -> None:
    sender = MemorySender()
    clock = [10_000_000]
    sender.profile_commands = [
        command(TaskId="huge", StartTime=str(clock[0]), Duration="999999999999999", CreateTime="7"),
        command(TaskId="far", StartTime=str(2**70), Duration="1", CreateTime="8"),
        command(TaskId="t1", StartTime=str(clock[0]), Duration="1", CreateTime="5"),
    ]
    poller = ProfileTaskPoller(
        profiling_arena.board,
        Journal(ReporterSettings()),
        sender,
        StopState(),
        lambda: [("svc", "i-w0")],
        interval_s=1,
        clock_ms=lambda: clock[0],
    )

    async def scenario() -> None:
        with caplog.at_level(logging.WARNING, logger="swmp.reporter"):
            await poller.poll()
        _gen, doc = profiling_arena.board.read() or (0, b"")
        assert [t.task_id for t in taskboard.decode(doc)] == ["t1"]
        assert poller.refused == 2 and list(poller.tasks) == ["t1"]
        # Heard: the OAP is not asked for them again (it answers only newer commands).
        assert poller.last_command_time == {("svc", "i-w0"): 8}
        await poller.poll()
        assert sender.profile_queries[-1] == ("svc", "i-w0", 8) and poller.refused == 2

    asyncio.run(scenario())
    refusals = [r for r in caplog.records if "refusing profile task" in r.getMessage()]
    assert len(refusals) == 1 and "'huge'" in refusals[0].getMessage()


def test_a_task_the_board_cannot_encode_is_logged_not_raised(profiling_arena: Arena) -> None:
    poller = ProfileTaskPoller(
        profiling_arena.board,
        Journal(ReporterSettings()),
        MemorySender(),
        StopState(),
        lambda: [],
        interval_s=1,
    )
    poller.tasks["x"] = KnownTask(BoardTask("x", "/e", 0, 2**70, 0, 10, 1), 0)
    poller.post()  # orjson refuses ints past 64 bits (TypeError)
    assert poller.posted is None and profiling_arena.board.read() in (None, (0, b""))


# -- the poller ------------------------------------------------------------------------------
def test_poller_posts_tasks_and_reports_them_finished(profiling_arena: Arena) -> None:
    sender = MemorySender()
    clock = [10_000_000]
    sender.profile_commands = [
        command(StartTime=str(clock[0] - 1000), Duration="1", CreateTime="5"),
        command(TaskId="old", StartTime="0", Duration="1", CreateTime="3"),  # over already
        command(command="Other"),
    ]
    j = Journal(ReporterSettings())
    poller = ProfileTaskPoller(
        profiling_arena.board,
        j,
        sender,
        StopState(),
        lambda: [("svc", "i-w0"), ("svc", "i-w1")],
        interval_s=1,
        clock_ms=lambda: clock[0],
    )

    async def scenario() -> None:
        await poller.poll()
        assert sender.profile_queries == [("svc", "i-w0", 0), ("svc", "i-w1", 0)]
        assert poller.last_command_time == {("svc", "i-w0"): 5, ("svc", "i-w1"): 5}
        gen, doc = profiling_arena.board.read() or (0, b"")
        assert [t.task_id for t in taskboard.decode(doc)] == ["t1"]
        await poller.poll()  # nothing new: the board is not rewritten
        assert profiling_arena.board.generation() == gen
        assert sender.profile_queries[-1] == ("svc", "i-w1", 5)
        await poller.finish_due()
        assert sender.finishes == []
        clock[0] += 60_000 + 2_000  # the task's minute and the grace are over
        await poller.finish_due()
        assert sorted(sender.finishes) == [["svc", "i-w0", "t1"], ["svc", "i-w1", "t1"]]
        assert taskboard.decode((profiling_arena.board.read() or (0, b""))[1]) == []
        await poller.finish_due()
        assert len(sender.finishes) == 2  # once per instance

    asyncio.run(scenario())


class _CachedLate(MemorySender):
    """An OAP whose task cache takes the new task in between two instances' queries."""

    async def fetch_profile_commands(
        self, service: str, instance: str, last_command_time: int
    ) -> list[dict[str, str]]:
        got = await super().fetch_profile_commands(service, instance, last_command_time)
        if not self.profile_commands:
            self.profile_commands = [command(StartTime="10000000", Duration="1", CreateTime="5")]
        return got


def test_every_instance_hears_a_task_the_oap_cached_in_the_middle_of_a_round(profiling_arena: Arena) -> None:
    """Each instance asks with the newest task time *it* heard: with one time for the whole
    reporter, the instances that asked before the OAP cached the task never heard of it
    (seen against the real OAP: its profiling test waited in vain for every instance to be
    notified). An instance that appears later hears the running task too, and instances
    that are gone are forgotten."""
    sender = _CachedLate()
    live = [("svc", "i-w0"), ("svc", "i-w1")]
    poller = ProfileTaskPoller(
        profiling_arena.board,
        Journal(ReporterSettings()),
        sender,
        StopState(),
        lambda: live,
        interval_s=1,
        clock_ms=lambda: 10_000_000,
    )

    async def scenario() -> None:
        await poller.poll()  # i-w0 asks before the task is cached, i-w1 after
        assert poller.tasks["t1"].notified == {("svc", "i-w1")}
        await poller.poll()
        assert sender.profile_queries[-2:] == [("svc", "i-w0", 0), ("svc", "i-w1", 5)]
        assert poller.tasks["t1"].notified == {("svc", "i-w0"), ("svc", "i-w1")}
        live[:] = [("svc", "i-w1"), ("svc", "i-w2")]  # i-w0's worker exited, i-w2 started
        await poller.poll()
        assert sender.profile_queries[-1] == ("svc", "i-w2", 0)
        assert poller.tasks["t1"].notified == {("svc", "i-w0"), ("svc", "i-w1"), ("svc", "i-w2")}
        assert poller.last_command_time == {("svc", "i-w1"): 5, ("svc", "i-w2"): 5}

    asyncio.run(scenario())


def test_poller_retries_a_failed_finish(profiling_arena: Arena) -> None:
    sender = MemorySender()
    clock = [10_000_000]
    sender.profile_commands = [command(StartTime=str(clock[0]), Duration="1")]
    poller = ProfileTaskPoller(
        profiling_arena.board,
        Journal(ReporterSettings()),
        sender,
        StopState(),
        lambda: [("svc", "i")],
        interval_s=1,
        clock_ms=lambda: clock[0],
    )

    async def scenario() -> None:
        await poller.poll()
        clock[0] += 70_000
        sender.fail_next(1)
        await poller.finish_due()
        assert sender.finishes == [] and "t1" in poller.tasks
        await poller.finish_due()
        assert sender.finishes == [["svc", "i", "t1"]] and not poller.tasks

    asyncio.run(scenario())


def test_protocols_without_profiling_say_why() -> None:
    http = MemorySender(supports=frozenset({"segment", "log", "management"}))
    j = Journal(ReporterSettings(protocol="http"))
    assert "http protocol cannot carry profiling" in profiling_unavailable(j, http)
    off = Journal(ReporterSettings(profile_enabled=False))
    assert "SW_AGENT_PROFILE_ACTIVE=false" in profiling_unavailable(off, MemorySender())
    assert profiling_unavailable(Journal(ReporterSettings()), MemorySender()) == ""


def test_config_passes_the_interval_and_the_switch() -> None:
    rs = load({"SW_AGENT_COLLECTOR_GET_PROFILE_TASK_INTERVAL": "7"}).to_reporter_settings()
    assert rs.profile_task_interval_s == 7.0 and rs.profile_enabled
    assert not load({"SW_AGENT_PROFILE_ACTIVE": "false"}).to_reporter_settings().profile_enabled


# -- the gate and the sampler ----------------------------------------------------------------
def test_matching_request_is_sampled_until_its_segment_ends(
    profiling_arena: Arena, sink: _sink.MemorySink
) -> None:
    post(profiling_arena, task())
    request("/slow", 0.2)
    request("/other", 0.05)
    seg = records(sink, R.SEGMENT)
    slow = next(s for s in seg if s[R.SEG_SPANS][-1][R.SPAN_OPERATION] == "/slow")
    first = next(sp for sp in slow[R.SEG_SPANS] if sp[R.SPAN_ID] == 0)
    snaps = records(sink, R.PROFILE_SNAPSHOT)
    assert len(snaps) >= 3
    for s in snaps:
        assert s[R.SNAP_TASK_ID] == "t1" and s[R.SNAP_SEGMENT_ID] == slow[R.SEG_SEGMENT_ID]
        assert first[R.SPAN_START] <= s[R.SNAP_TIME] <= first[R.SPAN_END]
    assert [s[R.SNAP_SEQUENCE] for s in snaps] == list(range(len(snaps)))
    stack = snaps[-1][R.SNAP_STACK]
    assert any(".slow_function:" in f for f in stack)
    assert stack.index(next(f for f in stack if ".request:" in f)) < stack.index(
        next(f for f in stack if ".slow_function:" in f)
    )  # outermost first
    time.sleep(0.1)
    assert len(records(sink, R.PROFILE_SNAPSHOT)) == len(snaps)  # nothing after the end


def test_no_sampler_thread_without_a_matching_request(profiling_arena: Arena, sink: _sink.MemorySink) -> None:
    request("/slow", 0.01)
    post(profiling_arena, task("/elsewhere"))
    request("/slow", 0.05)
    assert not gate.sampler_alive and records(sink, R.PROFILE_SNAPSHOT) == []
    assert gate.by_endpoint.keys() == {"/elsewhere"}


def test_threshold_inactive_tasks_and_renamed_endpoints(
    profiling_arena: Arena, sink: _sink.MemorySink
) -> None:
    post(
        profiling_arena,
        task(min_duration_ms=10_000),  # a request shorter than the threshold: nothing
        task("/later", task_id="t2", start_ms=now_ms() + 60_000),  # not started yet
        task("/route/{id}", task_id="t3"),  # the framework renames the entry span after routing
    )
    request("/slow", 0.05)
    request("/later", 0.05)
    assert records(sink, R.PROFILE_SNAPSHOT) == []
    with new_entry_span("/route/7") as span:
        span.set_operation("/route/{id}")
        slow_function(0.1)
    snaps = records(sink, R.PROFILE_SNAPSHOT)
    assert snaps and {s[R.SNAP_TASK_ID] for s in snaps} == {"t3"}


def test_max_sampling_count_per_process(profiling_arena: Arena, sink: _sink.MemorySink) -> None:
    post(profiling_arena, task(max_sampling_count=2))
    for _ in range(4):
        request("/slow", 0.04)
    segments_sampled = {s[R.SNAP_SEGMENT_ID] for s in records(sink, R.PROFILE_SNAPSHOT)}
    assert len(segments_sampled) == 2
    assert gate.started == {"t1": 2}


def test_max_parallel(profiling_arena: Arena, sink: _sink.MemorySink) -> None:
    gate.configure(max_parallel=2, depth=500, duration_min=10)
    post(profiling_arena, task(max_sampling_count=10))
    threads = [threading.Thread(target=request, args=("/slow", 0.3)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({s[R.SNAP_SEGMENT_ID] for s in records(sink, R.PROFILE_SNAPSHOT)}) == 2


def test_stack_depth_keeps_the_innermost_frames(profiling_arena: Arena, sink: _sink.MemorySink) -> None:
    gate.configure(max_parallel=5, depth=3, duration_min=10)
    post(profiling_arena, task())
    request("/slow", 0.1)
    snaps = records(sink, R.PROFILE_SNAPSHOT)
    assert snaps and all(len(s[R.SNAP_STACK]) <= 3 for s in snaps)
    assert any(".slow_function:" in s[R.SNAP_STACK][-1] or "sleep" in s[R.SNAP_STACK][-1] for s in snaps)


def test_asyncio_request_samples_its_coroutine_stack(profiling_arena: Arena, sink: _sink.MemorySink) -> None:
    post(profiling_arena, task("/async"))

    async def slow_coroutine() -> None:
        await asyncio.sleep(0.2)

    async def handler() -> None:
        with new_entry_span("/async"):
            await slow_coroutine()

    async def main() -> None:
        # another task keeps the loop busy: its frames must not show up in the request's stack
        async def bystander() -> None:
            for _ in range(50):
                await asyncio.sleep(0.005)

        await asyncio.gather(handler(), bystander())

    asyncio.run(main())
    snaps = records(sink, R.PROFILE_SNAPSHOT)
    assert snaps
    for s in snaps:
        stack = s[R.SNAP_STACK]
        assert ".handler:" in stack[0] and ".slow_coroutine:" in stack[1], stack
        assert stack[-1].split(":")[0].endswith("tasks.py.sleep"), stack  # awaited down to asyncio.sleep
        assert not any("bystander" in f or "run_forever" in f for f in stack)


def test_code_under_a_path_that_is_not_utf8_is_sampled_escaped(
    profiling_arena: Arena, sink: _sink.MemorySink, tmp_path: Path
) -> None:
    """A code file under a directory whose name is not UTF-8 has a lone surrogate in its
    ``co_filename`` (``surrogateescape``): orjson refuses the snapshot. It is sent with the
    surrogate backslash-escaped, as segments and logs are; before, it was dropped (counted)."""
    folder = tmp_path / os.fsdecode(b"caf\xff")
    folder.mkdir()
    (folder / "app.py").write_text(
        "import time\n"
        "def busy(done):\n"
        "    deadline = time.monotonic() + 30\n"
        "    while not done() and time.monotonic() < deadline:\n"
        "        time.sleep(0.002)\n"
    )
    spec = importlib.util.spec_from_file_location("swmp_test_not_utf8_app", folder / "app.py")
    assert spec is not None and spec.loader is not None
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    assert "\udcff" in app.busy.__code__.co_filename
    post(profiling_arena, task())
    dropped = stats.dropped
    with new_entry_span("/slow"):
        app.busy(lambda: len(records(sink, R.PROFILE_SNAPSHOT)) >= 2)  # runs until sampled twice
    snaps = records(sink, R.PROFILE_SNAPSHOT)
    assert len(snaps) >= 2 and stats.dropped == dropped
    escaped = str(folder).replace("\udcff", "\\udcff") + "/app.py.busy:"
    assert all(any(f.startswith(escaped) for f in s[R.SNAP_STACK]) for s in snaps), snaps[0][R.SNAP_STACK]


def test_running_coroutine_includes_its_synchronous_frames() -> None:
    got: list[str] = []

    def busy() -> None:
        got.extend(stacks.coroutine_stack(coro, threading.get_ident(), 50))

    async def outer() -> None:
        busy()

    coro = outer()
    try:
        coro.send(None)
    except StopIteration:
        pass
    # the task's frames only (not the test's frames that drive it), its synchronous calls included
    assert [f.split(":")[0].rsplit(".", 1)[1] for f in got] == ["outer", "busy", "coroutine_stack"]


# -- the record format -----------------------------------------------------------------------
def test_snapshot_record_encodes_byte_identical_to_the_generated_class(
    profiling_arena: Arena, sink: _sink.MemorySink
) -> None:
    post(profiling_arena, task())
    request("/slow", 0.05)
    snaps = records(sink, R.PROFILE_SNAPSHOT)
    assert snaps
    for rec in snaps:
        wire = encode.thread_snapshot(rec)
        assert wire == pbref.thread_snapshot(rec).SerializeToString()
        msg = profile_pb2.ThreadSnapshot.FromString(wire)
        assert (msg.taskId, msg.traceSegmentId, msg.time, msg.sequence, list(msg.stack.codeSignatures)) == (
            rec[0],
            rec[1],
            rec[2],
            rec[3],
            rec[4],
        )


def test_sampler_counts(profiling_arena: Arena, sink: _sink.MemorySink, caplog: Any) -> None:
    before = stats.snapshots
    post(profiling_arena, task())
    with caplog.at_level(logging.ERROR, "swmp.profiling"):
        request("/slow", 0.05)
    assert stats.snapshots > before and not caplog.records


def test_sampler_thread_ends_once_idle(profiling_arena: Arena, sink: _sink.MemorySink) -> None:
    post(profiling_arena, task())
    threads_before = stats.threads
    request("/slow", 0.05)
    request("/slow", 0.05)  # within the linger: the same thread
    assert stats.threads == threads_before + 1
    deadline = time.monotonic() + 5
    while gate.sampler_alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not gate.sampler_alive


def test_suspended_greenlet_stack() -> None:
    import greenlet  # gevent's, in the dev extra

    main = greenlet.getcurrent()

    def parked_in_a_greenlet() -> None:
        main.switch()

    g = greenlet.greenlet(parked_in_a_greenlet)
    g.switch()  # runs until it switches back: now suspended inside parked_in_a_greenlet
    stack = stacks.greenlet_stack(g, 10)
    assert stack and ".parked_in_a_greenlet:" in stack[-1]
    g.switch()  # let it finish
    assert g.dead and stacks.greenlet_stack(g, 10) == []
