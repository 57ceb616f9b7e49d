"""Instructions the Celery instrumentation adds per task, counted by Valgrind's cachegrind: the
steady companion of ``benchmarks/celery_bench.py``, whose timed figures move by tens of
microseconds from run to run on a shared machine (Celery's own publish is ~100x the cost).

For each ``celery_bench`` operation and mode (``plain`` / ``swmp``), the operation runs under
``valgrind --tool=cachegrind --cache-sim=no`` with N and 3N tasks after the same warm-up (see
``benchmarks/_cachegrind.py``); the table shows the per-task count of each and the difference.

    python benchmarks/celery_cachegrind.py [--op NAME ...] [--tasks N] [--seeds S ...] [--json PATH]

Run the real interpreter binary, not a pyenv shim (``--python``). Slow: ~50x the normal run
time per operation and mode.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository
from benchmarks import _cachegrind as _cg

DEFAULT_OPS = ("publish in a request", "publish alone", "execute")


def _child(op: str, mode: str, n: int) -> None:
    """In the measured process: ``celery_bench``'s operation ``op`` in ``mode``, ``n`` times."""
    from benchmarks.celery_bench import setup

    ops, drain, close, _ring = setup("memory://")
    plain, traced = ops[op]
    fn = traced if mode == "swmp" else plain
    for _ in range(300):
        fn()
    drain()
    gc.collect()
    gc.freeze()  # the start-up heap stays out of the collector's passes, in both modes
    for i in range(n):
        fn()
        if i % 200 == 199:  # the in-memory queue and the ring, emptied as the timed runs do
            drain()
    drain()
    close()


def per_task(python: str, op: str, mode: str, n: int, seed: int) -> float:
    return _cg.per_op(python, str(Path(__file__).resolve()), lambda k: ["--child", op, mode, str(k)], n, seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", action="append", help="celery_bench operation (repeatable)")
    ap.add_argument("--tasks", type=int, default=400, help="N (the runs do N and 3N)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--python", default=str(Path(sys.executable).resolve()))
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    print(f"instructions per task (N={args.tasks}, seeds {args.seeds}; mean over seeds)")
    _cg.compare_to_json(
        args.op or DEFAULT_OPS,
        ("plain", "swmp"),
        lambda op, mode, seed: per_task(args.python, op, mode, args.tasks, seed),
        args.seeds,
        json_path=args.json,
        meta={"tasks": args.tasks, "seeds": args.seeds, "python": args.python},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
