"""What profiling costs a traced endpoint: no task, a task on another endpoint, a task sampling it.

One process, one request thread, the real tracing core and a real arena board. Each
"request" is an entry span around pure-Python CPU work (``--work-ms``, 20 ms by default so a
10 ms dump period takes about two snapshots per request). Modes, measured side by side in
interleaved rounds so machine load hits them alike:

  no-board        the agent without profiling (no board attached: the pre-profiling path)
  no-task         profiling on, the board empty (one generation word compared per segment)
  task-elsewhere  a task on another endpoint (the endpoint lookup added per segment)
  sampling        a task on this endpoint, 10 ms dump period, every request sampled (the
                  sampler thread walks the request thread's stack every 10 ms)

Records go to a counting sink (the ring's own cost is in ipc_bench). Two throughputs:
``cpu req/s`` is requests per second of *process* CPU time (the sampler thread's CPU
included), which is what a saturated worker serves and which other processes on a busy
machine barely disturb; ``wall req/s`` is requests per wall-clock second of the request
thread (median of rounds), which a loaded machine makes noisy. p99 is the wall latency
over all requests of a mode.
Losses are the median over rounds of each mode's throughput divided by the same round's
no-board throughput (the modes of a round run back to back, in alternating order).
A second table gives the cost of an empty span per mode (the gate's share of a segment),
and the cost of one snapshot of a thread 30 frames deep (best of 3).

    python benchmarks/profile_bench.py [--rounds 30] [--seconds 0.5] [--work-ms 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ipc import Arena
from reporter_proc import records as R
from reporter_proc import taskboard
from reporter_proc.taskboard import BoardTask
from swmp import _sink, tracing
from swmp.config import load
from swmp.profiling import stacks, stats
from swmp.profiling.gate import gate
from swmp.profiling.sampler import Profiled
from swmp.tracing.context import new_entry_span

MODES = ("no-board", "no-task", "task-elsewhere", "sampling")


class CountingSink:
    def __init__(self) -> None:
        self.counts: dict[int, int] = {}

    def write(self, rtype: int, payload: bytes) -> bool:
        self.counts[rtype] = self.counts.get(rtype, 0) + 1
        return True


def cpu_work(units: int) -> int:
    """A fixed amount of pure-Python work (not a deadline: stolen CPU time must show)."""
    n = 0
    for _ in range(units):
        n += sum(i * i for i in range(200))
    return n


def calibrate(work_ms: float) -> int:
    """Work units that take about ``work_ms`` on this machine (best of 5)."""
    best = min(_timed(200) for _ in range(5))
    return max(1, round(200 * work_ms / 1000 / best))


def _timed(units: int) -> float:
    t0 = time.perf_counter()
    cpu_work(units)
    return time.perf_counter() - t0


def endpoint_handler(units: int) -> None:
    with new_entry_span("/work"):
        cpu_work(units)


def set_mode(arena: Arena, mode: str) -> None:
    now = time.time_ns() // 1_000_000
    task = BoardTask("bench", "/work", now - 1000, now + 3_600_000, 0, 10, 1 << 40)
    if mode == "no-board":
        gate.attach(None)
        return
    gate.attach(arena.board)
    elsewhere = BoardTask("bench", "/elsewhere", task.start_ms, task.end_ms, 0, 10, 1 << 40)
    tasks = {"no-task": [], "task-elsewhere": [elsewhere], "sampling": [task]}[mode]
    arena.board.publish(taskboard.encode(tasks))


def run_mode(seconds: float, units: int) -> tuple[float, float, list[float]]:
    latencies: list[float] = []
    cpu0 = time.process_time()
    start = time.perf_counter()
    end = start + seconds
    while True:
        t0 = time.perf_counter()
        if t0 >= end:
            break
        endpoint_handler(units)
        latencies.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    time.sleep(0.05)  # the sampler's last wake-up is counted in this mode's CPU
    cpu = time.process_time() - cpu0
    return len(latencies) / wall, len(latencies) / cpu, latencies


def gate_cost_ns(arena: Arena, mode: str, n: int = 200_000) -> float:
    set_mode(arena, mode)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        with new_entry_span("/empty"):
            pass
    return (time.perf_counter_ns() - t0) / n


def snapshot_cost_us(depth: int = 30, n: int = 3000) -> float:
    """One snapshot of a thread parked ``depth`` frames deep: stack walk, record, sink write."""
    parked = threading.Event()
    release = threading.Event()

    def nest(k: int) -> None:
        if k:
            nest(k - 1)
        else:
            parked.set()
            release.wait()

    t = threading.Thread(target=nest, args=(depth,))
    t.start()
    parked.wait()
    assert t.ident is not None
    task = BoardTask("bench", "/work", 0, 1 << 62, 0, 10, 1 << 40)
    item = Profiled(
        task,
        "seg",
        partial(stacks.thread_stack, t.ident),
        started_mono=time.monotonic(),
        depth=500,
        max_profile_s=3600,
    )
    t0 = time.perf_counter()
    for _ in range(n):
        item.sample(time.monotonic())
    cost = (time.perf_counter() - t0) / n * 1e6
    release.set()
    t.join()
    return cost


def p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * 0.99))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seconds", type=float, default=0.5, help="per mode per round")
    ap.add_argument("--work-ms", type=float, default=20.0)
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    sink = CountingSink()
    _sink.set_sink(sink)
    tracing.configure(load({}))
    gate.configure(max_parallel=5, depth=500, duration_min=10)
    units = calibrate(args.work_ms)
    with tempfile.TemporaryDirectory() as d:
        arena = Arena.create(os.path.join(d, "bench.arena"), slots=1, ring_capacity=1 << 16)
        try:
            tput: dict[str, list[float]] = {m: [] for m in MODES}
            cpu_tput: dict[str, list[float]] = {m: [] for m in MODES}
            lat: dict[str, list[float]] = {m: [] for m in MODES}
            snaps: dict[str, int] = dict.fromkeys(MODES, 0)
            for r in range(args.rounds):
                order = MODES if r % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    set_mode(arena, mode)
                    before = stats.snapshots
                    rps, cpu_rps, ls = run_mode(args.seconds, units)
                    cpu_tput[mode].append(cpu_rps)
                    snaps[mode] += stats.snapshots - before
                    tput[mode].append(rps)
                    lat[mode] += ls
            gate_ns = {m: min(gate_cost_ns(arena, m) for _ in range(3)) for m in MODES[:3]}
            snap_us = min(snapshot_cost_us() for _ in range(3))
        finally:
            gate.attach(None)
            arena.close()
            arena.unlink()
    _sink.set_sink(None)

    rows: list[dict[str, Any]] = []
    print(
        f"{'mode':<16}{'cpu req/s':>10}{'loss':>9}{'wall req/s':>12}{'loss':>9}{'p99 ms':>9}{'snaps/req':>11}"
    )
    for m in MODES:
        med = statistics.median(tput[m])
        cpu_med = statistics.median(cpu_tput[m])
        # Loss from per-round ratios against the same round's no-board figure: the machine's
        # load drifts over a run, and a round's modes run back to back.
        cpu_ratio = statistics.median(a / b for a, b in zip(cpu_tput[m], cpu_tput["no-board"], strict=True))
        wall_ratio = statistics.median(a / b for a, b in zip(tput[m], tput["no-board"], strict=True))
        row = {
            "mode": m,
            "cpu_rps_median": cpu_med,
            "cpu_rps_rounds": cpu_tput[m],
            "cpu_loss_pct": (1 - cpu_ratio) * 100,
            "rps_median": med,
            "rps_rounds": tput[m],
            "loss_pct": (1 - wall_ratio) * 100,
            "p99_ms": p99(lat[m]) * 1000,
            "requests": len(lat[m]),
            "snapshots_per_request": snaps[m] / max(1, len(lat[m])),
        }
        rows.append(row)
        print(
            f"{m:<16}{cpu_med:>10.1f}{row['cpu_loss_pct']:>8.2f}%{med:>12.1f}{row['loss_pct']:>8.2f}%"
            f"{row['p99_ms']:>9.2f}{row['snapshots_per_request']:>11.2f}"
        )
    print()
    print(f"{'per-segment cost of an empty span (ns)':<44}")
    for m, ns in gate_ns.items():
        print(f"  {m:<16}{ns:>10.0f}")
    print(f"one snapshot (a thread 30 frames deep, walk + record + sink): {snap_us:.1f} us")
    print(f"\nload average: {os.getloadavg()}, cpus: {os.cpu_count()}, python {platform.python_version()}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "rows": rows,
                    "empty_span_ns": gate_ns,
                    "snapshot_us": snap_us,
                    "loadavg": os.getloadavg(),
                    "python": platform.python_version(),
                    "snapshot_records": sink.counts.get(R.PROFILE_SNAPSHOT, 0),
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
