"""Building and writing one METER record of every meter."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from reporter_proc import records as R
from swmp._sink import count_unbuilt, get_sink
from swmp.meters._registry import registry
from swmp.meters._state import locks, stats, warn_once
from swmp.tracing.identity import identity


def _build(undo: list[Callable[[], None]]) -> bytes | None:
    """One METER record of every meter (None when there is nothing to report). What RATE
    counters handed over goes into ``undo`` as it is taken, so a report that fails later
    still gives it back. A meter that cannot be read is left out of this report alone."""
    meters: list[list[Any]] = []
    for meter in registry.meters():
        try:
            entry = meter._collect(undo)
        except Exception:
            stats.errors += 1
            warn_once(f"collect:{meter.name}", "swmp: meter %r could not be read", meter.name)
            continue
        if entry is not None:
            meters.append(entry)
    if not meters:
        return None
    record = R.meter_report(int(time.time() * 1000), identity.service, identity.instance, meters)
    return R.encode(record)


def report() -> bool:
    """Write one report of every meter now; True if the sink took it. Never raises."""
    with locks.report:
        undo: list[Callable[[], None]] = []
        try:
            payload = _build(undo)
            if payload is None:
                return False
            ok = get_sink().write(R.METER, payload)
        except Exception:
            stats.errors += 1
            count_unbuilt()  # (sinks never raise: the report could not be built)
            warn_once("report", "swmp: a meter report failed")
            ok = False
        if ok:
            stats.reports_written += 1
        else:
            stats.reports_dropped += 1
            for give_back in undo:  # RATE deltas travel with the next report
                give_back()
        return ok
