"""Instructions the entry span adds per request, counted by Valgrind's cachegrind: the
steady companion of ``benchmarks/framework_bench.py``, whose CPU-time figures move by
several microseconds from run to run on a shared machine.

For each case (a :data:`framework_bench.CASES` name) and mode (``bare``: the agent
uninstalled, ``traced``: installed), the case's ``serve`` runs under
``valgrind --tool=cachegrind --cache-sim=no`` twice, with N and 3N requests after the same
warm-up; ``(I(3N) - I(N)) / 2N`` is the per-request count with start-up cancelled. The
instrumentation's cost is ``traced - bare``. Each measurement runs with ASLR off (``setarch
-R``) and a fixed ``PYTHONHASHSEED``: then a rerun of the same code gives the same count
within ~10 instructions. A code change still moves the interpreter's type-attribute cache
collisions by up to ~1,500 instructions per request, so compare versions over several
seeds (``--seeds 0 1 2``; the table shows their mean).

With ``--sw8`` every request of the in-process WSGI and ASGI cases carries an incoming
``sw8`` header of a sampled trace from a known caller (a service called by another traced
one, the common case in production); the server cases (aiohttp, Tornado, ...) ignore it.

    python benchmarks/framework_cachegrind.py [--case NAME ...] [--requests N] [--seeds S ...] [--sw8]

Run the real interpreter binary, not a pyenv shim (``--python``; default: this one's
``sys.executable`` resolved). Slow: ~50x the normal run time per case and mode.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository
from benchmarks import _cachegrind as _cg

ROOT = Path(__file__).resolve().parent.parent


def incoming_sw8() -> str:
    """The ``sw8`` value of ``--sw8``: sampled, the caller's trace, segment and span 3."""
    from swmp.propagation import b64

    fields = (
        "caller-trace.1.1",
        "caller-segment.1.1",
        "caller-svc",
        "caller-inst",
        "/checkout",
        "caller:8080",
    )
    tid, sid, svc, inst, endpoint, address = (b64(f) for f in fields)
    return "-".join(("1", tid, sid, "3", svc, inst, endpoint, address))


def _child(case: str, mode: str, n: int, sw8: bool) -> None:
    """In the measured process: build ``case`` in ``mode``, warm up, serve ``n``."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import framework_bench as fb

    if sw8:
        fb.INCOMING_SW8 = incoming_sw8()
    agent = fb.Agent()
    if mode == "traced":
        agent.install()
    serve = next(c for c in fb.CASES if c.name == case).build()
    serve(300)
    agent.drain()
    serve(n)
    agent.drain()
    agent.uninstall()
    agent.close()


def per_request(python: str, case: str, mode: str, n: int, seed: int, *, sw8: bool = False) -> float:
    extra = ["--sw8"] if sw8 else []
    return _cg.per_op(
        python, str(Path(__file__).resolve()), lambda k: ["--child", case, mode, str(k), *extra], n, seed
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", help="framework_bench case (repeatable)")
    ap.add_argument("--requests", type=int, default=1000, help="N (the runs serve N and 3N)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--python", default=os.path.realpath(sys.executable))
    ap.add_argument("--sw8", action="store_true", help="each WSGI/ASGI request carries an incoming sw8")
    ap.add_argument("--child", nargs=3, metavar=("CASE", "MODE", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], int(args.child[2]), args.sw8)
        return 0
    cases = args.case or ["wsgi-middleware", "aiohttp", "tornado"]
    sw8 = ", incoming sw8" if args.sw8 else ""
    print(f"instructions per request (N={args.requests}, seeds {args.seeds}{sw8}; mean over seeds)")
    print(f"{'case':<18}{'bare':>12}{'traced':>12}{'added':>10}{'vs WSGI mw':>12}")
    ref = None
    for case in cases:
        got = {
            m: statistics.mean(
                per_request(args.python, case, m, args.requests, s, sw8=args.sw8) for s in args.seeds
            )
            for m in ("bare", "traced")
        }
        added = got["traced"] - got["bare"]
        if case == "wsgi-middleware":
            ref = added
        ratio = f"{added / ref:.2f}x" if ref else "-"
        print(f"{case:<18}{got['bare']:>12,.0f}{got['traced']:>12,.0f}{added:>10,.0f}{ratio:>12}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
