"""gRPC with real server and client processes under ``swmp run``, checked at the collector:
sync and ``grpc.aio`` servers and clients, the four call kinds, ``sw8`` carried in metadata
from every client exit span to the server's entry span, errors, ignored methods. And the
agent's own reporter, in thread mode (``SW_AGENT_REPORTER_PROCESS=false``) inside an
application whose gRPC / aiohttp are instrumented, is never traced.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.collector import CollectorProcess, free_port
from tests.servers import (
    SWMP_RUN,
    Proc,
    agent_env,
    collector_process,
    messages,
    quiet_for,
    request,
    segments_of,
    wait_until,
)
from tests.web_checks import new_trace, running, segments_of_trace, tags, the_span

pytestmark = [pytest.mark.servers, pytest.mark.timeout(150)]

APP = "tests.e2e_apps.grpc_app"
IGNORED = {"SW_PLUGIN_GRPC_IGNORED_METHODS": "/demo.Health/Check"}
METHODS = ("Get", "List", "Upload", "Chat", "Fail", "Relay")
EXPECTED = {
    "Get": "user-7",
    "List": ["u0", "u1", "u2"],
    "Upload": "a+b",
    "Chat": ["X", "Y"],
    "Fail": "StatusCode.NOT_FOUND",
    "Relay": "relayed-user-8",
    "Check": "ok",
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("grpc")


@pytest.fixture(scope="module")
def col(workdir: Path) -> Iterator[CollectorProcess]:
    with collector_process(workdir) as c:
        yield c


def run_client(workdir: Path, col: CollectorProcess, name: str, port: int, mode: str) -> dict[str, Any]:
    env = agent_env(workdir / name, col.grpc_address, service=name, extra=IGNORED)
    out = workdir / f"{name}.json"
    proc = Proc(
        [*SWMP_RUN, sys.executable, "-m", APP, "call", str(port), mode, str(out)],
        env,
        workdir / f"{name}.log",
        marker=env["SW_AGENT_ARENA_DIR"],
    )
    proc.start()
    try:
        code = proc.wait_exit(60)
        assert code == 0, f"client exited with {code}:\n{proc.tail()}"
        return json.loads(out.read_text())  # type: ignore[no-any-return]
    finally:
        proc.stop()


def spans_of(col: CollectorProcess, service: str) -> list[dict[str, Any]]:
    return [{**span, "_segment": seg} for seg in segments_of(col, service) for span in seg.get("spans", [])]


@pytest.mark.parametrize(("server_mode", "client_mode"), [("sync", "aio"), ("aio", "sync")])
def test_calls_and_streams_server_and_client(
    workdir: Path, col: CollectorProcess, server_mode: str, client_mode: str
) -> None:
    port = free_port()
    server, client = f"grpc-{server_mode}-server", f"grpc-{client_mode}-client"
    env = agent_env(workdir / server, col.grpc_address, service=server, extra=IGNORED)
    with running(workdir, server, [sys.executable, "-m", APP, "serve", str(port), server_mode], env, port):
        assert run_client(workdir, col, client, port, client_mode) == EXPECTED
        # 6 client segments; 6 server segments plus the one of Relay's inner Get.
        wait_until(
            lambda: len(segments_of(col, client)) >= 6 and len(segments_of(col, server)) >= 7,
            30,
            "the gRPC segments",
            interval=0.1,
        )
        quiet_for(col, 1.0)
    client_spans, server_spans = spans_of(col, client), spans_of(col, server)
    assert len(client_spans) == 6 and len(segments_of(col, server)) == 7
    for method in METHODS:
        op = f"/demo.Users/{method}"
        (exit_span,) = [s for s in client_spans if s["operationName"] == op]
        assert exit_span["spanType"] == "Exit"
        assert exit_span["componentId"] == 23
        assert exit_span["spanLayer"] == "RPCFramework"
        assert exit_span["peer"] == f"127.0.0.1:{port}"
        t = tags(exit_span)
        assert t["grpc.method"] == op and t["grpc.url"] == f"127.0.0.1:{port}"
        code = "StatusCode.NOT_FOUND" if method == "Fail" else "StatusCode.OK"
        assert t["grpc.status_code"] == code
        assert bool(exit_span.get("isError")) == (method == "Fail")
        # The server's entry span continues exactly this exit span's trace.
        entries = [
            s
            for s in server_spans
            if s["operationName"] == op
            and s.get("spanType", "Entry") == "Entry"
            and s.get("refs", [{}])[0].get("parentTraceSegmentId") == exit_span["_segment"]["traceSegmentId"]
        ]
        assert len(entries) == 1, (op, server_spans)
        entry = entries[0]
        assert entry["componentId"] == 23 and entry["spanLayer"] == "RPCFramework"
        assert entry["_segment"]["traceId"] == exit_span["_segment"]["traceId"]
        assert entry["refs"][0].get("parentSpanId", 0) == exit_span.get("spanId", 0)
        assert tags(entry)["grpc.status_code"] == code
        assert bool(entry.get("isError")) == (method == "Fail")
        if method == "Fail":
            assert "NOT_FOUND" in tags(entry)["grpc.status_code"]
            assert entry.get("logs"), "the abort is logged on the server span"
    # Relay: the server's entry span has an exit span to Get, whose entry is a third segment.
    relay = next(s for s in server_spans if s["operationName"] == "/demo.Users/Relay" and "refs" in s)
    inner_exit = the_span([relay["_segment"]], spanType="Exit", operationName="/demo.Users/Get")
    inner_entry = [
        s
        for s in server_spans
        if s["operationName"] == "/demo.Users/Get"
        and s.get("refs", [{}])[0].get("parentTraceSegmentId") == relay["_segment"]["traceSegmentId"]
    ]
    assert len(inner_entry) == 1
    assert inner_entry[0]["refs"][0]["parentSpanId"] == inner_exit["spanId"]
    assert inner_entry[0]["refs"][0]["parentEndpoint"] == "/demo.Users/Relay"
    # SW_PLUGIN_GRPC_IGNORED_METHODS: neither side recorded the health check.
    assert not [s for s in client_spans + server_spans if "Health" in s["operationName"]]


def _reporter_ops(col: CollectorProcess, service: str) -> list[str]:
    """Operations in the segments of ``service`` that belong to the agent's own shipping."""
    return [
        span["operationName"]
        for seg in segments_of(col, service)
        for span in seg.get("spans", [])
        if span["operationName"].startswith(("/skywalking.", "/v3/"))
        or str(span.get("peer", "")).endswith((f":{col.grpc_port}", f":{col.http_port}"))
    ]


