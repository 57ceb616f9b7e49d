"""The reporter process's own cost below saturation: CPU and wake-ups per second.

At ordinary request rates the reporter's cost is not its records but its wake-ups and its
calls to the backend (docs/performance.md). This benchmark runs examples/app.py under
Gunicorn (2 sync workers, ``swmp run``, defaults, traces only) against the gRPC test
collector, and measures the reporter process alone, from ``/proc``: CPU time of all its
threads (``schedstat``, nanoseconds; the main thread and gRPC's threads apart) and the
main thread's voluntary context switches (its wake-ups), over ``--secs`` seconds with no
request at all and at each fixed rate of ``--rates`` on the 2 ms ``/io`` route.

``--tree NAME=PATH`` (repeatable) measures other checkouts of swmp side by side with this
one (e.g. the code before a change, in a ``git worktree``, with the native modules copied
in): each is measured from its own directory, with its own test helpers
(``benchmarks/prefork_bench.py``, ``tests/servers.py``), so its code is what the server and
the reporter run; rounds alternate the trees so that drift of the machine hits them alike.

    python benchmarks/reporter_idle_bench.py [--rates 0,74,300] [--secs 15] [--rounds 2]
        [--tree before=/path/to/old/checkout] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _thread_cpu(pid: int) -> dict[str, float]:
    """Seconds on CPU per thread kind of ``pid``: ``main``, ``grpc`` (gRPC's own threads), ``other``."""
    out = {"main": 0.0, "grpc": 0.0, "other": 0.0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            ns = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:  # the thread ended in between
            continue
        grpc = comm.startswith(("event_engine", "grpc", "lifeguard"))
        kind = "main" if tid == str(pid) else "grpc" if grpc else "other"
        out[kind] += ns / 1e9
    return out


def _wakeups(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches"):
            return int(line.split()[1])
    return 0


def measure_here(rates: list[float], secs: float) -> list[dict[str, Any]]:
    """Run one application with the swmp of the current directory and measure its reporter.

    The tree's own test helpers start the server: they run it from their checkout, whose
    ``swmp`` then comes first on the server's ``sys.path``.
    """
    tree = os.getcwd()
    sys.path[:0] = [tree, os.path.join(tree, "benchmarks")]
    import prefork_bench as pb
    from paced_load import run_paced

    args = argparse.Namespace(workers=2, cpu_iterations=300)
    work = Path(tempfile.mkdtemp(prefix="reporter-idle-"))
    rows = []
    with pb.application("swmp", "/io", work, args) as app:
        reporter = next(p for p in pb.app_processes(app.srv) if pb.is_reporter(p))
        time.sleep(1.0)  # let the start-up announcements finish: they are not the steady state
        for rate in rates:
            cpu0, wake0, t0 = _thread_cpu(reporter.pid), _wakeups(reporter.pid), time.monotonic()
            served = 0
            if rate:
                served = asyncio.run(run_paced(f"{app.srv.url}/io", rate, secs)).requests
            else:
                time.sleep(secs)
            elapsed = time.monotonic() - t0
            cpu1, wake1 = _thread_cpu(reporter.pid), _wakeups(reporter.pid)
            ms = {k: (cpu1[k] - cpu0[k]) * 1000 / elapsed for k in cpu0}
            total = sum(ms.values())
            rows.append(
                {
                    "rate": rate,
                    "served_per_s": served / elapsed,
                    "reporter_ms_per_s": total,
                    "main_ms_per_s": ms["main"],
                    "grpc_ms_per_s": ms["grpc"],
                    "wakeups_per_s": (wake1 - wake0) / elapsed,
                    "us_per_request": total * 1000 / (served / elapsed) if served else None,
                }
            )
        pb.finish(app)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="0,74,300", help="requests/s on /io; 0 = idle")
    ap.add_argument("--secs", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tree", action="append", default=[], help="NAME=PATH of another swmp checkout")
    ap.add_argument("--json", default="")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    rates = [float(r) for r in a.rates.split(",")]
    if a.child:
        print(json.dumps(measure_here(rates, a.secs)))
        return 0
    trees = [("this", str(ROOT))] + [tuple(t.split("=", 1)) for t in a.tree]  # type: ignore[misc]
    results: dict[str, list[list[dict[str, Any]]]] = {name: [] for name, _ in trees}
    for rnd in range(a.rounds):
        order = trees if rnd % 2 == 0 else trees[::-1]
        for name, path in order:
            env = dict(os.environ, PYTHONPATH=path)  # the driver's own imports
            cmd = [
                sys.executable,
                str(ROOT / "benchmarks" / "reporter_idle_bench.py"),
                "--child",
                "--rates",
                a.rates,
                "--secs",
                str(a.secs),
            ]
            out = subprocess.run(cmd, env=env, cwd=path, capture_output=True, text=True, check=True)
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {rnd + 1}: {name} done", file=sys.stderr)
    table = []
    for name, runs in results.items():
        for i, rate in enumerate(rates):
            rows = [run[i] for run in runs]
            med = {
                k: statistics.median(r[k] for r in rows)
                for k in (
                    "served_per_s",
                    "reporter_ms_per_s",
                    "main_ms_per_s",
                    "grpc_ms_per_s",
                    "wakeups_per_s",
                )
            }
            per_req = [r["us_per_request"] for r in rows if r["us_per_request"] is not None]
            table.append(
                {
                    "tree": name,
                    "rate": rate,
                    **med,
                    "us_per_request": statistics.median(per_req) if per_req else None,
                }
            )
    print(
        f"{'tree':<10} {'rate/s':>7} {'served/s':>9} {'reporter ms/s':>14} {'main':>6} {'gRPC thr':>9} "
        f"{'wake-ups/s':>11} {'us/request':>11}"
    )
    for r in table:
        per = f"{r['us_per_request']:.1f}" if r["us_per_request"] is not None else "-"
        print(
            f"{r['tree']:<10} {r['rate']:>7.0f} {r['served_per_s']:>9.1f} {r['reporter_ms_per_s']:>14.2f} "
            f"{r['main_ms_per_s']:>6.2f} {r['grpc_ms_per_s']:>9.2f} {r['wakeups_per_s']:>11.1f} {per:>11}"
        )
    if a.json:
        Path(a.json).write_text(
            json.dumps({"secs": a.secs, "rounds": a.rounds, "rows": table, "trees": dict(trees)}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
