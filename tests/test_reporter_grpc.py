"""The reporter with the real gRPC sender against the test collector.

All writer forks happen before this process creates any gRPC object (forking a process
with live gRPC threads is what the design warns about).
"""

from __future__ import annotations

import os
import signal
from typing import Any

import grpc
import pytest

from ipc import Arena
from reporter_proc import records as R
from reporter_proc.process import ReporterThread
from reporter_proc.settings import ReporterSettings
from tests.collector import Collector, CollectorProcess
from tests.test_reporter_helpers import (
    Owner,
    log_record,
    meter_record,
    pid_alive,
    segment,
    spawn_writer,
    wait_for,
    write_all,
)
from tests.test_reporter_process import settings_json

FAST: dict[str, Any] = dict(
    flush_interval_s=0.02,
    poll_interval_s=0.02,
    retry_backoff_base_s=0.02,
    retry_backoff_max_s=0.1,
    retry_max_attempts=10,
    shutdown_deadline_s=5.0,
    status_interval_s=0.05,
    keepalive_interval_s=0.2,
    send_timeout_s=3.0,
)


def test_every_kind_reaches_the_collector_with_retries(tmp_path: Any) -> None:
    arena = Arena.create(str(tmp_path / "g.arena"), slots=4, ring_capacity=256 * 1024)
    recs = [(R.SEGMENT, segment(f"g-{i}", spans=3)) for i in range(150)]
    recs += [(R.LOG, log_record(f"line-{i}")) for i in range(20)]
    recs += [(R.METER, meter_record(f"m{i}", float(i))) for i in range(5)]
    worker = spawn_writer(arena.path, recs, announce=True, hold=True, service="svc")
    slot = worker.wait_written()
    handle = None
    try:
        with Collector() as c:
            c.fail_next(2, grpc_code=grpc.StatusCode.UNAVAILABLE, methods=["collectInSync"])
            s = ReporterSettings(protocol="grpc", backends=(c.grpc_address,), service="svc", **FAST)
            handle = ReporterThread(arena.path, s, arena=arena)
            handle.start()
            assert c.wait_for(lambda: len(c.segments) >= 150 and len(c.logs) >= 20 and len(c.meters) >= 5, 20)
            assert c.wait_for(lambda: len(c.pings) >= 2 and len(c.properties) >= 1, 10)
            assert handle.stop(10)
            reporter = handle.reporter
            assert reporter is not None
            assert reporter.counters.retried >= 2
            assert sorted(seg.traceId for seg in c.segments) == sorted(f"g-{i}" for i in range(150))
            first = next(seg for seg in c.segments if seg.traceId == "g-0")
            assert first.traceSegmentId == "seg-g-0" and len(first.spans) == 3
            assert first.spans[0].operationName == "GET /item/0" and first.spans[1].peer == "db:5432"
            assert sorted(lg.body.text.text for lg in c.logs) == sorted(f"line-{i}" for i in range(20))
            assert sorted(m.singleValue.name for m in c.meters) == [f"m{i}" for i in range(5)]
            props = c.properties[0]
            assert props.service == "svc" and props.serviceInstance == f"inst-{slot}"
            kv = {p.key: p.value for p in props.properties}
            assert kv["language"] == "python" and kv["slot"] == str(slot)
            assert kv["Process No."] == str(worker.pid)
            assert c.pings[0].serviceInstance == f"inst-{slot}"
    finally:
        if handle is not None:
            handle.stop(10)
        worker.release()
        arena.close()


@pytest.mark.timeout(120)
def test_a_spawned_reporter_ships_to_a_collector_process(tmp_path: Any) -> None:
    with CollectorProcess(str(tmp_path)) as collector:
        o = Owner(
            str(tmp_path),
            settings_json(str(tmp_path), protocol="grpc", backends=[collector.grpc_address], service="e2e"),
        )
        try:
            rep = o.reporter_pid()
            for w in range(2):
                write_all(o.arena_path, [(R.SEGMENT, segment(f"p{w}-{i}")) for i in range(200)])
            assert collector.wait_for(lambda lines: sum(ln["kind"] == "segment" for ln in lines) >= 400, 30)
            os.kill(o.spawned[0], signal.SIGTERM)
            wait_for(lambda: not pid_alive(rep), 15, "reporter exit")
            ids = [ln["message"]["traceId"] for ln in collector.received("segment")]
            assert sorted(ids) == sorted(f"p{w}-{i}" for w in range(2) for i in range(200))
        finally:
            o.cleanup()
