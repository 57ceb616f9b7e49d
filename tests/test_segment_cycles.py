"""A finished segment lets go of its spans: no reference cycle per traced request.

A segment holds its spans (``finished``, ``first``) and every span holds its segment. Left
that way, each traced request leaves a cycle that only the garbage collector frees (its
generation-0 passes then cost ~5,000 instructions per request, benchmarks/framework_cachegrind.py).
Once the record is written the segment drops them, keeping the first span's name for the
endpoint of late work. Run with the native core and the pure-Python one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import gc, json, sys
from swmp import _sink, tracing
from swmp.config import load
from swmp.tracing import context as C, span as S

sink = _sink.MemorySink()
_sink.set_sink(sink)
tracing.configure(load({}, agent_log_reporter_active=False, agent_meter_reporter_active=False))

def request(i):
    entry = C.new_entry_span("/users/{id}", None, 7001, 3)
    with entry:
        with C.new_exit_span("SELECT", "db:5432", 22, 1):
            pass
        with C.new_local_span("work"):
            pass
        entry.set_operation(f"/renamed/{i}") if i == 2 else None
    return entry

for i in range(50):  # warm-up: caches, lazily made objects
    request(i)
gc.collect()
gc.disable()
last = [request(i) for i in range(3)][-1]
seg = last.segment
leftover = gc.collect()
print(json.dumps({
    "native": S.NATIVE,
    "collected": leftover,
    "records": len(sink.records),
    "first": seg.first is None,
    "finished": len(seg.finished),
    "endpoint": seg.endpoint,
    "encoded_endpoint": seg.encode_ids()[2] != "",
}))
"""


def _run(pure: bool) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SWMP_TRACE_PURE", None)
    if pure:
        env["SWMP_TRACE_PURE"] = "1"
    cmd = [sys.executable, "-c", SCRIPT]
    done = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("pure", [False, True], ids=["native", "pure"])
def test_a_written_segment_leaves_no_cycle_and_keeps_its_endpoint(pure: bool) -> None:
    got = _run(pure)
    if not pure:
        from swmp.tracing.span import NATIVE

        assert got["native"] is NATIVE
    assert got["collected"] == 0  # every request's spans and segment freed by reference counting
    assert got["records"] >= 53
    assert got["first"] and got["finished"] == 0
    assert got["endpoint"] == "/renamed/2"  # the first span's final name, after its rename
    assert got["encoded_endpoint"]
