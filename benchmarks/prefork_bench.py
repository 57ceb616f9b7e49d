"""Gunicorn under wrk: what an agent costs a prefork application, side by side.

One run compares, with rounds interleaved (the variant order rotates every round, so slow
drift of the machine spreads over all of them):

  none               no agent
  swmp               swmp run, reporter process (the default)
  swmp-inprocess     swmp run, SW_AGENT_REPORTER_PROCESS=false (a reporter thread per worker)
  skywalking-thread  apache-skywalking 1.2.0 started in post_fork, threading reporter
  skywalking-async   the same with SW_AGENT_ASYNCIO_ENHANCEMENT=True

Application: examples/app.py under Gunicorn, 2 sync workers; routes ``/cpu`` (~100 us of
hashing) and ``/io`` (2 ms sleep). Every (variant, route) gets its own server and gRPC test
collector (tests/collector.py), all running for the route's whole measurement and warmed
up once; each sample waits until the other variants' processes are idle (< 2% of a CPU
over 0.25 s, at most 30 s) and reports the CPU they used during it (``bg %``, the highest
over the rounds). All agents report traces only (meters, logs and profiling off) to the
same kind of collector.

Loads: saturation (wrk, ``--connections`` connections), then fixed rates of a fraction of
the no-agent saturation rate of the same route (``--rates``, default 50% and 10%; paced by
benchmarks/paced_load.py, since most servers run well below saturation and an agent's
cost per request can grow as the rate falls). With ``--together``, each fixed-rate sample
loads every variant at once over the same window, so that the machine's drift (the CPU
time of a request moves by 100-250 us from one 5 s sample to the next on a VM) hits all
variants alike: for rates the machine has room for twice over (10 % here), ``bg %`` then
being the other variants' CPU during the sample. One paced load drives them all, their
requests taking turns (two loads started together biased one server by 20-35 us a
request); ``--fresh-sets N`` spreads those rounds over N sets of newly started servers,
started in rotated orders (one server instance can keep a bias of ~20 us a request for its
life).

Per variant, route and load (medians over rounds): requests/s, p50/p99 latency, CPU
microseconds per request summed over every process of the application (master, workers,
and the detached supervisor and reporter found through the arena: tests/agent_procs.py)
and what it adds over no agent (``+us``, the median over rounds
of the difference to no agent in the same round; ``+wrk`` is the
workers' share of it, ``rep`` the reporter process's CPU per request), worker and reporter RSS
(and the reporter's PSS), and requests served vs segments received (the
server is stopped gracefully and the reporter drained before the collector is read).
wrk's count misses requests in flight when it stops, so segments may exceed requests by
up to the number of connections; fewer segments than requests is loss.

    python benchmarks/prefork_bench.py [--quick] [--json PATH] [--plot PNG] [--rates 0.5,0.1]
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from benchmarks.paced_load import paced  # noqa: E402
from tests.agent_procs import application_processes  # noqa: E402
from tests.collector import CollectorProcess, free_port  # noqa: E402
from tests.servers import (  # noqa: E402
    Server,
    agent_env,
    gunicorn_command,
    request,
    run_server,
    wait_until,
)

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
    errors: int = 0
    load: str = "max"  # "max" (wrk, saturation) or the fixed rate's share of no agent's max
    reporter_pss_mib: float = 0.0
    # The same CPU split by role (us per request): the workers, and the reporter process
    # (the rest is the master and the reporter's supervisor).
    worker_cpu_us: float = 0.0
    reporter_cpu_us: float = 0.0
    # A worker's private memory (USS): its RSS also counts the pages of its ring, which it
    # shares with the reporter (one copy in RAM, up to the ring's size in every RSS).
    worker_uss_mib: float = 0.0
    # CPU the other variants' processes (and collectors) used during this sample, % of one
    # CPU, and the seconds waited for them to go quiet before it (see ``settle``).
    background_pct: float = 0.0
    settle_s: float = 0.0


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
def app_processes(srv: Server) -> list[psutil.Process]:
    """The master, its workers and, through the arena, the agent's reporter and supervisor
    (started detached, they descend from no process of the application)."""
    return application_processes(srv.pid, srv.arena_path())


def process_clock(pid: int) -> int:
    """Linux's CPU-time clock of a whole process (``clock_getcpuclockid``; CPUCLOCK_SCHED: the
    scheduler's nanosecond count, its exited threads included)."""
    return ((~pid) << 3) | 2


