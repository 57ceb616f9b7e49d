"""Garbage-collector work per request with and without the agent.

A traced request must leave nothing for Python's cyclic garbage collector: what the agent
allocates per request (segment, spans, tag lists) should be freed by reference counting
when the request ends. Objects left in reference cycles instead pile up in generation 0
and bring collections, and every tenth of those a generation-1 pass, and in time a full
collection of the application's whole heap (tens of milliseconds in a large process),
paid by whichever request happens to allocate at that moment.

For each framework case of ``benchmarks/framework_bench.py`` (the framework's own WSGI or
ASGI callable in process, segments into a real ring), each mode runs in a fresh child
process: ``bare`` (the instrumentation not installed) and ``traced`` (installed), 300
requests of warm-up, then ``--requests`` requests with a ``gc.callbacks`` hook counting
the collections of each generation, the objects they freed and the time they took.

    python benchmarks/gc_bench.py [--case NAME ...] [--requests N] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CASES = ("wsgi-middleware", "flask", "django-wsgi", "starlette", "fastapi")

_CHILD = r"""
import gc, json, sys, time
sys.path.insert(0, sys.argv[1])
from benchmarks import framework_bench as fb
case, mode, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
agent = fb.Agent()
if mode == "traced":
    agent.install()
serve = next(c for c in fb.CASES if c.name == case).build()
serve(300)
agent.drain()
gc.collect()
stats = {"runs": [0, 0, 0], "collected": [0, 0, 0], "ms": [0.0, 0.0, 0.0]}
started = [0]
def hook(phase, info):
    if phase == "start":
        started[0] = time.perf_counter_ns()
        return
    g = info["generation"]
    stats["runs"][g] += 1
    stats["collected"][g] += info["collected"]
    stats["ms"][g] += (time.perf_counter_ns() - started[0]) / 1e6
gc.callbacks.append(hook)
done = 0
while done < n:
    k = min(1000, n - done)
    serve(k)
    agent.drain()
    done += k
gc.callbacks.remove(hook)
print(json.dumps(stats))
"""


def run(case: str, mode: str, n: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(ROOT), case, mode, str(n)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", choices=CASES, help="repeatable; default: all")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--quick", action="store_true", help="smoke run: the WSGI middleware, 300 requests")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    if args.quick:
        args.case, args.requests = ["wsgi-middleware"], 300
    rows = []
    for case in args.case or CASES:
        for mode in ("bare", "traced"):
            r = run(case, mode, args.requests)
            rows.append({"case": case, "mode": mode, "requests": args.requests, **r})
    print(f"{'case':<16} {'mode':<7} {'gen0':>5} {'gen1':>5} {'gen2':>5} {'freed/req':>9} {'GC us/req':>9}")
    for r in rows:
        per_req_us = sum(r["ms"]) * 1000 / r["requests"]
        freed = sum(r["collected"]) / r["requests"]
        runs = r["runs"]
        gens = f"{runs[0]:>5} {runs[1]:>5} {runs[2]:>5}"
        print(f"{r['case']:<16} {r['mode']:<7} {gens} {freed:>9.2f} {per_req_us:>9.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"requests": args.requests, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
