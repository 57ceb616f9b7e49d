"""Reading entry and exit spans out of the collector's dump (segments as protobuf JSON),
shared by the server tests of aiohttp, Tornado, Sanic and gRPC."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.collector import CollectorProcess
from tests.servers import SWMP_RUN, Proc, port_open, segments_of, wait_until


def tags(span: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t.get("value", "") for t in span.get("tags", [])}


def log_text(span: dict[str, Any]) -> str:
    return "\n".join(kv.get("value", "") for lg in span.get("logs", []) for kv in lg.get("data", []))


def new_trace() -> str:
    return uuid.uuid4().hex


def segments_of_trace(
    col: CollectorProcess, trace_id: str, n: int = 1, timeout: float = 20.0
) -> list[dict[str, Any]]:
    """Wait for ``n`` segments of ``trace_id``; returns them (all of them, once there are n)."""
    found: list[dict[str, Any]] = []

    def enough() -> bool:
        nonlocal found
        found = [s for s in segments_of(col) if s.get("traceId") == trace_id]
        return len(found) >= n

    try:
        wait_until(enough, timeout, f"{n} segment(s) of trace {trace_id}", interval=0.1)
    except AssertionError as e:
        raise AssertionError(f"{e}; got {found}") from None
    return found


def spans_where(segments: list[dict[str, Any]], **want: Any) -> list[dict[str, Any]]:
    """Spans of ``segments`` whose fields equal ``want`` (``spanType`` defaults to Entry)."""
    out = []
    for seg in segments:
        for span in seg.get("spans", []):
            fields = {"spanType": "Entry", "isError": False, "spanId": 0, **span}
            if all(fields.get(k) == v for k, v in want.items()):
                out.append({**fields, "_segment": seg})
    return out


def the_span(segments: list[dict[str, Any]], **want: Any) -> dict[str, Any]:
    found = spans_where(segments, **want)
    assert len(found) == 1, f"expected one span {want}, found {len(found)} in {segments}"
    return found[0]


@contextlib.contextmanager
def running(workdir: Path, name: str, argv: list[str], env: dict[str, str], port: int) -> Iterator[Proc]:
    """``swmp run -- argv`` until the block ends (stopped by pid with all its processes);
    the block starts once ``port`` accepts connections."""
    proc = Proc([*SWMP_RUN, *argv], env, workdir / f"{name}.log", marker=env["SW_AGENT_ARENA_DIR"])
    proc.start()
    try:

        def up() -> bool:
            if not proc.alive():
                raise AssertionError(f"{name} exited:\n{proc.tail()}")
            return port_open(port)

        wait_until(up, 60, f"{name} on port {port}")
        yield proc
    finally:
        proc.stop()
