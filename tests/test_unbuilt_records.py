"""Records a worker meant to write but could not encode are counted where ``swmp status``
reads them: its ring's ``C_UNBUILT_RECORDS`` word (a process without a ring: the arena header,
as its other records), once per record, never raised. Before, they were counted only in the
process's own memory (``tracing.stats.serialize_errors``, the log reporter's ``errors``), or
not at all (loguru's sink), where no one could read them.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ipc import Arena
from ipc.ring import anonymous_ring
from reporter_proc import records as R
from reporter_proc.loop import ring_losses
from reporter_proc.status import exit_summary
from swmp import _sink, meters, tracing
from swmp._arena_sink import ArenaSink
from swmp.config import Config, load
from swmp.instrument import log_reporter
from swmp.instrument import loguru as sw_loguru
from swmp.instrument import structlog as sw_structlog
from swmp.profiling.sampler import Profiled
from swmp.profiling.sampler import stats as sampler_stats
from swmp.tracing.context import new_local_span
from swmp.tracing.identity import identity
from tests.slot_holder import SlotHolder
from tests.test_agent_runtime import segment
from tests.test_cli_support import cli_json, wait_for
from tests.test_profiling import task

REPO = Path(__file__).resolve().parent.parent


class CountingSink(_sink.MemorySink):
    """A memory sink that counts what the agent could not build (as ``ProcessSink`` does)."""

    def __init__(self) -> None:
        super().__init__()
        self.unbuilt = 0

    def count_unbuilt(self) -> None:
        self.unbuilt += 1


@pytest.fixture
def counting(trace_sink: _sink.MemorySink) -> Iterator[CountingSink]:
    sink = CountingSink()
    _sink.set_sink(sink)
    yield sink
    _sink.set_sink(trace_sink)


@pytest.fixture(autouse=True)
def _keep_identity() -> Iterator[None]:
    before = (identity.service, identity.instance)
    yield
    identity.set(*before)


# -- the ring's word -------------------------------------------------------------------------
def test_the_writer_adds_to_its_rings_unbuilt_word() -> None:
    writer, reader, _control = anonymous_ring()
    assert writer.stats().unbuilt_records == 0
    assert writer.add_unbuilt() and writer.add_unbuilt(2)
    assert writer.stats().unbuilt_records == 3 == reader.stats().unbuilt_records
    assert writer.stats().dropped_records == 0  # a drop of its own kind, not the ring's
    writer._disable("released its slot")
    assert not writer.add_unbuilt()  # the slot is no longer this process's to count in
    assert writer.stats().unbuilt_records == 3


def test_the_sink_counts_in_its_ring_or_else_as_its_records(tmp_path: Path) -> None:
    # The records are made as "base" (no worker bound yet in this process: another test's
    # sink may have left this process named as its worker, and then nothing is re-stamped).
    identity.set(service="svc", instance="base")
    arena = Arena.create(str(tmp_path / "a.arena"), slots=1, ring_capacity=1 << 16)
    try:
        sink = ArenaSink(arena, "svc", "base", owner_pid=os.getppid())
        # Claims slot 0, then cannot re-stamp the record with the new instance name: an
        # internal error, counted in the ring it was meant for.
        assert not sink.write(R.LOG, b"[]")
        assert arena.ring_stats(0).unbuilt_records == 1 and sink.dropped_no_slot == 0
        assert sink.write(R.SEGMENT, segment("base"))
        sink.count_unbuilt()
        assert arena.ring_stats(0).unbuilt_records == 2
        assert arena.lost_counts().no_slot_records == 0
        sink.leave(for_good=True)
        # After its goodbye the process has no ring: counted as its late records are.
        sink.count_unbuilt()
        assert arena.lost_counts().late_records == 1 and arena.ring_stats(0).unbuilt_records == 2
        with SlotHolder(arena):  # a worker that found every slot taken
            other = ArenaSink(arena, "svc", "base", owner_pid=os.getppid())
            other.count_unbuilt()
            assert arena.lost_counts().no_slot_records == 1
    finally:
        arena.close()


def test_the_reporters_exit_line_counts_them_as_lost(tmp_path: Path) -> None:
    arena = Arena.create(str(tmp_path / "a.arena"), slots=2, ring_capacity=1 << 16)
    try:
        writer = arena.claim_slot()
        assert writer is not None and writer.add_unbuilt(3)
        assert ring_losses(arena) == (0, 0, 3, 0)
    finally:
        arena.close()
    level, message = exit_summary({"sent.segment": 5}, frozenset({"segment"}), 0, 0, 3)
    assert level == logging.WARNING and message.endswith("lost 3 (unbuilt 3)")


# -- where the agent gives up on a record ----------------------------------------------------
def test_a_segment_the_fallback_cannot_encode_is_counted(counting: CountingSink) -> None:
    with new_local_span("a") as s:
        s.tags = ["k", object()]  # bypassing tag(), which would have made it text
    assert tracing.stats.serialize_errors == 1 and not counting.records
    assert counting.unbuilt == 1


def test_a_log_record_that_cannot_be_built_is_counted(counting: CountingSink) -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    reporter = log_reporter.LogReporter(formatted=False)
    # (an unprintable argument is reported by its repr: tests/test_logs_shapes.py; an
    # exc_info that is no exception triple makes formatException raise)
    bad_exc_info: Any = ("not", "an exception")
    record = logging.LogRecord("app", logging.WARNING, __file__, 1, "x %s", (1,), bad_exc_info)
    errors = log_reporter.stats.errors
    reporter.report(record)  # build_failed
    assert counting.unbuilt == 1
    log_reporter.write_log(0, "body", ["k", Unprintable()])  # type: ignore[list-item]  # cannot encode
    assert counting.unbuilt == 2 and log_reporter.stats.errors == errors + 2
    assert not counting.records


def test_structlog_event_that_cannot_be_encoded_is_counted(counting: CountingSink) -> None:
    import structlog

    class AppLogger:
        def warning(self, **event: Any) -> None:
            pass

    structlog.configure(
        processors=[structlog.processors.add_log_level],
        logger_factory=lambda *args: AppLogger(),
        cache_logger_on_first_use=False,
    )
    sw_structlog.install(load({}))
    loop: dict[str, Any] = {}
    loop["self"] = loop
    try:
        structlog.get_logger().warning("loop", data=loop)
    finally:
        sw_structlog.uninstall()
        structlog.reset_defaults()
    assert counting.unbuilt == 1 and not counting.records


def test_a_loguru_message_the_sink_cannot_read_is_counted(counting: CountingSink) -> None:
    sink = sw_loguru._Sink(False)
    errors = log_reporter.stats.errors
    sink(object())  # no .record: returned silently, uncounted, before
    assert counting.unbuilt == 1 and log_reporter.stats.errors == errors + 1
    assert not counting.records


def test_a_meter_report_that_cannot_be_built_is_counted(
    meter_sink: _sink.MemorySink, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = CountingSink()
    _sink.set_sink(sink)
    meters.start_meter_reporter(
        Config(agent_meter_reporter_period=3600.0, agent_pvm_meter_reporter_active=False)
    )
    meters.Counter("c").increment()

    def refuse(record: Any) -> bytes:
        raise TypeError("not encodable")

    monkeypatch.setattr("swmp.meters._report.R.encode", refuse)
    assert meters.report() is False
    assert sink.unbuilt == 1 and not sink.records


def test_a_profile_snapshot_that_cannot_be_encoded_is_counted(counting: CountingSink) -> None:
    def source(depth: int) -> list[str]:
        return [object()]  # type: ignore[list-item]  # cannot be encoded, even escaped

    profiled = Profiled(task(), "s1", source, started_mono=time.monotonic(), depth=5, max_profile_s=60)
    dropped = sampler_stats.dropped
    assert profiled.sample(time.monotonic())
    assert counting.unbuilt == 1 and not counting.records and sampler_stats.dropped == dropped + 1


# -- end to end: a real agent process, then ``swmp status`` ---------------------------------
SCRIPT = """
import sys
from swmp.tracing.context import new_local_span
with new_local_span("fine"):
    pass