def cpu_seconds(procs: list[psutil.Process]) -> dict[int, float]:
    """CPU time of each process, user and system together. In nanoseconds from the
    process's CPU clock where the kernel gives it; else psutil's, whose user/system times
    come in 10 ms ticks (at 78 requests/s for 5 s, up to ~25 us per request per process)."""
    out = {}
    for p in procs:
        try:
            out[p.pid] = time.clock_gettime_ns(process_clock(p.pid)) / 1e9
            continue
        except (OSError, AttributeError):  # not Linux, or the process is gone
            pass
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


def pss_mib(procs: list[psutil.Process]) -> float:
    total = 0
    for p in procs:
        try:
            total += p.memory_full_info().pss
        except (psutil.Error, AttributeError):
            pass
    return total / (1 << 20)


def uss_mib(procs: list[psutil.Process]) -> float:
    total = 0
    for p in procs:
        try:
            total += p.memory_full_info().uss
        except (psutil.Error, AttributeError):
            pass
    return total / (1 << 20)


def rss_mib(procs: list[psutil.Process]) -> float:
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / (1 << 20)


# -- one application per variant -----------------------------------------------------------------
@dataclass
class App:
    variant: str
    route: str
    srv: Server
    col: CollectorProcess
    run_dir: Path
    served: int = 0  # every request wrk counted, warm-up included
    errors: int = 0
    segments: int = 0
    extra_segments: int = 0  # received by the fresh servers of --fresh-sets (their served: in served)


@contextlib.contextmanager
def application(
    variant: str, route: str, work: Path, args: argparse.Namespace, extra_env: dict[str, str] | None = None
) -> Iterator[App]:
    """A collector and a Gunicorn running examples/app.py under ``variant``, answering
    (``extra_env`` last: benchmarks/tail_probe.py points one at another backend).
    """
    run_dir = Path(tempfile.mkdtemp(prefix=f"{variant}-{route.strip('/')}-", dir=work))
    # Counts only: a collector that keeps every segment of the run and handles them one by
    # one works on the same two cores as the application, which showed in the agent's p99
    # (docs/performance.md, "The p99 at saturation: the test collector's share, and delivery's").
    col = CollectorProcess(
        str(run_dir),
        extra_args=["--summary-file", str(run_dir / "summary.json"), "--count-only"],
        dump=False,
    )
    col.start()
    # The collector stands in for an OAP on another machine: it may only use idle CPU.
    assert col.proc is not None
    psutil.Process(col.proc.pid).nice(19)
    try:
        port = free_port()
        extra = {"SW_AGENT_PVM_METER_REPORTER_ACTIVE": "false", "CPU_ITERATIONS": str(args.cpu_iterations)}
        if variant == "skywalking-async":
            extra["SW_AGENT_ASYNCIO_ENHANCEMENT"] = "True"
        env = agent_env(
            run_dir,
            col.grpc_address,
            service=f"bench-{variant}",
            reporter_process=variant != "swmp-inprocess",
            extra=extra,
        )
        env["SW_AGENT_COLLECTOR_HEARTBEAT_PERIOD"] = "30"
        env.pop("SW_AGENT_REPORTER_FLUSH_INTERVAL", None)  # the defaults are what is measured
        env.update(extra_env or {})
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
            # Booted is not ready: an agent started in post_fork may still be loading.
            wait_until(lambda: request(port, route, timeout=5).status == 200, 60, "a first answer")
            app = App(variant, route, srv, col, run_dir)
            app.served += 1
            yield app
    finally:
        col.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def finish(app: App) -> None:
    """Stop the server gracefully (the agents flush), then count what the collector got."""
    app.srv.proc.stop(signal.SIGTERM, timeout=30)
    app.col.stop()
    summary = json.loads((app.run_dir / "summary.json").read_text())
    app.segments = int(summary["segment"]) + app.extra_segments


def warm_up(app: App, args: argparse.Namespace) -> None:
    res = run_wrk(app.srv.url + app.route, args.warmup, args.connections)
    app.served += res["requests"]
    app.errors += res["errors"]
    if res["requests"] == 0 or not app.srv.proc.alive():
        raise RuntimeError(f"{app.variant}: the server does not answer:\n{app.srv.proc.tail(30)}")


