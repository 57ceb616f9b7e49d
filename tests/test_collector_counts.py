"""The test collector's count-only mode (benchmarks): counts like the keeping one, keeps nothing."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from reporter_proc.protocol.generated import (
    management_pb2,
    management_pb2_grpc,
    tracing_pb2,
    tracing_pb2_grpc,
)
from tests.collector import Collector, CollectorProcess


def _send(address: str) -> None:
    segments = [
        tracing_pb2.SegmentObject(traceId="t", traceSegmentId=f"s{i}", service="svc") for i in range(3)
    ]
    with grpc.insecure_channel(address) as ch:
        tracing_pb2_grpc.TraceSegmentReportServiceStub(ch).collectInSync(
            tracing_pb2.SegmentCollection(segments=segments)
        )
        tracing_pb2_grpc.TraceSegmentReportServiceStub(ch).collect(iter(segments[:2]))
        management_pb2_grpc.ManagementServiceStub(ch).keepAlive(
            management_pb2.InstancePingPkg(service="svc", serviceInstance="i")
        )


@pytest.mark.parametrize("keep", [True, False], ids=["keeping", "count-only"])
def test_summary_is_the_same_either_way(keep: bool) -> None:
    with Collector(http_port=0, keep=keep) as col:
        _send(col.grpc_address)
        assert col.wait_for(lambda: col.summary()["ping"] == 1)
        summary = col.summary()
        assert (summary["segment"], summary["ping"], summary["log"]) == (5, 1, 0)
        assert summary["calls"]["grpc:collectInSync"] == 1
        assert len(col.segments) == (5 if keep else 0)
        assert len(col.pings) == (1 if keep else 0)


def test_count_only_process_writes_its_summary(tmp_path: Path) -> None:
    summary_file = tmp_path / "summary.json"
    with CollectorProcess(
        str(tmp_path), ["--summary-file", str(summary_file), "--count-only"], dump=False
    ) as col:
        _send(col.grpc_address)
    summary = json.loads(summary_file.read_text())
    assert (summary["segment"], summary["ping"]) == (5, 1)