def test_thread_mode_reporter_grpc_is_not_traced(workdir: Path, col: CollectorProcess) -> None:
    """The reporter runs on a thread of this gRPC server and ships over grpc.aio, with the
    gRPC instrumentation installed in the same process: none of its calls is traced."""
    port = free_port()
    name = "grpc-threaded"
    env = agent_env(workdir / name, col.grpc_address, service=name, reporter_process=False, extra=IGNORED)
    with running(workdir, name, [sys.executable, "-m", APP, "serve", str(port), "sync"], env, port):
        assert run_client(workdir, col, "grpc-threaded-client", port, "sync")["Get"] == "user-7"
        wait_until(lambda: len(segments_of(col, name)) >= 7, 30, "the server's segments", interval=0.1)
        # Its reporter kept shipping (segments, keep-alives) while the app was traced.
        wait_until(
            lambda: any(m.get("service") == name for m in messages(col, "ping")),
            15,
            "a keep-alive from the in-process reporter",
            interval=0.1,
        )
        quiet_for(col, 1.0)
    assert _reporter_ops(col, name) == []


def test_thread_mode_reporter_http_is_not_traced(workdir: Path, col: CollectorProcess) -> None:
    """Same with the HTTP protocol: the in-process reporter's aiohttp ClientSession is not
    traced by the aiohttp client instrumentation of the application it runs in."""
    port = free_port()
    name = "aiohttp-threaded"
    env = agent_env(
        workdir / name,
        col.http_address,
        service=name,
        reporter_process=False,
        extra={"SW_AGENT_PROTOCOL": "http"},
    )
    argv = [
        sys.executable,
        "-m",
        "aiohttp.web",
        "-H",
        "127.0.0.1",
        "-P",
        str(port),
        "tests.e2e_apps.async_web:aiohttp_main",
    ]
    with running(workdir, name, argv, env, port):
        trace = new_trace()
        assert request(port, f"/call?port={port}", trace).status == 200
        segs = segments_of_trace(col, trace, n=3)
        # The application's own aiohttp client call is traced ...
        assert the_span(segs, spanType="Exit", componentId=7008)["operationName"] == "/users/9"
        quiet_for(col, 1.0)
    # ... the reporter's (POST /v3/segments to the collector) is not.
    assert _reporter_ops(col, name) == []
