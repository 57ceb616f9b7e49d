"""Soak: Gunicorn (4 sync workers, ``swmp run``, the real reporter over gRPC) at a steady
paced load for ``--minutes``, with faults on a schedule, sampling every second.

Every ``--cycle-minutes`` (default 5; the whole run when shorter) the schedule repeats:

* at 20 % of the cycle the backend's port closes for ``--outage-s`` (at most 15 % of the cycle),
* at 50 % the reporter is SIGKILLed (its supervisor starts another),
* at 70 % one Gunicorn worker is SIGKILLed (the master forks another).

Sampled each second: requests served and segments delivered (per second and in total), and
the RSS of every process of the application (master, each worker, reporter, supervisor).
At the end the load stops, the backend settles and every served request is matched to its
segment by trace id: served / delivered / duplicated / lost. Prints a table, writes
``--json PATH`` and a PNG (``--plot PATH``, matplotlib).

    python benchmarks/soak.py --minutes 10 --rate 200 --json soak.json --plot soak.png
    python benchmarks/soak.py --minutes 0.75 --json /tmp/s.json --plot /tmp/s.png   # CI

The backend is the test suite's collector behind a fault-injecting proxy
(``tests/faults``), in this process; the load generator is an asyncio client in this
process too, so the figures include their CPU on the same cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from tests.agent_procs import agent_pids  # noqa: E402
from tests.faults.backend import FaultBackend, fault_backend  # noqa: E402
from tests.faults.load import PacedLoad  # noqa: E402
from tests.faults.scenario import App, settle, unique_service  # noqa: E402
from tests.servers import is_swmp  # noqa: E402

MIB = 1024 * 1024
ROLES = ("master", "workers", "reporter", "supervisor")


@dataclass
class Event:
    at_s: float
    kind: str  # outage_start | outage_end | reporter_kill | worker_kill
    detail: str = ""
    done: bool = False


@dataclass
class Sample:
    t_s: float
    served_total: int
    delivered_total: int
    served_per_s: float
    delivered_per_s: float
    rss_mib: dict[str, float] = field(default_factory=dict)  # role -> MiB (workers: sum)
    worker_rss_max_mib: float = 0.0
    processes: int = 0


def schedule(total_s: float, cycle_s: float, outage_s: float) -> list[Event]:
    cycle_s = min(cycle_s, total_s)
    outage_s = min(outage_s, 0.15 * cycle_s)
    events: list[Event] = []
    start = 0.0
    while start + cycle_s <= total_s + 1e-6:
        events += [
            Event(start + 0.2 * cycle_s, "outage_start"),
            Event(start + 0.2 * cycle_s + outage_s, "outage_end"),
            Event(start + 0.5 * cycle_s, "reporter_kill"),
            Event(start + 0.7 * cycle_s, "worker_kill"),
        ]
        start += cycle_s
    return events


def processes(app: App) -> dict[str, list[psutil.Process]]:
    """The application's processes by role: the master and its workers from the process tree;
    the reporter and its supervisor from the arena (detached, they descend from no process of
    the application)."""
    out: dict[str, list[psutil.Process]] = {role: [] for role in ROLES}
    with contextlib.suppress(psutil.Error):
        master = psutil.Process(app.proc.pid)
        out["master"].append(master)
        for p in master.children():
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE and not is_swmp(p):
                    out["workers"].append(p)
    found = agent_pids(app.server.arena_path())
    for role, pid in (("reporter", found.reporter), ("supervisor", found.supervisor)):
        with contextlib.suppress(psutil.Error):
            if pid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out[role].append(psutil.Process(pid))
    return out


def rss(procs: list[psutil.Process]) -> list[float]:
    sizes = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            sizes.append(p.memory_info().rss / MIB)
    return sizes


def apply(event: Event, app: App, backend: FaultBackend) -> None:
    if event.kind == "outage_start":
        backend.outage()
    elif event.kind == "outage_end":
        backend.heal()
    elif event.kind == "reporter_kill":
        victims = processes(app)["reporter"]
        for p in victims:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        event.detail = " ".join(str(p.pid) for p in victims)
    elif event.kind == "worker_kill":
        workers = processes(app)["workers"]
        if workers:
            with contextlib.suppress(psutil.Error):
                workers[0].send_signal(signal.SIGKILL)
            event.detail = str(workers[0].pid)
    event.done = True


def soak(args: argparse.Namespace) -> dict[str, Any]:
    total_s = args.minutes * 60
    events = schedule(total_s, args.cycle_minutes * 60, args.outage_s)
    samples: list[Sample] = []
    with fault_backend() as backend, tempfile.TemporaryDirectory(prefix="swmp-soak-") as work:
        app = App(Path(work), backend, unique_service("soak"), workers=args.workers)
        with app:
            load = PacedLoad(app.port, args.rate).start()
            started = time.monotonic()
            last_served = last_delivered = 0
            last_t = 0.0
            try:
                while (now := time.monotonic() - started) < total_s:
                    for ev in events:
                        if not ev.done and ev.at_s <= now:
                            apply(ev, app, backend)
                    served, delivered = load.served_count(), backend.collector.segment_count
                    dt = max(1e-6, now - last_t)
                    procs = processes(app)
                    workers = rss(procs["workers"])
                    samples.append(
                        Sample(
                            round(now, 2),
                            served,
                            delivered,
                            round((served - last_served) / dt, 1) if samples else 0.0,
                            round((delivered - last_delivered) / dt, 1) if samples else 0.0,
                            {role: round(sum(rss(procs[role])), 1) for role in ROLES},
                            round(max(workers, default=0.0), 1),
                            sum(len(v) for v in procs.values()),
                        )
                    )
                    last_served, last_delivered, last_t = served, delivered, now
                    time.sleep(max(0.0, args.sample_s - (time.monotonic() - started - now)))
            finally:
                tally = load.stop()
                backend.heal()
            outcome = settle(
                backend, app.service, tally, f"soak {args.minutes:g} min at {args.rate:g}/s", app
            )
            leftovers = app.stop_and_leftovers()
    return {
        "config": {
            "minutes": args.minutes,
            "rate": args.rate,
            "workers": args.workers,
            "cycle_minutes": args.cycle_minutes,
            "outage_s": min(args.outage_s, 0.15 * min(args.cycle_minutes * 60, total_s)),
            "sample_s": args.sample_s,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_end": os.getloadavg(),
        },
        "events": [asdict(e) for e in events],
        "samples": [asdict(s) for s in samples],
        "outcome": asdict(outcome),
        "line": outcome.line(),
        "late_requests": tally.late,
        "rss_mib": rss_summary(samples),
        "leftover_processes": leftovers,
    }


def rss_summary(samples: list[Sample]) -> dict[str, dict[str, float]]:
    out = {}
    for role in ROLES:
        values = [s.rss_mib.get(role, 0.0) for s in samples if s.rss_mib.get(role)]
        if values:
            out[role] = {"first": values[0], "last": values[-1], "max": max(values)}
    return out


def table(doc: dict[str, Any], rows: int = 16) -> str:
    samples = doc["samples"]
    step = max(1, len(samples) // rows)
    lines = [
        f"{'t (s)':>7} {'served/s':>9} {'deliv/s':>8} {'served':>8} {'delivered':>9} "
        f"{'master':>7} {'workers':>8} {'reporter':>9} {'superv':>7}  (RSS MiB)"
    ]
    for s in samples[::step]:
        r = s["rss_mib"]
        lines.append(
            f"{s['t_s']:>7.0f} {s['served_per_s']:>9.0f} {s['delivered_per_s']:>8.0f} {s['served_total']:>8} "
            f"{s['delivered_total']:>9} {r['master']:>7.1f} {r['workers']:>8.1f} {r['reporter']:>9.1f} "
            f"{r['supervisor']:>7.1f}"
        )
    lines.append("events: " + ", ".join(f"{e['kind']}@{e['at_s']:.0f}s" for e in doc["events"]))
    lines.append(doc["line"])
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = doc["samples"]
    t = [s["t_s"] for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    axes[0].plot(t, [s["served_per_s"] for s in samples], label="served / s")
    axes[0].plot(t, [s["delivered_per_s"] for s in samples], label="delivered / s", alpha=0.8)
    axes[0].set_ylabel("per second")
    axes[1].plot(t, [s["served_total"] for s in samples], label="served (total)")
    axes[1].plot(t, [s["delivered_total"] for s in samples], label="delivered (total)")
    axes[1].set_ylabel("requests / segments")
    for role in ROLES:
        axes[2].plot(t, [s["rss_mib"].get(role, 0.0) for s in samples], label=f"{role} RSS")
    axes[2].plot(t, [s["worker_rss_max_mib"] for s in samples], label="largest worker RSS", linestyle=":")
    axes[2].set_ylabel("MiB")
    axes[2].set_xlabel("seconds")
    colours = {"reporter_kill": "red", "worker_kill": "purple"}
    starts = [e["at_s"] for e in doc["events"] if e["kind"] == "outage_start"]
    ends = [e["at_s"] for e in doc["events"] if e["kind"] == "outage_end"]
    for ax in axes:
        for a, b in zip(starts, ends, strict=False):
            ax.axvspan(a, b, color="grey", alpha=0.2)
        for e in doc["events"]:
            if e["kind"] in colours:
                ax.axvline(e["at_s"], color=colours[e["kind"]], linewidth=0.8, linestyle="--")
        ax.legend(fontsize=8, loc="upper left")
    cfg = doc["config"]
    fig.suptitle(
        f"soak: Gunicorn {cfg['workers']} sync workers at {cfg['rate']:g} req/s; grey = backend port closed, "
        "red = reporter SIGKILL, purple = worker SIGKILL\n" + doc["line"],
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the run (default 10)")
    ap.add_argument("--rate", type=float, default=200.0, help="requests (= segments) per second")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--cycle-minutes", type=float, default=5.0, help="the fault schedule repeats this often")
    ap.add_argument("--outage-s", type=float, default=30.0, help="backend outage per cycle, seconds")
    ap.add_argument("--sample-s", type=float, default=1.0)
    ap.add_argument("--json", metavar="PATH", help="write samples, events and the outcome as JSON")
    ap.add_argument("--plot", metavar="PNG", help="plot throughput, delivery and RSS (matplotlib)")
    args = ap.parse_args(argv)
    doc = soak(args)
    print(table(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.plot:
        plot(doc, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
