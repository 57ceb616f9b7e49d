"""System calls per request of a prefork application, with and without the agent.

Issue 9 asks that a worker make no system call per request for reporting. This runs the
prefork benchmark's application (examples/app.py under Gunicorn, 2 sync workers; see
prefork_bench.py) without an agent and under ``swmp run``, holds it at a fixed rate with
``benchmarks/paced_load.py``, and counts with ``strace -c -f`` the system calls of both
workers and of the reporter process over that window. The table gives, per variant and
process role, each call's count per request; a reporting call in the workers (a doorbell
``write``, ``futex``, ``madvise``) would show as a row with swmp above no agent.

    python benchmarks/syscalls_bench.py [--rate 300] [--seconds 5] [--route /cpu] [--quick] [--json PATH]

Needs ``strace`` (Debian package) and the right to trace the server's processes (root, or
``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import prefork_bench as pb  # noqa: E402
from benchmarks.paced_load import paced  # noqa: E402

_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")


def counts(summary: str) -> dict[str, int]:
    """``strace -c`` summary text -> calls per system call name."""
    out: dict[str, int] = {}
    for line in summary.splitlines():
        m = _ROW.match(line)
        if m and m.group(2) != "total":
            out[m.group(2)] = int(m.group(1))
    return out


def traced_window(
    pids: list[int], url: str, rate: float, seconds: float, out: Path
) -> tuple[int, dict[str, int]]:
    """Requests served and system calls of ``pids`` while ``rate`` requests/s arrive."""
    if not pids:
        return 0, {}
    cmd = ["strace", "-c", "-f", "-o", str(out)]
    for pid in pids:
        cmd += ["-p", str(pid)]
    tracer = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # attached: strace names each process it took
            time.sleep(0.05)
            if tracer.poll() is not None:
                raise RuntimeError(f"strace failed: {tracer.stderr.read() if tracer.stderr else ''}")
            if len(_attached(pids)) == len(pids):
                break
        result = paced(url, rate, seconds)
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=30)
    return result.requests, counts(out.read_text())


def _attached(pids: list[int]) -> list[int]:
    """The pids whose TracerPid is set (strace has attached to them)."""
    found = []
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        m = re.search(r"^TracerPid:\s+(\d+)", status, re.M)
        if m and m.group(1) != "0":
            found.append(pid)
    return found


def measure(variant: str, args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    app_args = argparse.Namespace(workers=2, cpu_iterations=200, warmup=2.0, connections=4)
    rows: list[dict[str, Any]] = []
    with pb.application(variant, args.route, work, app_args) as app:
        pb.warm_up(app, app_args)
        procs = pb.app_processes(app.srv)
        roles = {
            "workers": list(app.srv.worker_pids()),
            "reporter": [p.pid for p in procs if pb.is_reporter(p)],
        }
        for role, pids in roles.items():
            if not pids:
                continue
            served, calls = traced_window(
                pids, app.srv.url + args.route, args.rate, args.seconds, work / "s.txt"
            )
            for name, n in sorted(calls.items(), key=lambda kv: -kv[1]):
                rows.append(
                    {"variant": variant, "role": role, "syscall": name, "calls": n, "requests": served}
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=300.0, help="requests per second")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--route", default="/cpu", choices=pb.ROUTES)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 s at 100 requests/s")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    if args.quick:
        args.rate, args.seconds = 100.0, 1.0
    if shutil.which("strace") is None:
        print("strace is not installed (apt-get install -y strace)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="syscalls-bench-"))
    try:
        rows = measure("none", args, work) + measure("swmp", args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'variant':<8} {'role':<9} {'syscall':<16} {'calls':>7} {'per request':>11}")
    for r in rows:
        per = r["calls"] / max(1, r["requests"])
        print(f"{r['variant']:<8} {r['role']:<9} {r['syscall']:<16} {r['calls']:>7} {per:>11.3f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rate": args.rate, "seconds": args.seconds, "rows": rows}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
