"""Building and writing one METER record of every meter."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from reporter_proc import records as R
from swmp._sink import get_sink
from swmp.meters._registry import registry
from swmp.meters._state import locks, stats, warn_once
from swmp.tracing.identity import identity


def _build() -> tuple[bytes | None, list[Callable[[], None]]]:
    """One METER record of every meter (None when there is nothing to report)."""
    undo: list[Callable[[], None]] = []
    meters: list[list[Any]] = []
    for meter in registry.meters():
        entry = meter._collect(undo)
        if entry is not None:
            meters.append(entry)
    if not meters:
        return None, undo
    record = R.meter_report(int(time.time() * 1000), identity.service, identity.instance, meters)
    return R.encode(record), undo


def report() -> bool:
    """Write one report of every meter now; True if the sink took it. Never raises."""
    with locks.report:
        undo: list[Callable[[], None]] = []
        try:
            payload, undo = _build()
            if payload is None:
                return False
            ok = get_sink().write(R.METER, payload)
        except Exception:
            stats.errors += 1
            warn_once("report", "swmp: a meter report failed")
            ok = False
        if ok:
            stats.reports_written += 1
        else:
            stats.reports_dropped += 1
            for give_back in undo:  # RATE deltas travel with the next report
                give_back()
        return ok


