"""Gunicorn under wrk: what an agent costs a prefork application, side by side.

One run compares, with rounds interleaved (the variant order rotates every round, so slow
drift of the machine spreads over all of them):

  none               no agent
  swmp               swmp run, reporter process (the default)
  swmp-inprocess     swmp run, SW_AGENT_REPORTER_PROCESS=false (a reporter thread per worker)
  skywalking-thread  apache-skywalking 1.2.0 started in post_fork, threading reporter
  skywalking-async   the same with SW_AGENT_ASYNCIO_ENHANCEMENT=True

Application: examples/app.py under Gunicorn, 2 sync workers; routes ``/cpu`` (~100 us of
hashing) and ``/io`` (2 ms sleep). Every (round, variant, route) gets a fresh server and a
fresh gRPC test collector (tests/collector.py), a warm-up, then a measured wrk run. All
agents report traces only (meters, logs and profiling off) to the same kind of collector.

Per variant and route (medians over rounds): requests/s, p50/p99 latency (wrk), CPU
microseconds per request summed over every process of the application (master, workers,
reporter; psutil), worker and reporter RSS, and requests served vs segments received (the
server is stopped gracefully and the reporter drained before the collector is read).
wrk's count misses requests in flight when it stops, so segments may exceed requests by
up to the number of connections; fewer segments than requests is loss.

    python benchmarks/prefork_bench.py [--quick] [--json PATH] [--plot PNG]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from tests.collector import CollectorProcess, free_port  # noqa: E402
from tests.servers import Proc, agent_env, gunicorn_command, request, run_server, wait_until  # noqa: E402

VARIANTS = ("none", "swmp", "swmp-inprocess", "skywalking-thread", "skywalking-async")
ROUTES = ("/cpu", "/io")

SKYWALKING_CONF = """\
import os

control_socket_disable = True


def post_fork(server, worker):
    # The peer agent's documented Gunicorn start: in each worker, after fork.
    from skywalking import agent, config

    config.init(agent_instance_name=f"{os.environ['SW_AGENT_NAME']}-{os.getpid()}")
    agent.start()