with new_local_span("bad") as s:
    s.tags = ["k", object()]  # cannot be encoded, even escaped
open(sys.argv[1], "w").close()
sys.stdin.read()  # until the test is done reading the arena
"""


@pytest.mark.parametrize("process_mode", ["true", "false"])
def test_swmp_status_shows_what_a_worker_could_not_encode(tmp_path: Path, process_mode: str) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    script, ready = tmp_path / "app.py", tmp_path / "ready"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SW_", "SWMP_", "UWSGI_"))}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "SW_AGENT_COLLECTOR_BACKEND_SERVICES": "127.0.0.1:1",  # nothing answers; not needed
            # ... so the exit would spend the whole flushing deadline (5 s) failing to deliver.
            "SW_AGENT_REPORTER_SHUTDOWN_TIMEOUT": "0.5",
            "SW_AGENT_ARENA_DIR": str(shm),
            "SW_AGENT_METER_REPORTER_ACTIVE": "false",
            "SW_AGENT_LOG_REPORTER_ACTIVE": "false",
            "SW_AGENT_REPORTER_PROCESS": process_mode,  # thread mode: its ring is in a private arena
        }
    )
    app = subprocess.Popen(
        [sys.executable, "-m", "swmp.cli", "run", "--", sys.executable, str(script), str(ready)],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        wait_for(lambda: ready.exists() or app.poll() is not None, 60, "the application")
        assert app.poll() is None, "the application exited early"
        _rc, report = cli_json("status", "--interval", "0", "--dir", str(shm))
        (agent,) = report["agents"]
        assert agent["totals"]["unbuilt"] == 1
        assert agent["totals"]["written"] >= 2  # its announce and the segment that could be
        assert [sl["unbuilt"] for sl in agent["slots"]] == [1]
        _rc, health = cli_json("health", "--interval", "0", "--dir", str(shm))
        (drops,) = [c for a in health["agents"] for c in a["checks"] if c["name"] == "drops"]
        assert drops["figures"]["unbuilt"] == 1 and drops["figures"]["dropped"] >= 1
        text = subprocess.run(
            [sys.executable, "-m", "swmp.cli", "status", "--interval", "0", "--dir", str(shm)],
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
        assert "1 records workers could not encode (slot 0: 1" in text, text
    finally:
        if app.poll() is None:
            assert app.stdin is not None
            app.stdin.close()
            try:
                app.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(app.pid, signal.SIGKILL)
                app.wait()
