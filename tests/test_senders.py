"""gRPC and HTTP senders against the in-test collector: every kind, faults, fail-over, auth."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import grpc
import pytest

from reporter_proc.encode import EncodeError
from reporter_proc.senders import create_sender
from reporter_proc.senders.base import (
    FatalSendError,
    InvalidDataError,
    Sender,
    SendError,
    TooLargeError,
    UnsupportedError,
)
from reporter_proc.senders.grpc_sender import GrpcSender
from reporter_proc.senders.http_sender import HttpSender
from reporter_proc.settings import ReporterSettings
from tests import pbref
from tests.collector import Collector, free_port

T = TypeVar("T")

SEGMENT = [
    "trace-1",
    "seg-1",
    "svc",
    "svc-0@host",
    False,
    [
        [
            0,
            -1,
            1_700_000_000_000,
            1_700_000_000_020,
            "GET /x",
            "",
            0,
            3,
            7000,
            False,
            False,
            ["http.method", "GET", "http.status_code", "200"],
            [],
            [],
        ],
        [
            1,
            0,
            1_700_000_000_005,
            1_700_000_000_009,
            "SELECT",
            "db:5432",
            1,
            1,
            7001,
            True,
            False,
            ["db.statement", "SELECT 1"],
            [[1_700_000_000_006, ["event", "error"]]],
            [[0, "trace-0", "seg-0", 3, "front", "front-0", "/checkout", "svc:80"]],
        ],
    ],
]
LOG = [
    1_700_000_000_007,
    "svc",
    "svc-0@host",
    "GET /x",
    "text",
    "hello",
    "trace-1",
    "seg-1",
    0,
    ["level", "INFO"],
    "",
]
METER = [
    1_700_000_000_000,
    "svc",
    "svc-0@host",
    [
        [1, "instance_pvm_thread_active_count", ["pid", "1"], 12.0],
        [2, "latency", [], [[0.0, 3, False], [10.0, 1, False]]],
    ],
]
SNAPSHOT = ["task-1", "seg-1", 1_700_000_000_008, 0, ["main.py:10:run", "app.py:5:handler"]]
FINISH = ["svc", "svc-0@host", "task-1"]
GARBAGE = ["trace", "seg", "svc", "inst", False, [["not a span"]]]


def run(coro: Awaitable[T], timeout: float = 30.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def settings(protocol: str, *backends: str, **over: Any) -> ReporterSettings:
    return dataclasses.replace(
        ReporterSettings(protocol=protocol, backends=backends, send_timeout_s=5.0), **over
    )


async def using(sender: Sender, body: Callable[[Sender], Awaitable[T]]) -> T:
    await sender.start()
    try:
        return await body(sender)
    finally:
        await sender.close()


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector() as c:
        yield c


def _seg_ids(c: Collector) -> list[str]:
    return [s.traceSegmentId for s in c.segments]


# --------------------------------------------------------------------------- gRPC: every kind
@pytest.mark.parametrize("stream", [False, True], ids=["collectInSync", "collect-stream"])
def test_grpc_sends_every_kind(collector: Collector, stream: bool) -> None:
    collector.add_profile_task("task-1", "GET /x", dump_period_ms=20)
    seg2 = [*SEGMENT[:1], "seg-2", *SEGMENT[2:]]

    async def body(s: Sender) -> list[dict[str, str]]:
        await s.send_segments([SEGMENT, seg2])
        await s.send_segments([SEGMENT])
        await s.send_logs([LOG, LOG])
        await s.send_meters([METER])
        await s.send_snapshots([SNAPSHOT])
        await s.report_finish(FINISH)
        await s.report_properties("svc", "svc-0@host", [("language", "python"), ("Process No.", "42")])
        await s.keep_alive("svc", "svc-0@host", "GENERAL")
        return await s.fetch_profile_commands("svc", "svc-0@host", 0)

    commands = run(using(GrpcSender(settings("grpc", collector.grpc_address), segment_stream=stream), body))
    assert collector.wait_for(lambda: len(collector.segments) == 3)
    assert collector.segments[0] == pbref.segment(SEGMENT)
    assert _seg_ids(collector) == ["seg-1", "seg-2", "seg-1"]
    assert collector.calls["grpc:collect" if stream else "grpc:collectInSync"] == (1 if stream else 2)
    assert collector.logs == [pbref.log(LOG)] * 2
    assert collector.meters == pbref.meter_datas(METER)
    assert collector.meter_collections == 1 and collector.calls["grpc:collectBatch"] == 1
    assert collector.snapshots == [pbref.thread_snapshot(SNAPSHOT)]
    assert collector.finishes == [pbref.profile_finish(FINISH)]
    assert collector.properties == [
        pbref.instance_properties("svc", "svc-0@host", [("language", "python"), ("Process No.", "42")])
    ]
    assert collector.pings == [pbref.instance_ping("svc", "svc-0@host", "GENERAL")]
    assert collector.profile_queries == [pbref.profile_task_query("svc", "svc-0@host", 0)]
    assert len(commands) == 1
    assert commands[0]["command"] == "ProfileTaskQuery"
    assert commands[0]["TaskId"] == "task-1" and commands[0]["DumpPeriod"] == "20"


def test_grpc_stream_is_long_lived_and_reopened(collector: Collector) -> None:
    sender = GrpcSender(settings("grpc", collector.grpc_address), segment_stream=True, stream_max_age_s=0.0)

    async def body(s: Sender) -> None:
        await s.send_segments([SEGMENT])
        await s.send_segments([SEGMENT])  # older than max age: the first stream is completed first

    run(using(sender, body))
    assert collector.wait_for(lambda: len(collector.segments) == 2)
    assert collector.calls["grpc:collect"] == 2


def test_grpc_stream_failure_is_seen(collector: Collector) -> None:
    async def body(s: Sender) -> None:
        await s.send_segments([SEGMENT])
        collector.stop()  # the open stream breaks
        with pytest.raises(SendError):
            for _ in range(50):  # a write may be buffered before the break is noticed
                await s.send_segments([SEGMENT])
                await asyncio.sleep(0.02)

    run(using(GrpcSender(settings("grpc", collector.grpc_address), segment_stream=True), body))


# --------------------------------------------------------------------------- HTTP: every kind
def test_http_sends_supported_kinds(collector: Collector) -> None:
    async def body(s: Sender) -> None:
        await s.send_segments([SEGMENT, SEGMENT])
        await s.send_logs([LOG])
        await s.report_properties("svc", "svc-0@host", [("language", "python")], "GENERAL")
        await s.keep_alive("svc", "svc-0@host")
        for call in (s.send_meters([METER]), s.send_snapshots([SNAPSHOT]), s.report_finish(FINISH)):
            with pytest.raises(UnsupportedError):
                await call
        assert await s.fetch_profile_commands("svc", "svc-0@host", 0) == []

    sender = HttpSender(settings("http", collector.http_address))
    assert sender.supports == {"segment", "log", "management"}
    run(using(sender, body))
    assert collector.segments == [pbref.segment(SEGMENT)] * 2
    assert collector.calls["http:/v3/segments"] == 1  # one array per batch
    assert collector.logs == [pbref.log(LOG)]
    assert collector.properties == [
        pbref.instance_properties("svc", "svc-0@host", [("language", "python")], "GENERAL")
    ]
    assert collector.pings == [pbref.instance_ping("svc", "svc-0@host")]


# --------------------------------------------------------------------------- faults
def _make(protocol: str, *backends: str, **over: Any) -> Sender:
    return create_sender(settings(protocol, *backends, **over))


def _address(c: Collector, protocol: str) -> str:
    return c.grpc_address if protocol == "grpc" else c.http_address


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_refused_connection_is_retryable(protocol: str) -> None:
    async def body(s: Sender) -> None:
        for call in (s.send_segments([SEGMENT]), s.keep_alive("svc", "i")):
            with pytest.raises(SendError) as info:
                await call
            assert not isinstance(info.value, FatalSendError)

    run(using(_make(protocol, f"127.0.0.1:{free_port()}"), body))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_slow_backend_times_out(collector: Collector, protocol: str) -> None:
    collector.delay_s = 30.0  # woken by stop() at teardown

    async def body(s: Sender) -> None:
        with pytest.raises(SendError) as info:
            await s.send_segments([SEGMENT])
        assert not isinstance(info.value, FatalSendError)

    run(using(_make(protocol, _address(collector, protocol), send_timeout_s=0.3), body))
    assert collector.segments == []


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_fail_over_to_second_backend(collector: Collector, protocol: str) -> None:
    dead = f"127.0.0.1:{free_port()}"
    live = _address(collector, protocol)

    async def body(s: Sender) -> None:
        assert s.address == dead
        with pytest.raises(SendError):
            await s.send_segments([SEGMENT])
        assert s.address == live
        await s.send_segments([SEGMENT])
        await s.keep_alive("svc", "i")

    run(using(_make(protocol, dead, live), body))
    assert len(collector.segments) == 1 and len(collector.pings) == 1


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_fail_over_on_error_status_and_back(protocol: str) -> None:
    with Collector() as first, Collector() as second:
        first.fail_next(1)

        async def body(s: Sender) -> None:
            with pytest.raises(SendError):
                await s.send_segments([SEGMENT])  # 503 / UNAVAILABLE from the first
            await s.send_segments([SEGMENT])  # goes to the second
            second.fail_next(1)
            with pytest.raises(SendError):
                await s.send_segments([SEGMENT])
            await s.send_segments([SEGMENT])  # round-robin: back on the first

        run(using(_make(protocol, _address(first, protocol), _address(second, protocol)), body))
        assert len(first.segments) == 1 and len(second.segments) == 1


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_authentication_arrives(collector: Collector, protocol: str) -> None:
    async def body(s: Sender) -> None:
        await s.send_segments([SEGMENT])
        await s.keep_alive("svc", "i")

    run(using(_make(protocol, _address(collector, protocol), authentication="s3cret"), body))
    assert collector.auth == ["s3cret", "s3cret"]


def test_no_authentication_when_unset(collector: Collector) -> None:
    run(using(_make("grpc", collector.grpc_address), lambda s: s.keep_alive("svc", "i")))
    assert collector.auth == [""]


@pytest.mark.parametrize(
    ("code", "fatal"),
    [
        (grpc.StatusCode.UNAUTHENTICATED, True),
        (grpc.StatusCode.INVALID_ARGUMENT, True),
        (grpc.StatusCode.UNIMPLEMENTED, True),
        (grpc.StatusCode.UNAVAILABLE, False),
        (grpc.StatusCode.INTERNAL, False),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, False),
    ],
)
def test_grpc_status_mapping(collector: Collector, code: grpc.StatusCode, fatal: bool) -> None:
    collector.fail_next(3, grpc_code=code)

    async def body(s: Sender) -> None:
        for call in (s.send_segments([SEGMENT]), s.send_logs([LOG]), s.keep_alive("svc", "i")):
            with pytest.raises(SendError) as info:
                await call
            assert isinstance(info.value, FatalSendError) is fatal

    run(using(_make("grpc", collector.grpc_address), body))


@pytest.mark.parametrize(
    ("status", "fatal"),
    [(401, True), (400, True), (404, True), (408, False), (429, False), (500, False), (503, False)],
)
def test_http_status_mapping(collector: Collector, status: int, fatal: bool) -> None:
    collector.fail_next(1, http_status=status)

    async def body(s: Sender) -> None:
        with pytest.raises(SendError) as info:
            await s.send_logs([LOG])
        assert isinstance(info.value, FatalSendError) is fatal

    run(using(_make("http", collector.http_address), body))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_invalid_record_fails_batch_before_sending(collector: Collector, protocol: str) -> None:
    async def body(s: Sender) -> None:
        with pytest.raises(EncodeError):
            await s.send_segments([SEGMENT, GARBAGE])
        with pytest.raises(EncodeError):
            await s.send_logs([LOG, [1, 2]])

    run(using(_make(protocol, _address(collector, protocol)), body))
    assert collector.calls.total() == 0  # nothing left: the loop can split and resend safely


def test_not_started_is_a_send_error() -> None:
    async def body() -> None:
        for sender in (_make("grpc", "127.0.0.1:1"), _make("http", "127.0.0.1:1")):
            with pytest.raises(SendError):
                await sender.keep_alive("svc", "i")

    run(body())


def test_create_sender() -> None:
    for protocol, name in (
        ("grpc", "grpc"),
        ("http", "http"),
        ("kafka", "kafka"),
        ("memory", "memory"),
        (" GRPC ", "grpc"),
    ):
        sender = create_sender(ReporterSettings(protocol=protocol))
        assert sender.name == name
        assert sender.supports <= {"segment", "log", "meter", "management", "profile"}
    kafka = create_sender(ReporterSettings(protocol="kafka"))
    assert kafka.supports == {"segment", "log", "meter", "management"}
    # nothing network-side exists before start(): safe to build before a fork
    assert getattr(create_sender(ReporterSettings()), "_channel", None) is None
    with pytest.raises(ValueError):
        create_sender(ReporterSettings(protocol="carrier-pigeon"))
    with pytest.raises(ValueError):
        create_sender(ReporterSettings(backends=()))


# --------------------------------------------------------------------------- collector as a process
def test_collector_process_dumps_what_it_receives(tmp_path: Any) -> None:
    from tests.collector import CollectorProcess

    with CollectorProcess(str(tmp_path)) as proc:
        assert (tmp_path / "collector.ready").exists()

        async def body() -> None:
            await using(
                _make("grpc", proc.grpc_address, authentication="tok"), lambda s: s.send_segments([SEGMENT])
            )
            await using(_make("http", proc.http_address), lambda s: s.send_logs([LOG]))

        run(body())
        assert proc.wait_for(lambda lines: len(lines) == 2)
        seg, log_line = proc.received("segment"), proc.received("log")
        assert seg[0]["transport"] == "grpc" and seg[0]["auth"] == "tok"
        assert seg[0]["message"]["traceSegmentId"] == "seg-1"
        assert seg[0]["message"]["spans"][1]["spanType"] == "Exit"
        assert log_line[0]["transport"] == "http"
        assert log_line[0]["message"]["body"]["text"]["text"] == "hello"
        pid = proc.proc.pid if proc.proc else 0
    assert pid and not _alive(pid)


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(
    ("protocol", "code", "status", "error"),
    [
        ("grpc", grpc.StatusCode.INVALID_ARGUMENT, 0, InvalidDataError),
        ("http", None, 400, InvalidDataError),
        ("http", None, 413, TooLargeError),
    ],
)
def test_refusals_by_content_have_their_own_error_classes(
    collector: Collector, protocol: str, code: Any, status: int, error: type[SendError]
) -> None:
    # Delivery splits on these instead of dropping the batch (docs/reporter.md).
    if code is not None:
        collector.fail_next(1, grpc_code=code)
    else:
        collector.fail_next(1, http_status=status)
    address = collector.grpc_address if protocol == "grpc" else collector.http_address

    async def body(s: Sender) -> None:
        with pytest.raises(error):
            await s.send_segments([SEGMENT])

    run(using(_make(protocol, address), body))
