"""Where a saturated server's extra tail latency comes from: the agent's parts paused in turn.

``prefork_bench.py`` measures swmp's p99 at saturation against no agent. This probe takes
the difference apart, with the same application (Gunicorn, 2 sync workers,
examples/app.py, ``/cpu``, wrk at saturation), samples of every variant taken in turns
(the order rotates every round):

  none             no agent
  swmp             swmp run, delivering to the benchmarks' test collector (tests/collector.py,
                   counting only)
  sink             swmp run, delivering to a gRPC server that reads every call and parses
                   nothing (what is left of a backend on this machine)
  backend-paused   the ``swmp`` server with its collector stopped (SIGSTOP) for the sample:
                   the reporter goes on reading the rings, its sends wait
  reporter-paused  the ``swmp`` server with its reporter process stopped for the sample: the
                   workers trace and write their rings, nothing reads them

The swmp servers run with 64 MiB rings (``--ring``) so that a sample with the reporter
stopped fits in them; after a paused sample, the next one waits until every other
process is quiet again (``prefork_bench.settle``). Per variant: requests/s, p50 and p99
(medians over rounds) and their ratio to no agent.

    python benchmarks/tail_probe.py [--rounds 6] [--duration 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import psutil  # noqa: E402

from benchmarks import prefork_bench as pb  # noqa: E402
from tests.servers import wait_until  # noqa: E402

VARIANTS = ("none", "swmp", "sink", "backend-paused", "reporter-paused")
ROUTE = "/cpu"


# -- a backend that parses nothing ------------------------------------------------------------------
class _Sink(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Every method answered with an empty message (valid for every SkyWalking answer)."""

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method: str = handler_call_details.method
        if method.endswith(("/collect", "/collectBatch", "/collectSnapshot")):  # client streams
            return grpc.stream_unary_rpc_method_handler(lambda requests, _ctx: _drain(requests))
        return grpc.unary_unary_rpc_method_handler(lambda _request, _ctx: b"")


def _drain(requests: Iterator[bytes]) -> bytes:
    for _ in requests:
        pass
    return b""


def serve_sink(ready_file: Path) -> int:
    server = grpc.server(
        futures.ThreadPoolExecutor(4),
        handlers=[_Sink()],
        options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)],
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    tmp = ready_file.with_suffix(".tmp")
    tmp.write_text(str(port))
    tmp.replace(ready_file)
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    server.wait_for_termination()
    return 0


@contextlib.contextmanager
def sink_process(work: Path) -> Iterator[tuple[str, int]]:
    """A sink server in a process of its own at nice 19 (like the test collector): its
    address and pid; stopped by pid on the way out."""
    ready = work / "sink.port"
    proc = subprocess.Popen([sys.executable, __file__, "--serve-sink", str(ready)], cwd=ROOT)
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, 30, "the sink to listen")
        if proc.poll() is not None:
            raise RuntimeError(f"the sink exited with {proc.returncode}")
        psutil.Process(proc.pid).nice(19)
        yield f"127.0.0.1:{ready.read_text()}", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- samples --------------------------------------------------------------------------------------
def paused_for(variant: str, app: pb.App) -> list[psutil.Process]:
    """The processes a variant stops for its sample."""
    if variant == "reporter-paused":
        return [p for p in pb.app_processes(app.srv) if pb.is_reporter(p)]
    if variant == "backend-paused":
        assert app.col.proc is not None
        return [psutil.Process(app.col.proc.pid)]
    return []


def sample(variant: str, app: pb.App, running: list[pb.App], args: argparse.Namespace) -> dict[str, Any]:
    # Every application and collector quiet first, this one's too: after a paused sample its
    # reporter (or collector) catches up on what it held back.
    pb.settle(pb.others(running, None))
    stopped = paused_for(variant, app)
    if variant.endswith("-paused") and not stopped:
        raise RuntimeError(f"{variant}: nothing to pause")
    for proc in stopped:
        proc.send_signal(signal.SIGSTOP)
    try:
        res = pb.run_wrk(app.srv.url + ROUTE, args.duration, args.connections)
    finally:
        for proc in stopped:
            proc.send_signal(signal.SIGCONT)
    return {
        "variant": variant,
        "rps": res["rps"],
        "p50_ms": res["p50_ms"],
        "p99_ms": res["p99_ms"],
        "errors": res["errors"],
    }


def summarize(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for variant in VARIANTS:
        mine = [s for s in samples if s["variant"] == variant]
        rows.append(
            {
                "variant": variant,
                "rounds": len(mine),
                "rps": statistics.median(s["rps"] for s in mine),
                "p50_ms": statistics.median(s["p50_ms"] for s in mine),
                "p99_ms": statistics.median(s["p99_ms"] for s in mine),
                "p99_rounds": [s["p99_ms"] for s in mine],
                "errors": sum(s["errors"] for s in mine),
            }
        )
    base = next(r for r in rows if r["variant"] == "none")
    for row in rows:
        row["rps_x_none"] = row["rps"] / base["rps"]
        row["p99_x_none"] = row["p99_ms"] / base["p99_ms"]
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'variant':<16} {'req/s':>7} {'x none':>6} {'p50 ms':>7} {'p99 ms':>7} {'x none':>6}  p99 by round",
        "-" * 90,
    ]
    for r in rows:
        rounds = " ".join(f"{v:.2f}" for v in r["p99_rounds"])
        lines.append(
            f"{r['variant']:<16} {r['rps']:>7.0f} {r['rps_x_none']:>6.2f} {r['p50_ms']:>7.2f} "
            f"{r['p99_ms']:>7.2f} {r['p99_x_none']:>6.2f}  {rounds}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of one sample")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument(
        "--ring", type=int, default=64 * 1024 * 1024, help="SW_AGENT_RING_SIZE of the swmp servers"
    )
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--serve-sink", metavar="READY_FILE", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_sink:
        return serve_sink(Path(args.serve_sink))
    app_args = argparse.Namespace(cpu_iterations=200, workers=2)
    ring = {"SW_AGENT_RING_SIZE": str(args.ring)}
    samples: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tail-probe-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        sink_address, _ = stack.enter_context(sink_process(work))
        apps = {
            "none": stack.enter_context(pb.application("none", ROUTE, work, app_args)),
            "swmp": stack.enter_context(pb.application("swmp", ROUTE, work, app_args, ring)),
            "sink": stack.enter_context(
                pb.application(
                    "swmp",
                    ROUTE,
                    work,
                    app_args,
                    {**ring, "SW_AGENT_COLLECTOR_BACKEND_SERVICES": sink_address},
                )
            ),
        }
        running = list(apps.values())
        for app in running:
            pb.warm_up(app, argparse.Namespace(warmup=args.warmup, connections=args.connections))
        for rnd in range(args.rounds):
            k = rnd % len(VARIANTS)
            for variant in VARIANTS[k:] + VARIANTS[:k]:
                app = apps.get(variant, apps["swmp"])
                s = sample(variant, app, running, args)
                s["round"] = rnd
                samples.append(s)
                print(
                    f"round {rnd + 1}/{args.rounds} {variant:<16} {s['rps']:7.0f} req/s "
                    f"p50 {s['p50_ms']:5.2f} p99 {s['p99_ms']:5.2f} ms",
                    flush=True,
                )
    rows = summarize(samples)
    print()
    print(table(rows))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": rows, "samples": samples, "args": vars(args)}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