# -- the variants not being measured keep still ----------------------------------------------------
def others(running: list[App], app: App | None) -> list[psutil.Process]:
    """Every process of the other variants' applications and of their collectors (with
    ``app`` None, of all of them)."""
    procs: list[psutil.Process] = []
    for other in running:
        if other is app:
            continue
        procs += app_processes(other.srv)
        with contextlib.suppress(psutil.Error, AssertionError):
            assert other.col.proc is not None
            procs.append(psutil.Process(other.col.proc.pid))
    return procs


def settle(
    procs: list[psutil.Process], window: float = 0.25, quiet: float = 0.02, limit: float = 30.0
) -> float:
    """Wait until ``procs`` together use less than ``quiet`` of one CPU over ``window``;
    the seconds it took. An agent still sending what the previous sample queued (the
    apache-skywalking agent's reporter thread lags seconds behind at saturation) takes CPU
    from the next sample on a 2-core machine: one run measured swmp at 0.77x no agent in the
    rounds right after it and 1.02x in the round before."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        before = cpu_seconds(procs)
        time.sleep(window)
        after = cpu_seconds(procs)
        if sum(after[pid] - before.get(pid, after[pid]) for pid in after) < quiet * window:
            break
    return time.monotonic() - t0


def sample(
    app: App,
    rnd: int,
    args: argparse.Namespace,
    rate: float = 0.0,
    load: str = "max",
    *,
    running: list[App] | None = None,
) -> Measure:
    """One measurement: saturation with wrk, or ``rate`` requests/s paced; the other
    ``running`` applications quiet first, their CPU during it reported."""
    background = others(running or [], app)
    waited = settle(background)
    procs = app_processes(app.srv)
    t0 = time.monotonic()
    bg_before = cpu_seconds(background)
    before = cpu_seconds(procs)
    if rate > 0:
        r = paced(app.srv.url + app.route, rate, args.duration)
        res = {"requests": r.requests, "rps": r.rps, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms}
        res["errors"] = r.errors + r.late
    else:
        res = run_wrk(app.srv.url + app.route, args.duration, args.connections)
    after = cpu_seconds(procs)
    bg_after = cpu_seconds(background)
    elapsed = max(1e-6, time.monotonic() - t0)
    bg_used = sum(bg_after[pid] - bg_before.get(pid, bg_after[pid]) for pid in bg_after)
    used = {pid: after[pid] - before.get(pid, after[pid]) for pid in after}
    return _measure(app, rnd, res, procs, used, load, 100.0 * bg_used / elapsed, waited)


def _measure(  # noqa: PLR0917
    app: App,
    rnd: int,
    res: dict[str, Any],
    procs: list[psutil.Process],
    used: dict[int, float],
    load: str,
    background_pct: float,
    settle_s: float,
) -> Measure:
    """A sample's Measure from the load's result and each process's CPU seconds in it."""
    app.served += res["requests"]
    app.errors += res["errors"]
    cpu = sum(used.values())
    worker_pids = set(app.srv.worker_pids())
    workers = [p for p in procs if p.pid in worker_pids]
    reporter_pids = {p.pid for p in procs if is_reporter(p)}
    per_req = 1e6 / max(1, res["requests"])
    return Measure(
        variant=app.variant,
        route=app.route,
        round=rnd,
        rps=res["rps"],
        p50_ms=res["p50_ms"],
        p99_ms=res["p99_ms"],
        cpu_us_per_req=cpu / max(1, res["requests"]) * 1e6,
        worker_rss_mib=rss_mib(workers) / max(1, len(workers)),
        reporter_rss_mib=rss_mib([p for p in procs if is_reporter(p)]),
        errors=res["errors"],
        load=load,
        reporter_pss_mib=pss_mib([p for p in procs if is_reporter(p)]),
        worker_cpu_us=sum(used.get(pid, 0.0) for pid in worker_pids) * per_req,
        reporter_cpu_us=sum(used.get(pid, 0.0) for pid in reporter_pids) * per_req,
        worker_uss_mib=uss_mib(workers) / max(1, len(workers)),
        background_pct=background_pct,
        settle_s=settle_s,
    )


