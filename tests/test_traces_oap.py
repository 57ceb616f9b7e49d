"""``swmp traces --oap`` against a real SkyWalking OAP (the shared session OAP of
tests/realpeers.py): the list and the tree come from its GraphQL API."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest

from reporter_proc.protocol.generated import common_pb2, tracing_pb2, tracing_pb2_grpc
from tests.localcollector import swmp_traces
from tests.oap_graphql import wait_for
from tests.realpeers import OapServer, unique_name

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parent.parent


def _segments(front: str, back: str, trace_id: str) -> list[tracing_pb2.SegmentObject]:
    now = int(time.time() * 1000)
    kv = common_pb2.KeyStringValuePair
    parent = tracing_pb2.SegmentObject(
        traceId=trace_id,
        traceSegmentId=f"{trace_id}.front",
        service=front,
        serviceInstance=f"{front}-w0",
        spans=[
            tracing_pb2.SpanObject(
                spanId=1,
                parentSpanId=0,
                startTime=now + 2,
                endTime=now + 30,
                operationName="/stock",
                peer="127.0.0.1:8001",
                spanType=tracing_pb2.Exit,
                spanLayer=tracing_pb2.Http,
                componentId=7000,
                isError=True,
                tags=[kv(key="http.status_code", value="500")],
            ),
            tracing_pb2.SpanObject(
                spanId=0,
                parentSpanId=-1,
                startTime=now,
                endTime=now + 35,
                operationName="/call",
                spanType=tracing_pb2.Entry,
                spanLayer=tracing_pb2.Http,
                componentId=7001,
                isError=True,
                tags=[kv(key="http.status_code", value="500")],
            ),
        ],
    )
    child = tracing_pb2.SegmentObject(
        traceId=trace_id,
        traceSegmentId=f"{trace_id}.back",
        service=back,
        serviceInstance=f"{back}-w1",
        spans=[
            tracing_pb2.SpanObject(
                spanId=0,
                parentSpanId=-1,
                startTime=now + 5,
                endTime=now + 25,
                operationName="/stock",
                spanType=tracing_pb2.Entry,
                spanLayer=tracing_pb2.Http,
                componentId=7001,
                isError=True,
                refs=[
                    tracing_pb2.SegmentReference(
                        refType=tracing_pb2.CrossProcess,
                        traceId=trace_id,
                        parentTraceSegmentId=f"{trace_id}.front",
                        parentSpanId=1,
                        parentService=front,
                        parentServiceInstance=f"{front}-w0",
                        parentEndpoint="/call",
                        networkAddressUsedAtPeer="127.0.0.1:8001",
                    )
                ],
                tags=[kv(key="http.status_code", value="500")],
            )
        ],
    )
    return [parent, child]


def test_swmp_traces_reads_an_oap(oap_server: OapServer) -> None:
    front, back = unique_name("traces-front"), unique_name("traces-back")
    trace_id = uuid.uuid4().hex
    with grpc.insecure_channel(oap_server.grpc) as ch:
        stub = tracing_pb2_grpc.TraceSegmentReportServiceStub(ch)
        stub.collectInSync(
            tracing_pb2.SegmentCollection(segments=_segments(front, back, trace_id)), timeout=30
        )
    wait_for(lambda: len(oap_server.query.trace(trace_id)) == 3, timeout=60, what="the trace in the OAP")

    def traces(*args: str) -> list[str]:
        return swmp_traces("--oap", oap_server.rest, *args).stdout.splitlines()

    listing = wait_for(lambda: traces("--service", front, "--errors")[1:], timeout=60, what="the trace list")
    (row,) = listing
    assert row.split()[1:] == ["35", "ms", "ERROR", "/call", "-", trace_id]
    # A window reaching into yesterday, which this OAP (started today, one H2 table a day)
    # answers with nothing: the command asks again for today's part of it.
    assert traces("--service", front, "--errors", "--minutes", str(25 * 60))[1:] == listing
    tree = traces(trace_id)
    assert (
        tree[0] == f"trace {trace_id}  2 segments, 3 spans, 35 ms, services: {back}, {front}, 3 error spans"
    )
    assert tree[1].startswith(f"/call  Entry  [{front} @ {front}-w0]  +0 ms  35 ms  status 500  ERROR")
    assert tree[2].startswith("└─ /stock  Exit  -> 127.0.0.1:8001  +2 ms  28 ms  status 500  ERROR")
    assert tree[3] == f"   └─ /stock  Entry  [{back} @ {back}-w1]  +5 ms  20 ms  status 500  ERROR"


def test_swmp_demo_against_an_oap(oap_server: OapServer, tmp_path: Path) -> None:
    """``swmp demo --oap``: the same demo, reporting to the OAP and reading the trees back from it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SW_", "SWMP_"))}
    env.update(
        TMPDIR=str(tmp_path),
        NO_COLOR="1",
        XDG_DATA_HOME=str(tmp_path / "data"),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    )
    cmd = [sys.executable, "-m", "swmp.cli", "demo", "--oap", oap_server.grpc, "--oap-query", oap_server.rest]
    out = subprocess.run(
        [*cmd, "--requests", "80"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert f"Reporting to the SkyWalking OAP at {oap_server.grpc}" in text
    crossing = text.split("A trace across both services:", 1)[1].split("\n\n", 1)[0].splitlines()
    assert crossing[0].endswith(f"--oap {oap_server.rest}")
    assert "2 segments, 3 spans" in crossing[1]
    assert "[demo-frontend @ " in crossing[2] and "[demo-inventory @ " in crossing[4]
    failing = text.split("A trace with an error:", 1)[1].split("\n\n", 1)[0].splitlines()
    assert failing[2].endswith("ERROR")
    assert "Trace page" not in text  # the OAP has no page of ours
    assert not (tmp_path / "data").exists()  # no collector, so no database either
    assert [p.name for p in tmp_path.iterdir()] == []
