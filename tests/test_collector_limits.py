"""``swmp collector`` against clients that hold its resources, on a real collector process
with real sockets and real gRPC clients (docs/collector.md, "Security", "Resources"):

* HTTP: a client that trickles its request a byte at a time held a connection slot for
  ever (the timeout was per read); 64 of them held every slot. Each request now has a
  whole-request deadline, and idle kept-alive connections are closed.
* gRPC: a ``collect`` stream held one of the receiver's 8 threads for as long as the client
  kept it open; 8 idle streams starved every agent.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from reporter_proc.protocol.generated import common_pb2, management_pb2, tracing_pb2
from swmp.collector.grpc_receiver import MAX_STREAMS, STREAM_EVICT_IDLE_S, STREAM_IDLE_S, WORKERS, _Streams
from swmp.collector.http_server import KEEPALIVE_IDLE_S, MAX_CONNECTIONS, REQUEST_DEADLINE_S
from swmp.collector.intake import Intake
from swmp.collector.store import Store
from tests.localcollector import LocalCollector, local_collector
from tests.servers import wait_until

# Generous bounds for what must happen after a deadline: the machine is shared, timings are
# never asserted, only that it happens at all (before the fixes it never did).
SLACK_S = 30.0


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[LocalCollector]:
    with local_collector(tmp_path, memory=True) as col:
        yield col


def _connect(col: LocalCollector) -> socket.socket:
    host, port = col.http_address.split(":")
    return socket.create_connection((host, int(port)), timeout=10)


class _Tricklers:
    """Connections that each send the start of a request, then one more header byte every
    half second, from one thread, until the collector closes them (noted with whatever the
    collector sent first: a closed-unanswered connection got nothing)."""

    HEAD = b"POST /v3/segments HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Slow: "

    def __init__(self, socks: list[socket.socket]) -> None:
        self.open = list(socks)
        self.closed: list[bytes] = []  # what each closed connection received before its end
        self._stop = threading.Event()
        for s in self.open:
            s.sendall(self.HEAD)
            s.setblocking(False)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self.open and not self._stop.wait(0.5):
            for s in list(self.open):
                try:
                    s.send(b"x")
                    got = s.recv(4096) if select.select([s], [], [], 0)[0] else None
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:  # reset, broken pipe: the collector closed it
                    got = b""
                if got is not None:
                    self.open.remove(s)
                    self.closed.append(got)
                    s.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for s in self.open:
            s.close()


def test_a_trickling_request_is_cut_off_and_idle_keepalive_closed(collector: LocalCollector) -> None:
    """One header byte every half second: each read is quick, so the old per-read timeout
    (30 s) never fired. The request's deadline does, and the connection is closed
    unanswered and counted; an idle kept-alive connection is closed too."""
    idle = _connect(collector)
    idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = b""
    while not answer.endswith(b'{"ok":true}'):
        chunk = idle.recv(4096)
        assert chunk, answer
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and b"Connection: close" not in answer
    slow = _Tricklers([_connect(collector)])
    try:
        wait_until(lambda: not slow.open, REQUEST_DEADLINE_S + SLACK_S, "the trickling client cut off")
    finally:
        slow.stop()
    assert slow.closed == [b""]  # closed, nothing answered
    idle.settimeout(KEEPALIVE_IDLE_S + SLACK_S)
    assert idle.recv(1) == b""  # closed by the collector, not by this timeout (that raises)
    idle.close()
    refused = collector.stats()["refused"]
    assert refused.get("too_slow") == 1, refused  # the idle connection is no refusal


def test_requests_get_through_while_slow_clients_are_dropped(collector: LocalCollector) -> None:
    """MAX_CONNECTIONS trickling clients take every connection slot: a connection past the
    cap is closed on arrival. They are dropped at their deadline, and a normal client that
    retries is served (before, the slots were held for as long as the bytes trickled)."""
    slow = _Tricklers([_connect(collector) for _ in range(MAX_CONNECTIONS)])
    try:
        served: dict[str, object] = {}

        def post_and_read() -> bool:
            segment = {"traceId": "through-1", "traceSegmentId": "through-1.0", "service": "through"}
            try:
                served["post"] = collector.post("/v3/segment", json.dumps(segment).encode())
                served["traces"] = collector.get("/api/traces?service=through")
            except OSError:  # closed on arrival: every slot is taken
                return False
            return True

        wait_until(post_and_read, REQUEST_DEADLINE_S + SLACK_S, "a normal request served", interval=0.1)
        assert served["post"] == (200, {})
        assert [t["trace_id"] for t in served["traces"]] == ["through-1"]  # type: ignore[attr-defined]
        wait_until(lambda: not slow.open, REQUEST_DEADLINE_S + SLACK_S, "every trickling client cut off")
    finally:
        slow.stop()
    assert slow.closed == [b""] * MAX_CONNECTIONS
    assert collector.stats()["refused"]["too_slow"] == MAX_CONNECTIONS


def test_a_client_gone_before_its_answer_is_no_traceback(collector: LocalCollector) -> None:
    """A client that reads the start of its answer and closes (a browser cancelling a
    request, a script that read enough) resets the connection while the collector still
    writes: socketserver printed a traceback into the collector's output for each."""
    for _ in range(50):
        with _connect(collector) as s:
            s.sendall(b"POST /v3/segments HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # no length: 411
            assert s.recv(12) == b"HTTP/1.1 411"
    assert collector.stats()["refused"]["no_length"] == 50
    assert "Traceback" not in collector.log()


def _doc() -> str:
    return " ".join((Path(__file__).resolve().parent.parent / "docs" / "collector.md").read_text().split())


def test_docs_state_the_http_limits() -> None:
    doc = _doc()
    assert f"At most {MAX_CONNECTIONS} HTTP connections" in doc
    assert f"within {REQUEST_DEADLINE_S:g} s of the connection's opening" in doc
    assert f"idle for {KEEPALIVE_IDLE_S:g} s between requests" in doc
    assert f"not all in within {REQUEST_DEADLINE_S:g} s" in doc


def _segment(trace_id: str) -> tracing_pb2.SegmentObject:
    return tracing_pb2.SegmentObject(
        traceId=trace_id, traceSegmentId=f"{trace_id}.0", service="agent", serviceInstance="agent-0"
    )


def test_idle_grpc_streams_cannot_starve_agents(collector: LocalCollector) -> None:
    """Clients open more ``collect`` streams than the receiver has threads and never send
    or finish: before, each held a thread for good and every agent's call waited behind
    them. Now at most MAX_STREAMS are open (more are refused at once), unary calls find a
    thread, an agent's stream takes the place of a silent one, and a silent stream is ended
    (DEADLINE_EXCEEDED) after STREAM_IDLE_S, while a stream that keeps sending, however
    long, is not."""
    never = threading.Event()

    def silent() -> Iterator[tracing_pb2.SegmentObject]:
        never.wait()  # sends nothing until the test ends
        yield from ()

    def steady() -> Iterator[tracing_pb2.SegmentObject]:
        n, until = 0, time.monotonic() + STREAM_IDLE_S + 2
        while time.monotonic() < until:  # longer than the idle limit, a message every 1/4 s
            n += 1
            yield _segment(f"steady-{n}")
            time.sleep(0.25)

    path = "/skywalking.v3.TraceSegmentReportService/collect"
    out = common_pb2.Commands.FromString
    put = tracing_pb2.SegmentObject.SerializeToString
    attacks = MAX_STREAMS + 4
    agent_refused = 0
    with (
        grpc.insecure_channel(collector.grpc_address) as attacker,
        grpc.insecure_channel(collector.grpc_address) as agent,
    ):
        try:
            steady_call = agent.stream_unary(path, put, out).future(steady())
            wait_until(lambda: collector.stats()["calls"].get("grpc:collect") == 1, 30, "the steady stream")
            silent_calls = [attacker.stream_unary(path, put, out).future(silent()) for _ in range(attacks)]
            # unary calls of an agent (segments, keep-alive) go through meanwhile
            sync = agent.unary_unary(
                "/skywalking.v3.TraceSegmentReportService/collectInSync",
                tracing_pb2.SegmentCollection.SerializeToString,
                out,
            )
            sync(tracing_pb2.SegmentCollection(segments=[_segment("sync-1")]), timeout=STREAM_IDLE_S / 2)
            ping = agent.unary_unary(
                "/skywalking.v3.ManagementService/keepAlive",
                management_pb2.InstancePingPkg.SerializeToString,
                out,
            )
            ping(management_pb2.InstancePingPkg(service="agent", serviceInstance="agent-0"), timeout=10)

            def agent_stream() -> bool:  # as an agent does: on RESOURCE_EXHAUSTED, again later
                nonlocal agent_refused
                try:
                    agent.stream_unary(path, put, out)(iter([_segment("stream-1")]), timeout=10)
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                    agent_refused += 1
                    return False
                return True

            wait_until(agent_stream, STREAM_IDLE_S + SLACK_S, "an agent's stream taken", interval=0.2)
            codes = []
            for call in silent_calls:
                with pytest.raises(grpc.RpcError) as err:
                    call.result(timeout=STREAM_IDLE_S + SLACK_S)
                codes.append((err.value.code(), err.value.details()))
            steady_call.result(timeout=SLACK_S)  # ended by its client: OK
        finally:
            never.set()
    exhausted = [d for c, d in codes if c == grpc.StatusCode.RESOURCE_EXHAUSTED]
    idle = [d for c, d in codes if c == grpc.StatusCode.DEADLINE_EXCEEDED]
    # the steady stream had one place; the silent ones the others (or took each other's)
    assert len(exhausted) + len(idle) == attacks and len(idle) >= MAX_STREAMS - 1, codes
    assert all("streams open, the most it takes at once" in d for d in exhausted)
    assert all(d.startswith("swmp collector: no message for ") for d in idle)
    stats = collector.stats()
    assert stats["refused"]["too_many_streams"] == len(exhausted) + agent_refused
    assert stats["refused"]["stream_idle"] == len(idle)
    kept = {t["trace_id"] for t in collector.get("/api/traces?service=agent&limit=1000")}
    assert {"sync-1", "stream-1"} <= kept
    assert sum(t.startswith("steady-") for t in kept) >= STREAM_IDLE_S * 4
    assert "Traceback" not in collector.log()


class _Context:
    """Stands in for a call's ServicerContext (cancel is what ending a call falls back to)."""

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def test_a_new_stream_takes_the_place_of_a_silent_one() -> None:
    """With every place taken, a new stream ends the one silent longest, if it is silent for
    more than STREAM_EVICT_IDLE_S; streams that send keep theirs (the new one is refused)."""
    intake = Intake(Store())
    streams = _Streams(intake, limit=2, idle_s=3600, evict_idle_s=STREAM_EVICT_IDLE_S)
    ctx = [_Context() for _ in range(4)]
    a, b = streams.open("collect", ctx[0]), streams.open("collect", ctx[1])
    assert a is not None and b is not None
    assert streams.open("collect", ctx[2]) is None  # both just opened
    a.last -= STREAM_EVICT_IDLE_S + 5
    b.last -= STREAM_EVICT_IDLE_S + 1
    c = streams.open("collect", ctx[2])
    assert c is not None and a.ended and ctx[0].cancelled and not b.ended and not ctx[1].cancelled
    b.last = time.monotonic()  # b sends a message
    assert streams.open("collect", ctx[3]) is None
    assert dict(intake.refused) == {"stream_idle": 1}
    assert "2 streams open: ended" in intake.first_refusal["stream_idle"]
    for s in (a, b, c):
        streams.close(s)


def test_docs_state_the_grpc_limits() -> None:
    doc = _doc()
    assert f"answers on {WORKERS} threads" in doc and f"At most {MAX_STREAMS} streams are open" in doc
    assert f"sends no message for {STREAM_IDLE_S:g} s" in doc and f"When all {MAX_STREAMS} are open" in doc
    assert f"over the {MAX_STREAMS} open at once" in doc and f"no message for {STREAM_IDLE_S:g} s, or" in doc
    assert STREAM_EVICT_IDLE_S == 1.0 and "sent nothing for the last second" in doc
