"""What one wake-up costs a thread on this machine, before the reporter does anything.

The reporter wakes once a second when idle and a few times a second at ordinary rates; its
main thread measured ~0.45 ms of CPU a second idle. This measures the floor under that:
a thread that only sleeps and wakes, as a plain ``time.sleep`` loop and as an asyncio
loop (``asyncio.sleep``, the reporter's event loop class), at one wake-up a second and at
20 a second (the most issue 9 allows below saturation). CPU is the kernel's run time of
the thread (``/proc/self/task/<tid>/schedstat``: user, system and the scheduler's own
accounting of the wake-up), per wake-up and per second.

    python benchmarks/wake_cost.py [--seconds 15] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _run_ns() -> tuple[int, int]:
    """The calling thread's run time (ns) and number of times it was scheduled in."""
    fields = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").read_text().split()
    return int(fields[0]), int(fields[2])


def plain(period: float, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(period)


def with_asyncio(period: float, seconds: float) -> None:
    async def loop() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await asyncio.sleep(period)

    ev = asyncio.SelectorEventLoop()  # what reporter_proc.plumbing runs the reporter on
    try:
        ev.run_until_complete(loop())
    finally:
        ev.close()


def measure(name: str, fn: Callable[[float, float], None], period: float, seconds: float) -> dict[str, Any]:
    run0, n0 = _run_ns()
    t0 = time.monotonic()
    fn(period, seconds)
    elapsed = time.monotonic() - t0
    run1, n1 = _run_ns()
    wakes = max(1, n1 - n0)
    return {
        "loop": name,
        "wakes_per_s": (n1 - n0) / elapsed,
        "us_per_wake": (run1 - run0) / 1e3 / wakes,
        "ms_per_s": (run1 - run0) / 1e6 / elapsed,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15.0, help="seconds of each measurement")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    rows = [
        measure(name, fn, period, args.seconds)
        for period in (1.0, 0.05)
        for name, fn in (("time.sleep", plain), ("asyncio", with_asyncio))
    ]
    print(f"{'loop':<12} {'wakes/s':>8} {'us/wake':>8} {'ms/s':>7}")
    for r in rows:
        print(f"{r['loop']:<12} {r['wakes_per_s']:>8.1f} {r['us_per_wake']:>8.0f} {r['ms_per_s']:>7.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "seconds": args.seconds}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