def sample_together(
    apps: list[App], rnd: int, args: argparse.Namespace, rate: float, load: str
) -> list[Measure]:
    """One measurement of every application at once: each gets ``rate`` requests/s, their
    requests taking turns from one paced load (``paced_load.run_interleaved``; the order
    rotates every round), and each one's CPU is read over the same window. On a VM whose
    CPU time per request drifts by 100-250 us from one 5 s sample to the next, the variants
    then see the same drift (paired within the sample, not across samples). One load, not
    one per application: loads started together have their requests due at the same
    instants, and which server's request met an idle CPU and which a warm one held for the
    whole run (20-35 us per request between two identical servers)."""
    waited = settle([p for app in apps for p in app_processes(app.srv)])
    procs = [app_processes(app.srv) for app in apps]
    before = [cpu_seconds(p) for p in procs]
    script = str(Path(__file__).resolve().parent / "paced_load.py")
    turns = _rotated(list(range(len(apps))), rnd)
    urls = [apps[i].srv.url + apps[i].route for i in turns]
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, script, *urls, str(rate), str(args.duration), "--json"],
        capture_output=True,
        text=True,
        timeout=args.duration * len(apps) + 60,
        check=True,
    )
    after = [cpu_seconds(p) for p in procs]
    elapsed = max(1e-6, time.monotonic() - t0)
    rows = json.loads(done.stdout)
    rows = [rows] if isinstance(rows, dict) else rows
    by_app = dict(zip(turns, rows, strict=True))
    used = [{pid: a[pid] - b.get(pid, a[pid]) for pid in a} for b, a in zip(before, after, strict=True)]
    total = sum(sum(u.values()) for u in used)
    out = []
    for i, (app, p, u) in enumerate(zip(apps, procs, used, strict=True)):
        r = by_app[i]
        seconds = max(1e-9, r["seconds"])
        res = {"requests": r["requests"], "rps": r["requests"] / seconds, "p50_ms": r["p50_ms"]}
        res.update(p99_ms=r["p99_ms"], errors=r["errors"] + r["late"])
        others_pct = 100.0 * (total - sum(u.values())) / elapsed  # the other variants, loaded alongside
        out.append(_measure(app, rnd, res, p, u, load, others_pct, waited))
    return out


# -- summary -----------------------------------------------------------------------------------
def _median(values: list[float]) -> float:
    real = [v for v in values if not math.isnan(v)]  # NaN: wrk saw no completed request
    return statistics.median(real) if real else float("nan")


def _paired(measures: list[Measure], row: dict[str, Any], field: str) -> float:
    """Median over rounds of (``row``'s variant - no agent) in ``field``, round by round."""
    by_round: dict[int, dict[str, float]] = {}
    for m in measures:
        if m.route == row["route"] and m.load == row["load"] and m.variant in (row["variant"], "none"):
            by_round.setdefault(m.round, {})[m.variant] = getattr(m, field)
    variant = row["variant"]
    diffs = [v[variant] - v["none"] for v in by_round.values() if variant in v and "none" in v]
    return _median(diffs)