"""


@dataclass
class Measure:
    variant: str
    route: str
    round: int
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_req: float
    worker_rss_mib: float
    reporter_rss_mib: float
    requests_served: int  # warm-up + measured, as wrk counted them
    segments_received: int
    errors: int = 0
    notes: list[str] = field(default_factory=list)


# -- wrk ---------------------------------------------------------------------------------------
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    if text == "nanms":
        return float("nan")
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not m:
        raise ValueError(f"unparsable latency {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def run_wrk(url: str, seconds: float, connections: int) -> dict[str, Any]:
    duration_arg = f"-d{max(1, round(seconds))}s"
    done = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", duration_arg, "--latency", "--timeout", "10s", url],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout}{done.stderr}")
    out = done.stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    duration = re.search(r"requests in ([\d.]+)(\w+),", out)
    assert duration is not None
    seconds_run = float(duration.group(1)) * (60 if duration.group(2) == "m" else 1)
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, re.M))
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if "50" not in lat or "99" not in lat:  # wrk prints no distribution when nothing completed
        lat = {"50": "nanms", "99": "nanms"}
    return {
        "requests": requests,
        "rps": requests / seconds_run,
        "p50_ms": _ms(lat["50"]),
        "p99_ms": _ms(lat["99"]),
        "errors": errors + (int(non2xx.group(1)) if non2xx else 0),
    }


# -- processes ---------------------------------------------------------------------------------
def app_processes(proc: Proc) -> list[psutil.Process]:
    return [p for p in proc.family() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def cpu_seconds(procs: list[psutil.Process]) -> dict[int, float]:
    out = {}
    for p in procs:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def is_reporter(p: psutil.Process) -> bool:
    # Its supervisor is an idle fork of the master whose pages are the master's: not counted.
    try:
        return p.name().startswith("swmp-reporter")
    except psutil.Error:
        return False


def rss_mib(procs: list[psutil.Process]) -> float:
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / (1 << 20)


# -- one measurement ---------------------------------------------------------------------------
def measure(variant: str, route: str, rnd: int, work: Path, args: argparse.Namespace) -> Measure:
    run_dir = Path(tempfile.mkdtemp(prefix=f"{variant}-{route.strip('/')}-", dir=work))
    col = CollectorProcess(
        str(run_dir), extra_args=["--summary-file", str(run_dir / "summary.json")], dump=False
    )
    col.start()
    try:
        port = free_port()
        service = f"bench-{variant}"
        extra = {"SW_AGENT_PVM_METER_REPORTER_ACTIVE": "false", "CPU_ITERATIONS": str(args.cpu_iterations)}
        if variant == "skywalking-async":
            extra["SW_AGENT_ASYNCIO_ENHANCEMENT"] = "True"
        env = agent_env(
            run_dir,
            col.grpc_address,
            service=service,
            reporter_process=variant != "swmp-inprocess",
            extra=extra,
        )
        env["SW_AGENT_COLLECTOR_HEARTBEAT_PERIOD"] = "30"
        env["SW_AGENT_REPORTER_FLUSH_INTERVAL"] = "0.2"
        config = ""
        if variant.startswith("skywalking"):
            conf = run_dir / "sw_gunicorn_conf.py"
            conf.write_text(SKYWALKING_CONF)
            config = str(conf)
        cmd = gunicorn_command(port, workers=args.workers, config=config)
        swmp_run = variant.startswith("swmp")
        with run_server(
            "gunicorn",
            run_dir,
            cmd,
            env,
            port=port,
            workers=args.workers,
            swmp_run=swmp_run,
            wait_claims=swmp_run,
        ) as srv:
            url = f"http://127.0.0.1:{port}{route}"
            # Booted is not ready: an agent started in post_fork may still be loading.
            wait_until(lambda: request(port, route, timeout=5).status == 200, 60, "a first answer")
            warm = run_wrk(url, args.warmup, args.connections)
            if warm["requests"] == 0 or not srv.proc.alive():
                raise RuntimeError(f"{variant}: the server does not answer:\n{srv.proc.tail(30)}")
            procs = app_processes(srv.proc)
            before = cpu_seconds(procs)
            res = run_wrk(url, args.duration, args.connections)
            after = cpu_seconds(procs)
            cpu = sum(after[pid] - before.get(pid, after[pid]) for pid in after)
            workers = [p for p in procs if p.pid in set(srv.worker_pids())]
            reporter = [p for p in procs if is_reporter(p)]
            worker_rss = rss_mib(workers) / max(1, len(workers))
            reporter_rss = rss_mib(reporter)
            srv.proc.stop(signal.SIGTERM, timeout=30)  # graceful: the agents flush
        col.stop()
        summary = json.loads((run_dir / "summary.json").read_text())
        return Measure(
            variant=variant,
            route=route,
            round=rnd,
            rps=res["rps"],
            p50_ms=res["p50_ms"],
            p99_ms=res["p99_ms"],
            cpu_us_per_req=cpu / max(1, res["requests"]) * 1e6,
            worker_rss_mib=worker_rss,
            reporter_rss_mib=reporter_rss,
            requests_served=warm["requests"] + res["requests"],
            segments_received=int(summary["segment"]),
            errors=warm["errors"] + res["errors"],
        )
    finally:
        col.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


# -- summary -----------------------------------------------------------------------------------
def _median(values: list[float]) -> float:
    real = [v for v in values if not math.isnan(v)]  # NaN: wrk saw no completed request
    return statistics.median(real) if real else float("nan")


def summarize(measures: list[Measure]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for variant in VARIANTS:
        for route in ROUTES:
            ms = [m for m in measures if m.variant == variant and m.route == route]
            if not ms:
                continue
            out.append(
                {
                    "variant": variant,
                    "route": route,
                    "rps": _median([m.rps for m in ms]),
                    "p50_ms": _median([m.p50_ms for m in ms]),
                    "p99_ms": _median([m.p99_ms for m in ms]),
                    "cpu_us_per_req": _median([m.cpu_us_per_req for m in ms]),
                    "worker_rss_mib": _median([m.worker_rss_mib for m in ms]),
                    "reporter_rss_mib": _median([m.reporter_rss_mib for m in ms]),
                    "requests_served": sum(m.requests_served for m in ms),
                    "segments_received": sum(m.segments_received for m in ms),
                    "errors": sum(m.errors for m in ms),
                    "rounds": len(ms),
                }
            )
    base = {r["route"]: r for r in out if r["variant"] == "none"}
    for r in out:
        b = base.get(r["route"])
        r["rps_vs_none"] = r["rps"] / b["rps"] if b else None
        r["p99_vs_none"] = r["p99_ms"] / b["p99_ms"] if b else None
        r["segments_lost"] = (
            0 if r["variant"] == "none" else max(0, r["requests_served"] - r["segments_received"])
        )
    return out


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'variant':<18} {'route':<5} {'req/s':>7} {'x none':>6} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'x none':>6} {'CPU us/req':>10} {'worker MiB':>10} {'reporter MiB':>12} {'served':>7} "
        f"{'segments':>8} {'lost':>5}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['variant']:<18} {r['route']:<5} {r['rps']:>7.0f} {r['rps_vs_none'] or 0:>6.2f} "
            f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['p99_vs_none'] or 0:>6.2f} "
            f"{r['cpu_us_per_req']:>10.0f} {r['worker_rss_mib']:>10.1f} {r['reporter_rss_mib']:>12.1f} "
            f"{r['requests_served']:>7} {r['segments_received']:>8} {r['segments_lost']:>5}"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = [v for v in VARIANTS if any(r["variant"] == v for r in rows)]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = [
        ("rps_vs_none", "requests/s relative to no agent", None),
        ("p99_ms", "p99 latency (ms)", None),
        ("cpu_us_per_req", "CPU us per request (all processes)", None),
    ]
    width = 0.8 / max(1, len(ROUTES))
    for ax, (key, title, _) in zip(axes, panels, strict=True):
        for i, route in enumerate(ROUTES):
            values = [
                next((r[key] or 0 for r in rows if r["variant"] == v and r["route"] == route), 0)
                for v in variants
            ]
            xs = [j + (i - (len(ROUTES) - 1) / 2) * width for j in range(len(variants))]
            ax.bar(xs, values, width, label=route)
        ax.set_xticks(range(len(variants)))
        ax.set_xticklabels(variants, rotation=25, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        if key == "rps_vs_none":
            ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.axhline(0.9, color="red", linewidth=0.6, linestyle="--")
        ax.legend(fontsize=8)
    fig.suptitle("Gunicorn, 2 sync workers, Flask; wrk on the same 2 cores", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -- main --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, 2 s per measurement")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    ap.add_argument("--plot", metavar="PNG", help="write a bar chart (matplotlib)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of measured load")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of load before measuring")
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cpu-iterations", type=int, default=200, help="sha256 rounds of /cpu (~0.5 us each)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 2.0, 1.0
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants: {sorted(unknown)}")
    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install -y wrk)", file=sys.stderr)
        return 2
    if any(v.startswith("skywalking") for v in variants):
        try:
            import skywalking  # noqa: F401
        except ImportError:
            print("apache-skywalking is not installed; skipping its variants", file=sys.stderr)
            variants = [v for v in variants if not v.startswith("skywalking")]

    measures: list[Measure] = []
    work = Path(tempfile.mkdtemp(prefix="prefork-bench-"))
    try:
        for rnd in range(args.rounds):
            order = variants[rnd % len(variants) :] + variants[: rnd % len(variants)]
            for variant in order:
                for route in ROUTES:
                    m = measure(variant, route, rnd, work, args)
                    measures.append(m)
                    print(
                        f"round {rnd + 1}/{args.rounds} {variant:<18} {route:<5} {m.rps:7.0f} req/s "
                        f"p99 {m.p99_ms:6.2f} ms  cpu {m.cpu_us_per_req:5.0f} us/req  "
                        f"served {m.requests_served} segments {m.segments_received}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows = summarize(measures)
    print()
    print(table(rows))
    meta = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "duration_s": args.duration,
        "connections": args.connections,
        "workers": args.workers,
        "cpu_iterations": args.cpu_iterations,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if args.json:
        Path(args.json).write_text(
            json.dumps({"meta": meta, "results": rows, "measures": [asdict(m) for m in measures]}, indent=2)
        )
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
