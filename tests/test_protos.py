"""The committed generated modules are what scripts/gen_protos.sh makes of the .proto files."""

from __future__ import annotations

import filecmp
import subprocess
from pathlib import Path

from tests.collector import REPO_ROOT

GENERATED = REPO_ROOT / "reporter_proc" / "protocol" / "generated"


def test_generated_modules_are_fresh(tmp_path: Path) -> None:
    out = tmp_path / "generated"
    subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "gen_protos.sh"), str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    fresh = sorted(p.name for p in out.iterdir())
    committed = sorted(p.name for p in GENERATED.iterdir() if p.is_file())
    assert fresh == committed, "run scripts/gen_protos.sh: the set of generated files changed"
    _, mismatch, errors = filecmp.cmpfiles(out, GENERATED, fresh, shallow=False)
    stale = mismatch + errors
    assert not stale, f"stale generated modules {stale}: run scripts/gen_protos.sh"


def test_wire_facts() -> None:
    # A few numbers from the protocol notes that a typo in a .proto would silently break.
    from reporter_proc.protocol.generated import logging_pb2, meter_pb2, tracing_pb2

    span = tracing_pb2.SpanObject.DESCRIPTOR
    assert span.full_name == "skywalking.v3.SpanObject"
    assert {f.name: f.number for f in span.fields} == {
        "spanId": 1,
        "parentSpanId": 2,
        "startTime": 3,
        "endTime": 4,
        "refs": 5,
        "operationName": 6,
        "peer": 7,
        "spanType": 8,
        "spanLayer": 9,
        "componentId": 10,
        "isError": 11,
        "tags": 12,
        "logs": 13,
        "skipAnalysis": 14,
    }
    assert tracing_pb2.SpanLayer.Value("FAAS") == 6 and tracing_pb2.RefType.Value("CrossThread") == 1
    assert logging_pb2.LogData.DESCRIPTOR.fields_by_name["layer"].number == 8
    assert meter_pb2.MeterData.DESCRIPTOR.fields_by_name["timestamp"].number == 5
    services = {
        s.full_name: [m.name for m in s.methods]
        for mod in (tracing_pb2, meter_pb2)
        for s in mod.DESCRIPTOR.services_by_name.values()
    }
    assert services["skywalking.v3.TraceSegmentReportService"] == ["collect", "collectInSync"]
    assert services["skywalking.v3.MeterReportService"] == ["collect", "collectBatch"]
