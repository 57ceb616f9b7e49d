"""Cost of one stdlib log call with swmp's log reporting installed, side by side with none.

The logger has one handler (a ``logging.NullHandler``: what the application's own handlers
cost is theirs) and the reporter runs at its default level, WARNING. Cases:

* ``debug, logger at INFO``: the call returns at ``isEnabledFor``; no record is made and
  swmp's hook is never reached (the common case in production code);
* ``info, not reported``: a record is made and handled; the hook sets ``record.tid`` and
  compares the level (the "no record reported" cost), outside and inside a trace;
* ``warning, reported``: the record is formatted with the default layout, serialized and
  written into a real shared-memory ring (an ipc Arena in a temp dir, drained between
  rounds, untimed), inside a trace.

Each round runs ``plain`` (hook not installed) and ``swmp`` (hook installed) in turn for
every case, so drift hits both alike; the table shows the minimum (the least disturbed round)
and the median over rounds of ns per call.

    python benchmarks/log_bench.py [--rounds N] [--calls N] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ipc
from swmp import _sink
from swmp.config import load
from swmp.instrument import log_reporter
from swmp.tracing.context import new_entry_span
from swmp.tracing.span import current_span


def _timed(fn: Callable[[], Any], calls: int) -> float:
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        return (time.perf_counter_ns() - start) / calls
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=50_000)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    tmp = tempfile.TemporaryDirectory(prefix="swmp-logbench-")
    arena = ipc.Arena.create(str(Path(tmp.name) / "bench.arena"), slots=1, ring_capacity=64 * 1024 * 1024)
    writer = arena.claim_slot()
    assert writer is not None
    reader = arena.reader(writer.slot)
    _sink.set_sink(writer)

    logger = logging.getLogger("bench.app")
    logger.propagate = False
    logger.addHandler(logging.NullHandler())
    logger.setLevel(logging.INFO)
    config = load({})
    span = new_entry_span("/bench")  # made current (or not) around each timed case

    cases: list[tuple[str, bool, Callable[[], None]]] = [
        ("debug, logger at INFO", False, lambda: logger.debug("order %s paid", 42)),
        ("info, not reported", False, lambda: logger.info("order %s paid", 42)),
        ("info, not reported", True, lambda: logger.info("order %s paid", 42)),
        ("warning, reported", True, lambda: logger.warning("order %s paid", 42)),
    ]
    results: dict[str, dict[str, list[float]]] = {}

    for _ in range(args.rounds):
        for mode in ("plain", "swmp"):
            if mode == "swmp":
                log_reporter.install(config)
            try:
                for name, traced, fn in cases:
                    token = current_span.set(span if traced else None)
                    try:
                        ns = _timed(fn, args.calls)
                    finally:
                        current_span.reset(token)
                    key = f"{name} ({'in a trace' if traced else 'no trace'})"
                    results.setdefault(key, {}).setdefault(mode, []).append(ns)
                    while reader.read(1_000_000):
                        reader.commit()
            finally:
                log_reporter.uninstall()

    stats = writer.stats()
    _sink.set_sink(None)
    arena.unlink()
    tmp.cleanup()

    rows = []
    print(f"{'':<44} {'minimum':^29} {'median':^29}")
    print(f"{'case':<44} {'plain':>9} {'swmp':>9} {'added':>9} {'plain':>9} {'swmp':>9} {'added':>9}")
    for key, by_mode in results.items():
        lo_p, lo_s = min(by_mode["plain"]), min(by_mode["swmp"])
        med_p, med_s = statistics.median(by_mode["plain"]), statistics.median(by_mode["swmp"])
        rows.append(
            {
                "case": key,
                "plain_min_ns": round(lo_p, 1),
                "swmp_min_ns": round(lo_s, 1),
                "plain_median_ns": round(med_p, 1),
                "swmp_median_ns": round(med_s, 1),
            }
        )
        print(
            f"{key:<44} {lo_p:>9.0f} {lo_s:>9.0f} {lo_s - lo_p:>+9.0f} "
            f"{med_p:>9.0f} {med_s:>9.0f} {med_s - med_p:>+9.0f}"
        )
    if stats.dropped_records:
        print(f"warning: the ring dropped {stats.dropped_records} records", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rounds": args.rounds, "calls": args.calls, "rows": rows}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
