"""What the agent adds per request when the CPU caches are cold: the in-process stand-in for a
server well below saturation.

A saturated worker runs request after request with its code and data in the CPU caches; a
worker at 10 % of its capacity sleeps between requests while other processes (the server's
master, the kernel's network stack, other tenants of the machine) take the caches over, so
every request starts cold and pays for each distinct cache line of code and data it
touches. Warm-loop benchmarks and instruction counts miss that cost, the fixed-rate rows of
``prefork_bench.py`` measure it but move by tens of microseconds with everything else on
the machine. Here each call is preceded by a write over a buffer of ``--thrash`` MiB (0:
warm; larger than the L2 cache: the L2 emptied; larger than the L3 cache: all of it), and
the call with swmp and the same call without it alternate call by call (ABBA), so both see
the same machine; the table gives the median time of each and the difference.

Cases (each against the same call without the agent's part):

* ``wsgi-request``: a WSGI request through ``WSGIMiddleware`` around a trivial application
  (the entry span, its tags, the status, the segment serialized and written into a real
  shared-memory ring); the baseline calls the application directly.
* ``sql-call``: a DB-API ``execute`` wrapped by the data-store instrumentation, inside a
  trace (the exit span with its SQL tags; its share of the segment's serialization is not
  in it, see ``datastore_bench.py``), against the unwrapped method in the same trace.

    python benchmarks/cold_cache_bench.py [--case NAME] [--thrash MIB ...] [--calls N] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository
from benchmarks._abba import alternate

Op = Callable[[], Any]
Case = tuple[Op, Op, Op]  # (without the agent's part, with it, untimed work between two pairs)
DRAIN_EVERY = 100  # calls between two (untimed) reads of the ring: the reporter's part


def _wsgi_case() -> Case:
    from benchmarks.framework_bench import _trivial_wsgi, wsgi_serve
    from swmp.instrument.wsgi import WSGIMiddleware

    plain, traced = wsgi_serve(_trivial_wsgi), wsgi_serve(WSGIMiddleware(_trivial_wsgi))
    return lambda: plain(1), lambda: traced(1), lambda: None


def _sql_case() -> Case:
    from benchmarks.datastore_bench import TraceInContext, noop_cursor

    wrapped, cursor = noop_cursor()
    trace = TraceInContext()
    calls = [0]

    def rotate() -> None:  # a new trace every 50 traced calls (below the span limit)
        calls[0] += 1
        if calls[0] % 50 == 0:
            trace.rotate()

    def plain() -> None:
        trace.run(cursor.execute, "SELECT 1", None)

    def traced() -> None:
        trace.run(wrapped, cursor, "SELECT 1", None)

    return plain, traced, rotate


CASES: dict[str, Callable[[], Case]] = {"wsgi-request": _wsgi_case, "sql-call": _sql_case}


def measure(case: Case, thrash_mib: float, calls: int, drain: Callable[[], object]) -> dict[str, float]:
    plain, traced, between = case
    size = int(thrash_mib * (1 << 20))
    buf = ctypes.create_string_buffer(max(size, 64))

    def thrash(i: int) -> None:
        if size:
            ctypes.memset(buf, i & 0xFF, size)  # every line of the buffer written: the caches taken over

    for _ in range(200):  # warm up: first spans, caches of the interpreter
        plain()
        traced()
        between()
    drain()

    def after_pair(i: int) -> None:
        between()
        if i % DRAIN_EVERY == DRAIN_EVERY - 1:
            drain()

    p, t = alternate(plain, traced, calls, before=thrash, between=after_pair)
    drain()
    return {
        "plain_ns": statistics.median(p),
        "swmp_ns": statistics.median(t),
        "added_ns": statistics.median(t) - statistics.median(p),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="(repeatable; default: all)")
    ap.add_argument("--thrash", type=float, nargs="+", default=[0, 2, 64], help="MiB written before a call")
    ap.add_argument("--calls", type=int, default=3000, help="calls of each mode per case and thrash size")
    ap.add_argument("--quick", action="store_true", help="smoke test: 300 calls, no L3-sized buffer")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    if args.quick:
        args.calls, args.thrash = 300, [0, 2]

    from benchmarks._ring import Ring
    from swmp import tracing
    from swmp.config import load

    tracing.configure(load({}, agent_log_reporter_active=False))
    ring = Ring()
    rows = []
    try:
        for name in args.case or list(CASES):
            case = CASES[name]()
            for mib in args.thrash:
                ring.warm()  # resident, as a busy worker's ring is (benchmarks/_ring.py)
                rows.append({"case": name, "thrash_mib": mib, **measure(case, mib, args.calls, ring.drain)})
    finally:
        ring.close()
    print(f"median per call, {args.calls} calls of each (ABBA), Python {sys.version.split()[0]}")
    print(f"{'case':<14}{'thrash MiB':>11}{'plain us':>10}{'swmp us':>10}{'added us':>10}")
    for r in rows:
        print(
            f"{r['case']:<14}{r['thrash_mib']:>11g}{r['plain_ns'] / 1000:>10.2f}"
            f"{r['swmp_ns'] / 1000:>10.2f}{r['added_ns'] / 1000:>10.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"calls": args.calls, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
