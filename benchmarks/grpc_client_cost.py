"""Instructions the gRPC client exit span adds per call, counted by Valgrind's cachegrind,
against a real loopback grpc server that runs in another process (plain grpc, no agent, not
under Valgrind): only the calling process is counted, so the figure is the client's cost.

Cases: ``sync`` (a unary-unary call, ``multicallable(request)``), ``sync-future`` (the same
through ``.future(...).result()``), ``stream`` (a unary-stream call whose 3 responses are
read to the end), ``aio`` (a unary-unary ``grpc.aio`` call awaited), ``aio-stream`` (a
``grpc.aio`` unary-stream call read to the end), and ``wsgi``: the reference, the WSGI
middleware around a trivial app (``framework_bench``'s ``wsgi-middleware`` case). Each
case and mode (``bare``: the agent not installed, ``traced``: installed) runs under
``valgrind --tool=cachegrind --cache-sim=no`` with N and 3N calls after the same warm-up,
ASLR off (``setarch -R``), a fixed ``PYTHONHASHSEED``; ``(I(3N) - I(N)) / 2N`` is the
per-call count with start-up cancelled, and ``traced - bare`` what the client span adds.
The calls are made outside any entry span: each one starts its own segment, as the WSGI
middleware's request does. With ``--in-request`` each traced call is made inside an entry
span of its own instead (what a call from a request handler costs: the figure then includes
that entry span; compare it between two trees, not with the WSGI row). Segments go into a
real shared-memory ring.

    python3 benchmarks/grpc_client_cost.py [--case NAME ...] [--calls N] [--seeds S ...] \\
        [--in-request] [--python /root/.pyenv/versions/3.11.7/bin/python3.11] [--json PATH]

``--profile CASE`` prints a cProfile of the traced calls instead (which functions run).
Run the real interpreter binary, not a pyenv shim (``--python``; default: this one's
``sys.executable`` resolved). Slow: ~50x the normal run time per case and mode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository
from benchmarks import _cachegrind as _cg

ROOT = Path(__file__).resolve().parent.parent
SERVICE = "bench.Users"
GET = f"/{SERVICE}/Get"
LIST = f"/{SERVICE}/List"
STREAMED = 3  # responses per streaming call
WARMUP = 300
CASES = ("sync", "sync-future", "stream", "aio", "aio-stream", "wsgi")
Serve = Callable[[int], None]


# -- the server (another process, no agent) ----------------------------------------------------
def _serve_forever() -> None:
    """Serve on a free loopback port, print it, stop when stdin closes."""
    from concurrent import futures

    import grpc

    def get(req: bytes, ctx: Any) -> bytes:
        return req

    def listing(req: bytes, ctx: Any) -> Iterator[bytes]:
        for _ in range(STREAMED):
            yield req

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Get": grpc.unary_unary_rpc_method_handler(get),
            "List": grpc.unary_stream_rpc_method_handler(listing),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(None)


class Server:
    """The server process for the duration of a ``with`` block."""

    def __enter__(self) -> str:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.strip():
            self.proc.kill()
            raise RuntimeError("the gRPC server did not start")
        return f"127.0.0.1:{int(line)}"

    def __exit__(self, *exc: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the measured process ----------------------------------------------------------------------
def _no_request() -> Any:
    return contextlib.nullcontext()


def build(case: str, target: str, request: Callable[[], Any] = _no_request) -> Serve:
    """``serve(n)``: ``n`` calls of ``case``, each inside ``request()`` (a context manager);
    channels made after the agent's install."""
    import grpc

    if case == "wsgi":
        sys.path.insert(0, str(ROOT))
        from benchmarks.framework_bench import build_wsgi_middleware

        return build_wsgi_middleware()
    if case in ("sync", "sync-future", "stream"):
        ch = grpc.insecure_channel(target)
        if case == "stream":
            listing = ch.unary_stream(LIST)

            def serve_stream(n: int, _ch: Any = ch) -> None:
                for _ in range(n):
                    with request():
                        for _item in listing(b"42"):
                            pass

            return serve_stream
        get = ch.unary_unary(GET)
        if case == "sync-future":

            def serve_future(n: int, _ch: Any = ch) -> None:
                for _ in range(n):
                    with request():
                        get.future(b"42").result()

            return serve_future

        def serve(n: int, _ch: Any = ch) -> None:
            for _ in range(n):
                with request():
                    get(b"42")

        return serve

    loop = asyncio.new_event_loop()

    async def make() -> Any:
        return grpc.aio.insecure_channel(target)

    ach = loop.run_until_complete(make())
    if case == "aio":
        aget = ach.unary_unary(GET)

        async def many(n: int) -> None:
            for _ in range(n):
                with request():
                    await aget(b"42")

    else:
        alist = ach.unary_stream(LIST)

        async def many(n: int) -> None:
            for _ in range(n):
                with request():
                    async for _item in alist(b"42"):
                        pass

    def serve_aio(n: int, _ch: Any = ach) -> None:
        loop.run_until_complete(many(n))

    return serve_aio


