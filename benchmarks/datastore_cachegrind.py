"""Instructions the data-store instrumentations add per call, counted by Valgrind's
cachegrind: the steady companion of ``benchmarks/datastore_bench.py``, whose CPU-time
figures move by microseconds from run to run on a shared machine.

The real drivers against the real local servers (PostgreSQL, MariaDB, Redis, memcached from
``tests/daemons.py``, started once by this script and stopped at the end), not a fake
connection: what a wrapper reads on every call (``cursor.connection``, psycopg's
``conn.info``, asyncpg's protocol arguments, redis-py's pool) is the driver's own objects,
which a stand-in would not reproduce; and the driver's own instructions per call are
deterministic enough (one query, one small reply, the same code path each time) that they
cancel between the two runs below. The workloads are ``datastore_bench.WORKLOADS``
(``SELECT 1`` and its row, a Redis ``GET``, a memcached ``get``).

For each library and mode the workload runs under ``valgrind --tool=cachegrind
--cache-sim=no`` twice, with N and 3N calls after the same warm-up; ``(I(3N) - I(N)) / 2N``
is the per-call count with start-up and connection set-up cancelled. Modes:

* ``bare``: instrumentations not installed, calls inside a trace (a local span per 50
  calls, as ``datastore_bench``'s traced mode), the baseline of ``traced``;
* ``traced``: installed, the same calls and local spans: ``traced - bare`` is what the
  instrumentation adds per traced call (the exit span, its tags, its share of the
  segment's serialization and ring write);
* ``off`` / ``outside`` (``--outside``): not installed / installed, no trace:
  ``outside - off`` is the cost of a call outside any trace.

Segments go to a real shared-memory ring (``framework_bench.Agent``), read only after the
counted calls. Each run has ASLR off (``setarch -R``), a fixed ``PYTHONHASHSEED``, and the
start-up heap frozen out of the garbage collector after the warm-up (a full collection in
one run and not the other moved the figure by 1,000-2,000 instructions per call). What
is left of the noise (the servers' reply timing: an extra ``poll`` or event-loop turn now
and then) is a few hundred instructions; compare versions over several seeds (``--seeds 0
1 2``; the table shows their mean).

    python benchmarks/datastore_cachegrind.py [--lib NAME ...] [--calls N] [--seeds S ...]
        [--outside] [--json PATH] [--servers PATH]

Run the real interpreter binary, not a pyenv shim (``--python``; default: this one's
``sys.executable`` resolved). Slow: ~50x the normal run time per library and mode.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository
from benchmarks import _cachegrind as _cg

ROOT = Path(__file__).resolve().parent.parent


def _child(lib: str, mode: str, n: int, servers: dict[str, Any]) -> None:
    """In the measured process: connect in ``mode``, warm up, make ``n`` calls."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import datastore_bench as db
    from benchmarks import framework_bench as fb
    from swmp.tracing.context import new_local_span

    agent = fb.Agent()
    if mode in ("traced", "outside"):
        agent.install()
    in_trace = mode in ("traced", "bare")

    def ctx() -> Any:
        return new_local_span("batch") if in_trace else contextlib.nullcontext()

    run, _close = db.WORKLOADS[lib](servers)
    run(db.BATCH * 4, ctx)
    agent.drain()
    # Everything made so far out of the collector's way: a full collection falling into
    # one run and not the other would scan the whole start-up heap (thousands of
    # instructions per call at N=500), which is no cost of the calls measured.
    gc.collect()
    gc.freeze()
    run(n, ctx)
    # No drain, no close: reading the ring back is not the instrumentation's cost.
    agent.ring.discard()
    os._exit(0)  # skip the drivers' and the agent's teardown (not what is measured)


def per_call(python: str, lib: str, mode: str, n: int, seed: int, servers: str) -> float:  # noqa: PLR0917
    return _cg.per_op(
        python, str(Path(__file__).resolve()), lambda k: ["--child", lib, mode, str(k), servers], n, seed
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", action="append", help="datastore_bench library (repeatable; default: all)")
    ap.add_argument("--calls", type=int, default=500, help="N, a multiple of 50 (the runs make N and 3N)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--outside", action="store_true", help="also count calls outside a trace")
    ap.add_argument("--python", default=os.path.realpath(sys.executable))
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--servers", metavar="PATH", help="JSON of running servers (default: start them)")
    ap.add_argument("--child", nargs=4, metavar=("LIB", "MODE", "N", "SERVERS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], int(args.child[2]), json.loads(args.child[3]))
        return 0
    sys.path.insert(0, str(ROOT))
    from benchmarks import datastore_bench as db

    libs = args.lib or list(db.WORKLOADS)
    n = max(db.BATCH, args.calls // db.BATCH * db.BATCH)
    modes = ["bare", "traced"] + (["off", "outside"] if args.outside else [])
    rows = []
    print(f"instructions per call (N={n}, seeds {args.seeds}; mean over seeds)")
    head = f"{'library':<15}{'bare':>10}{'traced':>10}{'+traced':>10}"
    print(head + (f"{'off':>10}{'outside':>10}{'+outside':>10}" if args.outside else ""), flush=True)
    with contextlib.ExitStack() as stack:
        if args.servers:
            servers = json.loads(Path(args.servers).read_text())
        else:
            servers = stack.enter_context(db.servers_running(libs))
        spec = json.dumps(servers)
        for lib in libs:
            got = {
                m: statistics.mean(per_call(args.python, lib, m, n, s, spec) for s in args.seeds)
                for m in modes
            }
            row: dict[str, Any] = {"library": lib, **got, "added_traced": got["traced"] - got["bare"]}
            line = f"{lib:<15}{got['bare']:>10,.0f}{got['traced']:>10,.0f}{row['added_traced']:>10,.0f}"
            if args.outside:
                row["added_outside"] = got["outside"] - got["off"]
                line += f"{got['off']:>10,.0f}{got['outside']:>10,.0f}{row['added_outside']:>10,.0f}"
            rows.append(row)
            print(line, flush=True)
    if args.json:
        result = {"calls": n, "seeds": args.seeds, "python": args.python, "rows": rows}
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
