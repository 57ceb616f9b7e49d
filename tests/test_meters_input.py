"""Meters inside the application: what it hands them never raises nor poisons a report, the
agent's stop turns them off, and the machine CPU meter leaves psutil's own baseline alone."""

from __future__ import annotations

import math
import sys
import textwrap
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from reporter_proc.records import METER
from swmp import _sink, meters
from swmp.config import Config
from swmp.meters import RATE, Counter, Histogram
from tests.collector import Collector
from tests.test_agent_launcher import base_env, run


@pytest.fixture
def sink(meter_sink: _sink.MemorySink) -> _sink.MemorySink:
    """The conftest's meter sink, the meter reporter started (reports on demand only)."""
    meters.start_meter_reporter(
        Config(agent_meter_reporter_period=3600.0, agent_pvm_meter_reporter_active=False)
    )
    return meter_sink


def last_report(memory: _sink.MemorySink) -> dict[str, list[Any]]:
    records = [orjson.loads(p) for t, p in list(memory.records) if t == METER]
    return {m[1]: m for m in records[-1][3]}


def test_values_that_are_not_finite_numbers_are_refused_and_counted(sink: _sink.MemorySink) -> None:
    counter = Counter("orders")
    histogram = Histogram("latency", steps=[10, 100])
    refused = meters.stats()["values_refused"]
    bad: list[Any] = ["1", None, 1j, b"2", [1], math.nan, math.inf, -math.inf, Decimal("NaN")]
    for value in bad:
        counter.increment(value)  # none of these raises into the application
    for value in ("5", None, 2j):
        histogram.observe(value)
    counter.increment(Decimal("1.5"))  # other libraries' real numbers count as their float
    counter.increment(Fraction(1, 2))
    counter.increment(True)
    counter.increment(2)
    histogram.observe(Decimal(50))
    assert meters.stats()["values_refused"] == refused + len(bad) + 3
    assert counter.value == 5.0  # the total is the accepted values', and finite
    assert meters.report() is True
    got = last_report(sink)
    assert got["orders"][3] == 5.0
    assert dict(histogram.buckets) == {0.0: 0, 10.0: 1, 100.0: 0}


def test_a_meter_that_cannot_be_read_leaves_the_others_and_their_deltas(
    sink: _sink.MemorySink, monkeypatch: pytest.MonkeyPatch
) -> None:
    rate = Counter("handled", mode=RATE)
    rate.increment(4)
    Histogram("broken", steps=[1])

    def unreadable(self: Any, undo: list[Any]) -> Any:
        raise RuntimeError("cannot read")

    monkeypatch.setattr(Histogram, "_collect", unreadable)
    errors = meters.stats()["errors"]
    assert meters.report() is True  # the rest of the report goes out
    assert last_report(sink)["handled"][3] == 4.0  # the RATE delta taken first is in it
    assert meters.stats()["errors"] == errors + 1


def test_the_machine_cpu_meter_leaves_psutils_own_baseline_alone() -> None:
    from swmp.meters._pvm import _Pvm

    psutil.cpu_percent(None)  # the application's own reading starts here
    baseline = psutil._last_cpu_times  # type: ignore[attr-defined]
    pvm = _Pvm()
    pvm.install()
    try:
        pvm.prime()
        assert 0.0 <= pvm.total_cpu() <= 100.0
        assert 0.0 <= pvm.total_cpu() <= 100.0
        assert psutil._last_cpu_times is baseline  # type: ignore[attr-defined]
    finally:
        pvm.uninstall()


STOP = textwrap.dedent(
    """
    import gc, swmp
    from swmp import meters
    from swmp.meters._pvm import pvm
    swmp.start()
    meters.Counter("jobs").increment()
    assert meters.start_in_this_process(), "the meter thread did not start"
    before = meters.stats()["reports_written"]
    swmp.stop()
    print("thread", meters.stats()["thread_alive"], "gc", pvm._on_gc in gc.callbacks,
          "flushed", meters.stats()["reports_written"] - before)
    """
)


def test_stop_turns_the_meters_off_after_their_last_report(tmp_path: Path) -> None:
    with Collector(enable_http=False) as collector:
        env = base_env(
            tmp_path,
            collector,
            SW_AGENT_METER_REPORTER_ACTIVE="true",
            SW_AGENT_PVM_METER_REPORTER_ACTIVE="true",
            SW_AGENT_REPORTER_PROCESS="false",
        )
        proc = run([sys.executable, "-c", STOP], env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["thread", "False", "gc", "False", "flushed", "1"], (
        proc.stdout + proc.stderr
    )
