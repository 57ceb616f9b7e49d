"""The idle reporter's main thread, tick by tick: Python calls (cProfile) and CPU per tick.

``reporter_idle_bench.py`` measures the whole reporter process under a real server; this
script looks inside one tick. It runs a :class:`reporter_proc.loop.Reporter` in process mode
on this process's main thread (the memory sender, default settings: 1 s ticks) over an arena
of ``--slots`` slots (64, the default arena) of which ``--workers`` are held by forked
writer processes that announced themselves (WORKER_START) and then write nothing: an idle
application. After ``--warmup`` seconds it measures the main thread's CPU time over
``--secs`` seconds (``time.thread_time``), then counts the Python calls of ``--secs`` more
seconds with cProfile (``--top`` functions by call count are listed).

Run it with the tree to measure first on ``PYTHONPATH`` (from the repository root, the
tests' helpers are imported from ``tests/``)::

    PYTHONPATH=/path/to/tree python benchmarks/reporter_tick_profile.py [--secs 30]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--secs", type=float, default=30.0)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args(argv)

    from ipc import Arena
    from reporter_proc.loop import Reporter
    from reporter_proc.senders.memory import MemorySender
    from reporter_proc.settings import ReporterSettings
    from tests.test_reporter_helpers import spawn_writer

    work = tempfile.mkdtemp(prefix="tick-profile-")
    arena = Arena.create(os.path.join(work, "a.arena"), slots=a.slots, ring_capacity=64 * 1024)
    writers = [spawn_writer(arena.path, [], hold=True, announce=True) for _ in range(a.workers)]
    for w in writers:
        w.wait_written()
    reporter = Reporter(
        arena, ReporterSettings(), sender=MemorySender(), mode="process", owner_pid=os.getpid()
    )
    out: dict[str, Any] = {"tree": os.path.dirname(sys.modules["reporter_proc"].__file__ or "")}
    prof = cProfile.Profile()

    async def drive() -> None:
        run = asyncio.ensure_future(reporter.run())
        while not reporter.ready:
            await asyncio.sleep(0.05)
        await asyncio.sleep(a.warmup)
        t0, c0 = time.monotonic(), time.thread_time()
        await asyncio.sleep(a.secs)
        elapsed = time.monotonic() - t0
        out["main_ms_per_s"] = (time.thread_time() - c0) * 1000 / elapsed
        passes0 = reporter.intake.passes if reporter.intake is not None else 0
        t0 = time.monotonic()
        prof.enable()
        await asyncio.sleep(a.secs)
        prof.disable()
        elapsed = time.monotonic() - t0
        passes = (reporter.intake.passes if reporter.intake is not None else 0) - passes0
        stats = pstats.Stats(prof)
        calls = sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]
        out.update(
            seconds=elapsed,
            intake_passes=passes,
            python_calls=calls,
            calls_per_s=calls / elapsed,
            calls_per_pass=calls / max(1, passes),
        )
        top = sorted(stats.stats.items(), key=lambda kv: -kv[1][1])[: a.top]  # type: ignore[attr-defined]
        out["top"] = [
            (f"{os.path.basename(f)}:{ln}({fn})", round(v[1] / elapsed, 1)) for (f, ln, fn), v in top
        ]
        reporter.request_stop("done", wait_for_workers=False)
        await run

    try:
        asyncio.run(drive())
    finally:
        for w in writers:
            w.release()
        arena.close()
    top = out.pop("top", [])
    print(json.dumps(out))
    for name, per_s in top:
        print(f"{per_s:8.1f}/s  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
