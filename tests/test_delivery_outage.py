"""Backend outages with the reporter's default settings lose nothing (issue 16).

Real processes: a stand-in master spawns the real reporter with the settings the agent
builds from its configuration defaults; paced writers fill their rings at a steady rate; the
test collector (a gRPC server in its own process) goes away for the outage and comes back on
the same port. The scenario lives in ``benchmarks/outage_bench.py``, which also runs the
full-size case (10 minutes at 1,000 segments/s) by hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from benchmarks.outage_bench import run_outage
from ipc import Arena
from reporter_proc import records as R
from reporter_proc.loop import Reporter
from reporter_proc.process import ReporterThread
from reporter_proc.settings import ReporterSettings
from tests.collector import Collector
from tests.test_reporter_helpers import segment, spawn_writer, wait_for


def test_an_outage_with_default_settings_loses_nothing_and_delivery_resumes(tmp_path: Path) -> None:
    res = run_outage(tmp_path, rate=300, before_s=4, outage_s=30, after_s=6, deadline_s=120)
    print(f"\noutage result: {res}")
    assert res.written > 10_000
    assert res.ring_overflows == 0  # the reporter kept draining the rings during the outage
    assert res.lost == 0, f"{res.lost} of {res.written} segments never reached the backend"
    assert res.delivered == res.written
    # The default spool took what the retries could not deliver, and gave it back.
    assert res.spooled > 0 and res.replayed > 0
    assert not res.dropped
    assert 0 <= res.resume_s < 30  # measured ~1 s on a quiet machine; only "resumed" is asserted


@contextlib.contextmanager
def written(arena_path: Path, ring_bytes: int, records: list[tuple[int, bytes]]) -> Iterator[Arena]:
    """An arena whose ring holds ``records`` (a writer process keeps its slot until the end).
    Forked before the test creates any gRPC object."""
    arena = Arena.create(str(arena_path), slots=2, ring_capacity=ring_bytes)
    writer = spawn_writer(arena.path, records, hold=True)
    try:
        writer.wait_written()
        yield arena
    finally:
        assert writer.release() == 0
        arena.close()


def deliver(arena: Arena, settings: ReporterSettings, done: Callable[[], bool]) -> Reporter:
    """Run the real reporter (thread mode) until ``done``, stop it, return it for its counters."""
    handle = ReporterThread(arena.path, settings, arena=arena)
    handle.start()
    try:
        assert wait_for(done, 60, "delivery")
        assert handle.stop(10)
        assert handle.reporter is not None
        return handle.reporter
    finally:
        handle.stop(10)


def test_a_batch_the_grpc_backend_finds_too_large_is_split_and_delivered(tmp_path: Path) -> None:
    # The test collector's gRPC server takes 4 MiB per message (grpcio's default), like an
    # OAP with a lowered limit: a batch above it is answered RESOURCE_EXHAUSTED.
    big = [(R.SEGMENT, segment(f"big-{i}", spans=200)) for i in range(300)]  # ~9 MB of JSON
    giant = (R.SEGMENT, segment("giant", spans=60_000))  # ~6 MB on the wire alone
    assert sum(len(p) for _, p in big) > 8 << 20
    records = [*big[:150], giant, *big[150:]]
    with written(tmp_path / "big.arena", 32 << 20, records) as arena, Collector() as c:
        s = ReporterSettings(
            protocol="grpc",
            backends=(c.grpc_address,),
            service="svc",
            batch_max_records=100_000,
            batch_max_bytes=64 << 20,  # one batch for everything: the backend must refuse it
            flush_interval_s=0.5,
            retry_backoff_base_s=0.05,
        )
        reporter = deliver(arena, s, lambda: len(c.segments) >= 300)
        assert sorted(seg.traceId for seg in c.segments) == sorted(f"big-{i}" for i in range(300))
        assert reporter.counters.dropped.get("too_large") == 1
        assert reporter.counters.dropped.get("backend", 0) == 0


@pytest.mark.parametrize("status", [413, 400])
def test_http_too_large_or_bad_request_costs_no_good_record(tmp_path: Path, status: int) -> None:
    # The HTTP receiver answers the first segment call 413 (or 400): the real HTTP sender maps
    # it to TooLargeError (InvalidDataError) and delivery sends halves, which are accepted.
    records = [(R.SEGMENT, segment(f"h-{i}")) for i in range(64)]
    with written(tmp_path / "h.arena", 1 << 20, records) as arena, Collector() as c:
        c.fail_next(1, http_status=status, methods=["/v3/segments"])
        s = ReporterSettings(
            protocol="http",
            backends=(c.http_address,),
            service="svc",
            flush_interval_s=0.3,
            retry_backoff_base_s=0.05,
        )
        reporter = deliver(arena, s, lambda: len(c.segments) >= 64)
        assert sorted(seg.traceId for seg in c.segments) == sorted(f"h-{i}" for i in range(64))
        assert not {k: v for k, v in reporter.counters.dropped.items() if v}
