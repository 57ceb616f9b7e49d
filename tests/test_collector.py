"""``swmp collector``: the agent under Gunicorn reports to it over gRPC and HTTP; what it
stores equals what was sent; its page shows the trace in a real headless Chromium; bad
input is refused and counted; ``swmp traces`` reads it back."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from reporter_proc.protocol.generated import common_pb2, tracing_pb2, tracing_pb2_grpc
from swmp.collector import decode
from swmp.collector.store import Store
from tests.collector import free_port
from tests.localcollector import LocalCollector, local_collector, swmp_traces
from tests.servers import agent_env, gunicorn_command, load, run_server, wait_until

pytestmark = pytest.mark.servers
ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCollector]:
    with local_collector(tmp_path_factory.mktemp("local-collector")) as col:
        yield col


@dataclass
class AgentRun:
    service: str
    transport: str
    requests: int
    calls: int  # requests to /call: each adds a second segment (the /cpu it calls)
    sent: dict[str, int]  # what the agent's reporter says it sent, per kind


def _status_sent(arena_dir: Path) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-m", "swmp.cli", "status", "--json", "--interval", "0", "--dir", str(arena_dir)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        check=False,
    )
    agents = json.loads(out.stdout)["agents"]
    assert len(agents) == 1, out.stdout
    return {k: int(v) for k, v in (agents[0]["sent"] or {}).items()}


def _stored_segments(col: LocalCollector, service: str) -> int:
    return sum(t["segments"] for t in col.get(f"/api/traces?service={service}&limit=1000"))


def _run_agent(col: LocalCollector, workdir: Path, transport: str) -> AgentRun:
    service = f"col-{transport}-{uuid.uuid4().hex[:6]}"
    port = free_port()
    backend = col.grpc_address if transport == "grpc" else col.http_address
    env = agent_env(
        workdir,
        backend,
        service=service,
        extra={
            "SW_AGENT_PROTOCOL": transport,
            "DOWNSTREAM_URL": f"http://127.0.0.1:{port}/cpu",
            "SW_AGENT_LOG_REPORTER_ACTIVE": "true",
        },
    )
    paths = ["/cpu", "/call", "/error", "/io"]
    total = 40
    with run_server("gunicorn", workdir, gunicorn_command(port, workers=2), env, port=port, workers=2) as srv:
        # one at a time: /call calls this same server, and two sync workers both in /call would wait
        # on each other
        results = load(port, paths, total, concurrency=1, traced_every=0)
        assert sorted({r.status for r in results}) == [200, 500]
        calls = sum(1 for r in results if r.path == "/call")
        expected = total + calls
        wait_until(
            lambda: _stored_segments(col, service) >= expected, 30, f"{expected} segments of {service}"
        )
        # the reporter's own count of sent segments catches up with what the collector has
        sent: dict[str, int] = {}

        def agree() -> bool:
            sent.update(_status_sent(srv.arena_dir))
            return sent.get("segment") == _stored_segments(col, service)

        wait_until(agree, 20, "the agent's sent count to match the collector's")
    return AgentRun(service, transport, total, calls, sent)


@pytest.fixture(scope="module")
def agent_runs(collector: LocalCollector, tmp_path_factory: pytest.TempPathFactory) -> dict[str, AgentRun]:
    return {t: _run_agent(collector, tmp_path_factory.mktemp(f"agent-{t}"), t) for t in ("grpc", "http")}


def _kv(pairs: list[list[str]]) -> dict[str, str]:
    return {k: v for k, v in pairs}


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_agent_under_gunicorn_stored_equals_sent(
    collector: LocalCollector, agent_runs: dict[str, AgentRun], transport: str
) -> None:
    run = agent_runs[transport]
    traces = collector.get(f"/api/traces?service={run.service}&limit=1000")
    # counts: one trace per request, one segment per process a request went through
    assert len(traces) == run.requests
    assert sum(t["segments"] for t in traces) == run.requests + run.calls == run.sent["segment"]
    assert sum(1 for t in traces if t["is_error"]) == run.requests // 4  # every /error

    # a full trace: /call -> (exit) /cpu -> (entry, other segment) /cpu
    call = next(t for t in traces if t["endpoint"] == "/call")
    assert call["segments"] == 2 and call["spans"] == 3 and not call["is_error"]
    doc = collector.get(f"/api/trace/{call['trace_id']}")
    segs = doc["segments"]
    assert {s["transport"] for s in segs} == {transport}
    assert {s["service"] for s in segs} == {run.service}
    parent = next(s for s in segs if any(sp["operation"] == "/call" for sp in s["spans"]))
    child = next(s for s in segs if s is not parent)
    by_type = {s["type"]: s for s in parent["spans"]}
    entry, exit_ = by_type["Entry"], by_type["Exit"]
    assert entry["parent_span_id"] == -1 and exit_["parent_span_id"] == entry["span_id"]
    assert entry["layer"] == "Http" and entry["component_id"] == 7001  # Flask
    assert _kv(entry["tags"])["http.method"] == "GET"
    assert _kv(entry["tags"])["http.status_code"] == "200"
    assert _kv(entry["tags"])["http.url"].endswith("/call")
    assert exit_["operation"] == "/cpu" and exit_["peer"].startswith("127.0.0.1:")
    (child_entry,) = child["spans"]
    assert child_entry["type"] == "Entry" and child_entry["operation"] == "/cpu"
    (ref,) = child_entry["refs"]
    assert ref["type"] == "CrossProcess"
    assert ref["trace_id"] == call["trace_id"] == child["trace_id"] == parent["trace_id"]
    assert (ref["parent_segment_id"], ref["parent_span_id"]) == (parent["segment_id"], exit_["span_id"])
    assert ref["parent_service"] == run.service and ref["parent_endpoint"] == "/call"
    assert entry["start"] <= exit_["start"] <= exit_["end"] <= entry["end"]

    # an error trace: the error span, and the app's error log line with the trace's id
    err = next(t for t in traces if t["is_error"])
    err_doc = collector.get(f"/api/trace/{err['trace_id']}")
    (seg,) = err_doc["segments"]
    span = seg["spans"][0]
    assert span["is_error"] and _kv(span["tags"])["http.status_code"] == "500"
    assert any("Exception on /error" in lg["content"] for lg in err_doc["logs"]), err_doc["logs"]

    # instances: every worker announced itself and keeps alive
    (svc,) = [s for s in collector.get("/api/services") if s["service"] == run.service]
    assert len(svc["instances"]) == 2
    assert all(i["last_ping_ms"] and i["properties"] for i in svc["instances"])


def _full_segment(trace_id: str, segment_id: str) -> tracing_pb2.SegmentObject:
    kv = common_pb2.KeyStringValuePair
    return tracing_pb2.SegmentObject(
        traceId=trace_id,
        traceSegmentId=segment_id,
        service="exact",
        serviceInstance="exact-1",
        isSizeLimited=True,
        spans=[
            tracing_pb2.SpanObject(
                spanId=0,
                parentSpanId=-1,
                startTime=1_700_000_000_000,
                endTime=1_700_000_000_042,
                refs=[
                    tracing_pb2.SegmentReference(
                        refType=tracing_pb2.CrossProcess,
                        traceId=trace_id,
                        parentTraceSegmentId="up",
                        parentSpanId=3,
                        parentService="caller",
                        parentServiceInstance="caller-1",
                        parentEndpoint="/up",
                        networkAddressUsedAtPeer="10.0.0.1:80",
                    )
                ],
                operationName="/exact",
                peer="client:1",
                spanType=tracing_pb2.Entry,
                spanLayer=tracing_pb2.Http,
                componentId=7001,
                isError=True,
                skipAnalysis=True,
                tags=[kv(key="http.method", value="GET"), kv(key="dup", value="1"), kv(key="dup", value="2")],
                logs=[tracing_pb2.Log(time=1_700_000_000_040, data=[kv(key="event", value="error")])],
            ),
            tracing_pb2.SpanObject(
                spanId=1,
                parentSpanId=0,
                startTime=1_700_000_000_001,
                endTime=1_700_000_000_002,
                operationName="SELECT",
                peer="db:5432",
                spanType=tracing_pb2.Exit,
                spanLayer=tracing_pb2.Database,
                componentId=22,
            ),
        ],
    )


def test_stored_segment_equals_sent_message_both_transports(collector: LocalCollector) -> None:
    trace_id = uuid.uuid4().hex
    via_grpc, via_http = _full_segment(trace_id, "seg-grpc"), _full_segment(trace_id, "seg-http")
    with grpc.insecure_channel(collector.grpc_address) as ch:
        tracing_pb2_grpc.TraceSegmentReportServiceStub(ch).collectInSync(
            tracing_pb2.SegmentCollection(segments=[via_grpc])
        )
    body = json.dumps([json_format.MessageToDict(via_http)]).encode()
    assert collector.post("/v3/segments", body) == (200, {})
    doc = collector.get(f"/api/trace/{trace_id}")
    stored = {s["segment_id"]: s for s in doc["segments"]}
    for msg, transport in ((via_grpc, "grpc"), (via_http, "http")):
        got = dict(stored[msg.traceSegmentId])
        assert got.pop("transport") == transport
        assert got == decode.segment_doc(msg)
        # and spelled out, so the decoding itself is checked too
        span = got["spans"][0]
        assert span["refs"][0] == {
            "type": "CrossProcess",
            "trace_id": trace_id,
            "parent_segment_id": "up",
            "parent_span_id": 3,
            "parent_service": "caller",
            "parent_instance": "caller-1",
            "parent_endpoint": "/up",
            "address": "10.0.0.1:80",
        }
        assert span["tags"] == [["http.method", "GET"], ["dup", "1"], ["dup", "2"]]
        assert span["logs"] == [{"time": 1_700_000_000_040, "data": [["event", "error"]]}]
        assert (span["type"], span["layer"], span["is_error"], span["skip_analysis"]) == (
            "Entry",
            "Http",
            True,
            True,
        )
        assert got["size_limited"] and got["spans"][1]["layer"] == "Database"


def test_bad_input_is_refused_counted_and_logged_once(collector: LocalCollector) -> None:
    before = collector.stats()["refused"]
    garbage = b"\xff\xff\xff\xff\x0f not protobuf"
    with grpc.insecure_channel(collector.grpc_address) as ch:
        unary = ch.unary_unary("/skywalking.v3.TraceSegmentReportService/collectInSync")
        stream = ch.stream_unary("/skywalking.v3.LogReportService/collect")
        for call in (lambda: unary(garbage, timeout=5), lambda: stream(iter([garbage]), timeout=5)):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert collector.post("/v3/segments", b"{not json")[0] == 400
    assert collector.post("/v3/segments", b'[{"spans": "nope"}]')[0] == 400
    assert collector.post("/v3/logs", b"[]", content_type="text/plain")[0] == 415
    assert collector.post("/v3/nowhere", b"[]")[0] == 404
    # too large: refused on its Content-Length, before the body is read (only the headers go out)
    conn = http.client.HTTPConnection(*collector.http_address.split(":"), timeout=10)
    conn.putrequest("POST", "/v3/segments")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(9 * 1024 * 1024))  # > the 8 MiB default
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413 and json.loads(resp.read())["error"] == "too_large"
    conn.close()

    after = collector.stats()["refused"]
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert delta == {
        "bad_protobuf": 2,
        "bad_json": 1,
        "bad_message": 1,
        "wrong_content_type": 1,
        "unknown_path": 1,
        "too_large": 1,
    }
    # still serving, and what is valid still goes in
    assert (
        collector.post(
            "/v3/segment", json.dumps({"traceId": "ok-after-bad", "traceSegmentId": "s"}).encode()
        )[0]
        == 200
    )
    assert collector.get("/api/trace/ok-after-bad")["segments"][0]["segment_id"] == "s"
    # logged once per reason, even when it happens again
    collector.post("/v3/segments", b"{again")
    log = collector.log()
    assert log.count("(bad_json:") == 1 and log.count("(bad_protobuf:") == 1
    assert "Traceback" not in log


def _chromium(args: list[str], workdir: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM, "chromium is not installed (scripts/test_setup.sh installs it)"
    profile = workdir / f"chrome-profile-{uuid.uuid4().hex[:6]}"
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=10000",
        "--window-size=1400,900",
        *args,
    ]
    env = {**os.environ, "HOME": str(workdir)}
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=env, check=False)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def test_trace_page_in_headless_chromium(
    collector: LocalCollector, agent_runs: dict[str, AgentRun], tmp_path: Path
) -> None:
    run = agent_runs["grpc"]
    traces = collector.get(f"/api/traces?service={run.service}&endpoint=/call&limit=1")
    trace_id = traces[0]["trace_id"]
    url = f"{collector.url}/#/trace/{trace_id}"
    dom = _chromium(["--dump-dom", url], tmp_path).stdout
    assert 'data-ready="1"' in dom, dom[-2000:]
    assert trace_id in dom
    assert dom.count('class="wf-row') == 3  # /call entry, /cpu exit, /cpu entry in the other segment
    assert "/call" in dom and "/cpu" in dom and run.service in dom
    assert "http.status_code" in dom  # the selected span's tags
    # the list page, filtered to errors, shows only error traces of the service
    listing = _chromium(["--dump-dom", f"{collector.url}/#/?service={run.service}&errors=1"], tmp_path).stdout
    assert 'data-ready="1"' in listing
    assert listing.count('<tr class="err">') == run.requests // 4
    assert "/error" in listing and ">/cpu<" not in listing
    shot = Path(os.environ.get("SWMP_SCREENSHOT_DIR", tmp_path)) / "trace-page.png"
    _chromium([f"--screenshot={shot}", url], tmp_path)
    assert shot.exists() and shot.stat().st_size > 10_000


def test_swmp_traces_against_the_collector(
    collector: LocalCollector, agent_runs: dict[str, AgentRun]
) -> None:
    run = agent_runs["http"]

    def traces(*args: str) -> str:
        return swmp_traces("--collector", collector.url, *args).stdout

    listing = traces("--service", run.service, "--limit", "100").splitlines()
    assert listing[0].split() == ["start", "duration", "endpoint", "services", "trace", "id"]
    assert len(listing) == 1 + run.requests
    assert sum("ERROR" in line for line in listing) == run.requests // 4
    errors = traces("--service", run.service, "--errors", "--limit", "100").splitlines()[1:]
    assert len(errors) == run.requests // 4 and all("ERROR" in line and "/error" in line for line in errors)
    call = collector.get(f"/api/traces?service={run.service}&endpoint=/call&limit=1")[0]
    tree = traces(call["trace_id"]).splitlines()
    assert tree[0].startswith(f"trace {call['trace_id']}  2 segments, 3 spans")
    assert tree[1].startswith("/call  Entry") and f"[{run.service} @ " in tree[1]
    assert tree[2].startswith("└─ /cpu  Exit  -> 127.0.0.1:")
    assert tree[3].startswith("   └─ /cpu  Entry") and f"[{run.service} @ " in tree[3]
    assert "ERROR" not in "\n".join(tree)
    err_tree = traces("--service", run.service, "--errors", "--last").splitlines()
    assert err_tree[1].startswith("/error  Entry") and err_tree[1].endswith("status 500  ERROR")
    # unreachable collector: a message and exit status 1, no traceback
    out = swmp_traces("--collector", f"http://127.0.0.1:{free_port()}", ok=False)
    assert (
        out.returncode == 1 and "is `swmp collector` running?" in out.stderr and "Traceback" not in out.stderr
    )


def test_database_is_private(collector: LocalCollector) -> None:
    assert collector.db is not None
    assert stat.S_IMODE(collector.db.stat().st_mode) == 0o600
    assert stat.S_IMODE(collector.db.parent.stat().st_mode) == 0o700


def _segment_doc(trace_id: str, n: int) -> dict[str, Any]:
    return decode.segment_doc(_full_segment(trace_id, f"seg-{n}"))


def test_store_size_cap_evicts_oldest_first(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db", max_bytes=20_000)
    for i in range(100):
        store.add_segments([_segment_doc(f"t{i:03d}", i)], "grpc")
    counts = store.counts()
    assert counts["bytes"] <= 20_000 and counts["evicted"] > 0
    kept = sorted(t["trace_id"] for t in store.traces(limit=1000))
    assert kept == [f"t{i:03d}" for i in range(100 - len(kept), 100)]  # the newest survived
    store.close()
    # the byte count survives a restart
    again = Store(tmp_path / "s.db", max_bytes=20_000)
    assert again.counts()["bytes"] == counts["bytes"]
    again.close()


def test_store_retention_drops_old_rows() -> None:
    store = Store(max_bytes=10**9, retention_s=0.5)
    store.add_segments([_segment_doc("old", 1)], "grpc")
    store.touch_instance("exact", "gone", ping=True)
    time.sleep(0.6)  # retention is about wall-clock age: the rows must really be older
    store.add_segments([_segment_doc("new", 2)], "grpc")
    store.sweep()
    assert [t["trace_id"] for t in store.traces()] == ["new"]
    assert store.counts()["expired"] == 1
    assert [i["instance"] for s in store.services() for i in s["instances"]] == ["exact-1"]


@pytest.mark.parametrize("taken", ["grpc", "http"])
def test_port_in_use_exits_1(taken: str, tmp_path: Path) -> None:
    """docs/collector.md: exit status 1 when a port cannot be bound. gRPC's default
    SO_REUSEPORT let a second collector share the first one's gRPC port (each got part of
    the agents' data) instead of failing."""
    from swmp.collector.server import Collector

    with Collector(Store(":memory:"), grpc_port=0, http_port=0) as first:
        port = first.grpc_port if taken == "grpc" else first.http_port
        ports = ["--grpc-port", str(port), "--http-port", "0"]
        if taken == "http":
            ports = ["--grpc-port", "0", "--http-port", str(port)]
        ready = tmp_path / "ready"
        cmd = [sys.executable, "-m", "swmp.collector", "--memory", *ports, "--ready-file", str(ready)]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: proc.poll() is not None or ready.exists(), 60, "the second collector")
            listening = ready.exists()
        finally:
            if proc.poll() is None:
                proc.terminate()
            _, err = proc.communicate(timeout=30)
        assert not listening, f"a second collector listens on the {taken} port {port} in use"
        assert proc.returncode == 1 and "cannot listen" in err, (proc.returncode, err)