def summarize(measures: list[Measure], apps: list[App]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    loads = list(dict.fromkeys(m.load for m in measures))
    for route, load, variant in [(ro, lo, v) for ro in ROUTES for lo in loads for v in VARIANTS]:
        ms = [m for m in measures if m.variant == variant and m.route == route and m.load == load]
        mine = [a for a in apps if a.variant == variant and a.route == route]
        if not ms:
            continue
        out.append(
            {
                "variant": variant,
                "route": route,
                "load": load,
                "rps": _median([m.rps for m in ms]),
                "p50_ms": _median([m.p50_ms for m in ms]),
                "p99_ms": _median([m.p99_ms for m in ms]),
                "cpu_us_per_req": _median([m.cpu_us_per_req for m in ms]),
                "worker_rss_mib": _median([m.worker_rss_mib for m in ms]),
                "worker_uss_mib": _median([m.worker_uss_mib for m in ms]),
                "background_pct": max(m.background_pct for m in ms),
                "reporter_rss_mib": _median([m.reporter_rss_mib for m in ms]),
                "reporter_pss_mib": _median([m.reporter_pss_mib for m in ms]),
                "worker_cpu_us": _median([m.worker_cpu_us for m in ms]),
                "reporter_cpu_us": _median([m.reporter_cpu_us for m in ms]),
                "requests_served": sum(a.served for a in mine),
                "segments_received": sum(a.segments for a in mine),
                "errors": sum(a.errors for a in mine),
                "rounds": len(ms),
            }
        )
    base = {(r["route"], r["load"]): r for r in out if r["variant"] == "none"}
    for r in out:
        b = base.get((r["route"], r["load"]))
        r["rps_vs_none"] = r["rps"] / b["rps"] if b else None
        r["p99_vs_none"] = r["p99_ms"] / b["p99_ms"] if b else None
        # Added CPU: the median of the differences to no agent *in the same round* (paired),
        # not the difference of the medians: at fixed low rates no agent's own CPU per
        # request moves by a quarter from one round to the next on this machine.
        r["cpu_us_added"] = _paired(measures, r, "cpu_us_per_req") if b else None
        r["worker_cpu_us_added"] = _paired(measures, r, "worker_cpu_us") if b else None
        r["segments_lost"] = (
            0 if r["variant"] == "none" else max(0, r["requests_served"] - r["segments_received"])
        )
    return out


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'variant':<18} {'route':<5} {'load':>4} {'req/s':>7} {'x none':>6} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'x none':>6} {'CPU us/req':>10} {'+us':>5} {'+wrk':>5} {'rep':>5} "
        f"{'worker MiB':>10} {'wrk USS':>7} {'rep. RSS':>8} {'rep. PSS':>8} "
        f"{'served':>7} {'segments':>8} {'lost':>5} {'bg %':>5}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['variant']:<18} {r['route']:<5} {r['load']:>4} {r['rps']:>7.0f} "
            f"{r['rps_vs_none'] or 0:>6.2f} "
            f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['p99_vs_none'] or 0:>6.2f} "
            f"{r['cpu_us_per_req']:>10.0f} {r['cpu_us_added'] or 0:>5.0f} "
            f"{r['worker_cpu_us_added'] or 0:>5.0f} {r['reporter_cpu_us']:>5.0f} "
            f"{r['worker_rss_mib']:>10.1f} {r['worker_uss_mib']:>7.1f} "
            f"{r['reporter_rss_mib']:>8.1f} {r['reporter_pss_mib']:>8.1f} "
            f"{r['requests_served']:>7} {r['segments_received']:>8} {r['segments_lost']:>5} "
            f"{r['background_pct']:>5.1f}"
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


# -- where the time goes: one worker, no server, no network -----------------------------------------
WORKER_COST_CHILD = """
import io, json, os, resource, sys, time
import psutil
variant, n, arena_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.environ.update({"SW_AGENT_ARENA_DIR": arena_dir, "SW_AGENT_COLLECTOR_BACKEND_SERVICES": sys.argv[4],
                   "SW_AGENT_LOG_REPORTER_ACTIVE": "false", "SW_AGENT_METER_REPORTER_ACTIVE": "false",
                   "SW_AGENT_PROFILE_ACTIVE": "false"})
if variant != "none":
    import swmp
    swmp.start(agent_reporter_process=variant == "swmp")
from examples.app import app

def start_response(status, headers, exc_info=None):
    return None

def one():
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/cpu", "SERVER_NAME": "127.0.0.1",
               "SERVER_PORT": "8000", "HTTP_HOST": "127.0.0.1:8000", "SERVER_PROTOCOL": "HTTP/1.1",
               "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(b""), "wsgi.errors": sys.stderr,
               "wsgi.version": (1, 0), "wsgi.multithread": False, "wsgi.multiprocess": True,
               "wsgi.run_once": False}
    body = app(environ, start_response)
    for _ in body:
        pass
    body.close()

for _ in range(300):
    one()
reporters = []
if variant == "swmp":  # found through the arena: started detached, it is no child of ours
    from tests.agent_procs import owner_arena, wait_agent_pids
    reporters = [psutil.Process(wait_agent_pids(owner_arena(os.getpid(), arena_dir), 60).reporter)]
def reporter_cpu():
    return sum(sum(p.cpu_times()[:2]) for p in reporters)
gap = float(os.environ.get("GAP_S", "0"))  # idle time between two requests
settled = time.monotonic() + 15  # the reporter's start-up (imports, channel) is not per segment
prev = reporter_cpu()
while reporters and time.monotonic() < settled:
    time.sleep(0.25)
    now = reporter_cpu()
    if now - prev < 0.005:
        break
    prev = now
r0 = reporter_cpu()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
t = time.process_time()
for _ in range(n):
    one()
    if gap:
        time.sleep(gap)
used = (time.process_time() - t) / n
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / n
time.sleep(0.5)  # let the reporter finish the last batch
print(json.dumps({"variant": variant, "process_us": used * 1e6, "faults": faults,
                  "reporter_us": (reporter_cpu() - r0) / n * 1e6}))
sys.stdout.flush()
os._exit(0)
"""