def _child(case: str, mode: str, n: int, target: str, profile: bool = False) -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.framework_bench import Agent

    agent = Agent()
    request = _no_request
    if mode == "traced":
        agent.install()
        if os.environ.get("SWMP_BENCH_IN_REQUEST") == "1":
            from swmp.tracing.context import new_entry_span

            def request() -> Any:
                return new_entry_span("/request")

    serve = build(case, target, request)
    serve(WARMUP)
    agent.drain()
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(serve, n)
        pstats.Stats(prof).sort_stats("tottime").print_stats(int(os.environ.get("TOP", "30")))
        return
    serve(n)
    got = agent.drain()
    if mode == "traced" and got < n:
        raise SystemExit(f"{case}: {got} segments for {n} calls: the span was not recorded")


def per_call(python: str, case: str, mode: str, n: int, seed: int, target: str) -> float:  # noqa: PLR0917
    return _cg.per_op(
        python, str(Path(__file__).resolve()), lambda k: ["--child", case, mode, str(k), target], n, seed
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", choices=CASES, help="repeatable; default: all")
    ap.add_argument("--calls", type=int, default=1000, help="N (the runs make N and 3N calls)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--python", default=os.path.realpath(sys.executable))
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    ap.add_argument("--profile", choices=CASES, help="cProfile the traced calls of one case")
    ap.add_argument("--in-request", action="store_true", help="each traced call inside an entry span")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", nargs=4, metavar=("CASE", "MODE", "N", "TARGET"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.in_request:  # the measured children inherit it
        os.environ["SWMP_BENCH_IN_REQUEST"] = "1"
    if args.serve:
        _serve_forever()
        return 0
    if args.child:
        case, mode, n, target = args.child
        _child(case, mode, int(n), target)
        return 0
    if args.profile:
        with Server() as target:
            _child(args.profile, "traced", args.calls, target, profile=True)
        return 0
    cases = args.case or list(CASES)
    if "wsgi" in cases:  # the reference first, for the ratio column
        cases = ["wsgi", *(c for c in cases if c != "wsgi")]
    rows: list[dict[str, Any]] = []
    print(f"instructions per call (N={args.calls}, seeds {args.seeds}; mean over seeds)")
    print(f"{'case':<14}{'bare':>12}{'traced':>12}{'added':>10}{'vs WSGI mw':>12}")
    ref = None
    with Server() as target:
        for case in cases:
            got = {
                m: statistics.mean(per_call(args.python, case, m, args.calls, s, target) for s in args.seeds)
                for m in ("bare", "traced")
            }
            added = got["traced"] - got["bare"]
            if case == "wsgi" and not args.in_request:  # with an entry span of its own: no ratio
                ref = added
            ratio = f"{added / ref:.2f}x" if ref else "-"
            line = f"{case:<14}{got['bare']:>12,.0f}{got['traced']:>12,.0f}{added:>10,.0f}{ratio:>12}"
            print(line, flush=True)
            rows.append({"case": case, **got, "added": added, "vs_wsgi": added / ref if ref else None})
    if args.json:
        meta = {"calls": args.calls, "seeds": args.seeds, "python": args.python}
        meta["in_request"] = args.in_request
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
