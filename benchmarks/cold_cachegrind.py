"""Cache misses the agent adds per call when the caches start cold, counted by Valgrind's
cachegrind with its cache simulation: the steady companion of ``cold_cache_bench.py``, whose
timings of the same calls move by microseconds from run to run.

A call that starts with cold caches pays for every distinct line of code and data it
touches: after a client's own work between two messages (aio-pika, asyncio and the
interpreter take the level-1 caches over), or after a worker's idle gap between two requests
at a low rate (everything else on the machine takes the level-2 cache too). Instruction
counts (``*_cachegrind.py``) miss that cost; here each call is preceded by a write over a
buffer of ``--thrash`` MiB, as in ``cold_cache_bench.py``, and cachegrind simulates this
machine's caches per core (level 1: 32 KiB of instructions, 48 KiB of data; its last level
stands for the 2 MiB level 2). The table gives, per call, the instructions and the misses
the agent's part adds (traced minus base):

* ``I1 miss``: lines of code not in the level-1 instruction cache (each costs a level-2
  access, ~14 cycles, or more after a larger thrash);
* ``D1 miss``: lines of data read or written that were not in the level-1 data cache;
* ``LL miss``: misses of the simulated last level (code and data): lines that had to come
  from beyond the level 2, which only a thrash larger than it leaves.

The cases are ``cold_cache_bench.py``'s (``wsgi-request``, ``sql-call``) and
``mq_bench.py``'s in-process ones (``consumer-aiormq``, ``producer-aiormq``,
``producer-aiokafka``, ...), each against the same call without the agent's part. Each
count runs the child twice (N and 3N calls after the same warm-up; the difference over 2N
cancels start-up), with address randomisation off and a fixed ``PYTHONHASHSEED``; an
unrelated code change still moves the interpreter's type-attribute cache collisions, so
compare versions over several seeds (``--seeds``). The thrash itself is the same in both
modes and cancels. Slow: ~100x the normal run time.

    python benchmarks/cold_cachegrind.py [--case NAME ...] [--thrash MIB ...] [--calls N]
                                         [--seeds S ...] [--jobs J] [--json PATH]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository
from benchmarks import _cachegrind as _cg

# This machine's caches per core (lscpu: 64 KiB L1i and 96 KiB L1d over 2 cores, 4 MiB of
# L2 over 2): cachegrind simulates a level 1 and a last level, which stands for the L2.
CACHES = ("--I1=32768,8,64", "--D1=49152,12,64", "--LL=2097152,16,64")
MQ_CASES = ("consumer-aiormq", "producer-aiormq", "producer-aiokafka", "consumer", "producer")
WEB_CASES = ("wsgi-request", "sql-call")
CASES = WEB_CASES + MQ_CASES
WARM_UP = 200
EVENTS = ("Ir", "I1mr", "ILmr", "D1mr", "DLmr", "D1mw", "DLmw")


def _pair(case: str) -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]:
    """(base, traced, untimed work after each call) of ``case``."""
    if case in WEB_CASES:
        from benchmarks import cold_cache_bench

        return cold_cache_bench.CASES[case]()
    from benchmarks import mq_bench

    base, traced = mq_bench.in_process_cases()[case]
    return base, traced, lambda: None


def _child(case: str, which: str, n: int, thrash_mib: float) -> None:
    """In the measured process: warm up both functions, then ``n`` calls of ``which``, each
    after writing over the thrash buffer. The ring is never drained while counting (draining
    is the reporter's work): it is large enough for every segment."""
    from benchmarks._ring import Ring
    from swmp import _sink, tracing
    from swmp.config import load

    tracing.configure(load({}, agent_log_reporter_active=False))
    ring = Ring(32 << 20)
    ring.warm()
    base, traced, between = _pair(case)
    fn = base if which == "base" else traced
    for _ in range(WARM_UP):
        base()
        traced()
        between()
    ring.drain()
    size = int(thrash_mib * (1 << 20))
    buf = ctypes.create_string_buffer(max(size, 64))
    for i in range(n):
        if size:
            ctypes.memset(buf, i & 0xFF, size)
        fn()
        between()
    _sink.set_sink(None)
    dropped = ring.writer.stats().dropped_records
    ring.close()
    if dropped:
        raise SystemExit(f"the ring dropped {dropped} records: counts would be wrong")


def per_call(
    python: str, case: str, which: str, *, mib: float, n: int, seed: int, pool: Any
) -> dict[str, float]:
    """Events per call of ``which``: (run of 3N - run of N) / 2N."""
    script = str(Path(__file__).resolve())
    jobs = [
        pool.submit(_cg.events, python, script, ["--child", case, which, str(k * n), str(mib)], seed, CACHES)
        for k in (1, 3)
    ]
    once, thrice = (j.result() for j in jobs)
    return {e: (thrice[e] - once[e]) / (2 * n) for e in EVENTS}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", choices=CASES, help="case (repeatable; default: all)")
    ap.add_argument("--thrash", type=float, nargs="+", default=[1.0, 4.0], help="MiB written before a call")
    ap.add_argument("--calls", type=int, default=100, help="N (the runs make N and 3N calls)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--jobs", type=int, default=2, help="child runs at a time")
    ap.add_argument("--python", default=os.path.realpath(sys.executable))
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--child", nargs=4, metavar=("CASE", "WHICH", "N", "MIB"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], int(args.child[2]), float(args.child[3]))
        return 0
    print(f"added per call, traced - base (N={args.calls}, seeds {args.seeds}; mean over seeds)")
    print(f"{'case':<20}{'thrash MiB':>11}{'instr':>9}{'I1 miss':>9}{'D1 miss':>9}{'LL miss':>9}")
    rows = []
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for case in args.case or CASES:
            for mib in args.thrash:
                added = dict.fromkeys(EVENTS, 0.0)
                for seed in args.seeds:
                    at = {"mib": mib, "n": args.calls, "seed": seed, "pool": pool}
                    base = per_call(args.python, case, "base", **at)
                    traced = per_call(args.python, case, "traced", **at)
                    for e in EVENTS:
                        added[e] += (traced[e] - base[e]) / len(args.seeds)
                row = {"case": case, "thrash_mib": mib, **{e: round(v, 1) for e, v in added.items()}}
                rows.append(row)
                d1 = added["D1mr"] + added["D1mw"]
                ll = added["ILmr"] + added["DLmr"] + added["DLmw"]
                print(
                    f"{case:<20}{mib:>11g}{added['Ir']:>9,.0f}{added['I1mr']:>9,.0f}{d1:>9,.0f}{ll:>9,.0f}",
                    flush=True,
                )
    if args.json:
        meta = {"calls": args.calls, "seeds": args.seeds, "caches": CACHES, "python": args.python}
        Path(args.json).write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