def worker_cost(n: int, work: Path, rounds: int = 5, gap_ms: float = 0.0) -> list[dict[str, Any]]:
    """CPU per request of the Flask app called directly in one process, ``n`` requests per
    run, ``gap_ms`` idle between two of them (a worker below saturation: each request finds
    the caches colder), variants alternated over ``rounds``: this process (tracing + record
    + ring write; in thread mode the reporter thread too) and, in process mode, the reporter
    process per segment. Per variant the median over rounds, and ``added``: the median of
    the same-round differences to no agent. CPU time, not wall time."""
    variants = ("none", "swmp", "swmp-inprocess")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    with CollectorProcess(str(work), ["--count-only"], dump=False) as col:
        for rnd in range(rounds):
            for variant in variants if rnd % 2 == 0 else variants[::-1]:
                arena_dir = tempfile.mkdtemp(dir=work)
                done = subprocess.run(
                    [sys.executable, "-c", WORKER_COST_CHILD, variant, str(n), arena_dir, col.grpc_address],
                    cwd=ROOT,
                    env={
                        **os.environ,
                        "PYTHONPATH": str(ROOT),
                        "CPU_ITERATIONS": "200",
                        "GAP_S": str(gap_ms / 1000),
                    },
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=600,
                )
                runs[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
    out = []
    for variant in variants:
        mine = [r["process_us"] for r in runs[variant]]
        base = [r["process_us"] for r in runs["none"]]
        out.append(
            {
                "variant": variant,
                "gap_ms": gap_ms,
                "process_us": _median(mine),
                "added_us": _median([a - b for a, b in zip(mine, base, strict=True)]),
                "reporter_us": _median([r["reporter_us"] for r in runs[variant]]),
                "faults": _median([r["faults"] for r in runs[variant]]),  # minor page faults per request
                "rounds": mine,
            }
        )
    return out


def measure_fixed_rates(
    running: list[App], measures: list[Measure], route: str, args: argparse.Namespace, work: Path
) -> None:
    """Every variant at fixed shares of the no-agent saturation rate measured just before."""
    shares = [float(x) for x in args.rates.split(",") if x.strip()]
    sat = [m.rps for m in measures if m.route == route and m.load == "max" and m.variant == "none"]
    if not shares or not sat:
        return
    top = _median(sat)
    for share in shares:
        load = f"{share:.0%}"
        if args.together and args.fresh_sets:
            rounds = args.fresh_sets * args.rate_rounds
            for k in range(args.fresh_sets):
                with fresh_applications(running, route, work, args, k) as apps:
                    for rnd in range(args.rate_rounds):
                        at = k * args.rate_rounds + rnd
                        batch = sample_together(apps, at, args, top * share, load)
                        _report(f"{route:<5} {load:>4} round {at + 1}/{rounds}", batch)
                        measures += batch
            continue
        for rnd in range(args.rate_rounds):
            if args.together:
                batch = sample_together(running, rnd, args, top * share, load)
            else:
                batch = [
                    sample(app, rnd, args, rate=top * share, load=load, running=running)
                    for app in _rotated(running, rnd)
                ]
            _report(f"{route:<5} {load:>4} round {rnd + 1}/{args.rate_rounds}", batch)
            measures += batch


@contextlib.contextmanager
def fresh_applications(
    running: list[App], route: str, work: Path, args: argparse.Namespace, k: int
) -> Iterator[list[App]]:
    """A new server for every variant, started in an order rotated by ``k``, warmed up.

    Why: on this project's VM one server instance can cost ~20 us per request more than an
    identical one at low rates, and keeps that for its life (measured with three no-agent
    servers side by side). Spreading the rounds over several sets of servers, each started
    in a different order, spreads that over the variants instead of charging it to one.
    What they serve and report is added to the applications of the saturation phase, whose
    served/segments columns then cover these too."""
    order = _rotated(running, k)
    with contextlib.ExitStack() as stack:
        fresh = {a.variant: stack.enter_context(application(a.variant, route, work, args)) for a in order}
        apps = [fresh[app.variant] for app in running]
        for app in apps:
            warm_up(app, args)
        yield apps
        for app, old in zip(apps, running, strict=True):
            finish(app)
            old.served += app.served
            old.errors += app.errors
            old.extra_segments += app.segments


T = TypeVar("T")


def _rotated(items: list[T], k: int) -> list[T]:
    """``items`` starting from index ``k`` (mod their number): who goes first changes every round."""
    k %= len(items)
    return items[k:] + items[:k]


def _report(label: str, batch: list[Measure]) -> None:
    for m in batch:
        print(
            f"{label} {m.variant:<18} {m.rps:7.0f} req/s "
            f"p50 {m.p50_ms:6.2f} p99 {m.p99_ms:6.2f} ms  cpu {m.cpu_us_per_req:5.0f} us/req"
            f"  (settled {m.settle_s:.1f} s, others {m.background_pct:.1f}%)",
            flush=True,
        )


# -- main --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, 2 s per measurement")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    ap.add_argument("--plot", metavar="PNG", help="write a bar chart (matplotlib)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--duration", type=float, default=4.0, help="seconds of one measured sample")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of load before measuring")
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cpu-iterations", type=int, default=200, help="sha256 rounds of /cpu (~0.5 us each)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--routes", default=",".join(ROUTES), help="routes to measure (default: both)")
    ap.add_argument(
        "--rates",
        default="0.5,0.1",
        help="fixed rates to measure, as shares of no agent's saturation rate ('' = saturation only)",
    )
    ap.add_argument("--rate-rounds", type=int, default=3, help="rounds of each fixed rate")
    ap.add_argument(
        "--together",
        action="store_true",
        help="at the fixed rates, load every variant at once over the same window (one paced load, "
        "their requests taking turns): the machine's drift then hits all alike; for rates the machine "
        "has room for",
    )
    ap.add_argument(
        "--fresh-sets",
        type=int,
        default=0,
        help="with --together: spread the fixed-rate rounds over this many sets of newly started "
        "servers (--rate-rounds each), started in rotated orders",
    )
    ap.add_argument(
        "--worker-cost",
        action="store_true",
        help="instead: CPU per request of the app called in-process (none, swmp, swmp-inprocess)",
    )
    ap.add_argument(
        "--gap-ms",
        type=float,
        default=0.0,
        help="with --worker-cost: idle milliseconds between two requests (a worker below saturation)",
    )
    args = ap.parse_args(argv)
    if args.worker_cost:
        with tempfile.TemporaryDirectory() as tmp:
            n = 300 if args.quick else (1000 if args.gap_ms else 3000)
            rows = worker_cost(n, Path(tmp), rounds=2 if args.quick else args.rounds, gap_ms=args.gap_ms)
        print(
            f"{'variant':<16} {'gap ms':>6} {'worker us/req':>13} {'+ vs none':>9} {'reporter us/seg':>15} "
            f"{'faults/req':>10}"
        )
        for r in rows:
            print(
                f"{r['variant']:<16} {r['gap_ms']:>6.1f} {r['process_us']:>13.1f} {r['added_us']:>9.1f} "
                f"{r['reporter_us']:>15.1f} {r['faults']:>10.3f}"
            )
        if args.json:
            Path(args.json).write_text(json.dumps({"worker_cost": rows}, indent=2))
        return 0
    if args.quick:
        args.rounds, args.duration, args.warmup, args.rate_rounds = 1, 2.0, 1.0, 1
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

    print(f"load average at start: {os.getloadavg()}", flush=True)
    measures: list[Measure] = []
    apps: list[App] = []
    work = Path(tempfile.mkdtemp(prefix="prefork-bench-"))
    try:
        for route in [r for r in ROUTES if r in args.routes.split(",")]:
            # Every variant runs at once (idle while another is measured) and the samples
            # interleave: a burst of outside load hits one sample, not one variant.
            with contextlib.ExitStack() as stack:
                running = [stack.enter_context(application(v, route, work, args)) for v in variants]
                for app in running:
                    warm_up(app, args)
                for rnd in range(args.rounds):
                    for app in _rotated(running, rnd):
                        m = sample(app, rnd, args, running=running)
                        measures.append(m)
                        _report(f"{route:<5} round {rnd + 1}/{args.rounds}", [m])
                measure_fixed_rates(running, measures, route, args, work)
                for app in running:
                    finish(app)
                    apps.append(app)
                    print(
                        f"{route:<5} {app.variant:<18} served {app.served} segments {app.segments}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows = summarize(measures, apps)
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
        "load_average_at_end": os.getloadavg(),
    }
    if args.json:
        Path(args.json).write_text(
            json.dumps({"meta": meta, "results": rows, "samples": [asdict(m) for m in measures]}, indent=2)
        )
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
