"""A Gunicorn worker's memory with and without the agent, meters on and off.

Gunicorn (examples/app.py, 2 sync workers) is started once per variant, served ``--requests``
requests of ``/cpu`` one at a time, left for ``--settle`` seconds (two meter reports at the
1 s period used here), and its workers' memory read from ``/proc`` through psutil: RSS (what
a container's per-process view shows, shared pages included) and USS (the pages only that
worker holds). The agent variants report to an address where nothing listens (memory does
not depend on delivery); ``swmp`` has the agent's defaults (meters, PVM meters and profiling
on, logs off as in the tests), ``swmp-no-meters`` turns meters off, as
``benchmarks/prefork_bench.py`` does.

    python benchmarks/worker_memory.py [--requests 1500] [--json PATH]

The requests are few enough that a worker's 4 MiB ring is not yet all resident (a busy one
keeps all of it: docs/performance.md, "A worker's private memory").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository
from tests import servers
from tests.collector import free_port

VARIANTS: dict[str, dict[str, str] | None] = {
    "none": None,
    "swmp": {
        "SW_AGENT_METER_REPORTER_ACTIVE": "true",
        "SW_AGENT_PVM_METER_REPORTER_ACTIVE": "true",
        "SW_AGENT_METER_REPORTER_PERIOD": "1",
        "SW_AGENT_PROFILE_ACTIVE": "true",
    },
    "swmp-no-meters": {"SW_AGENT_METER_REPORTER_ACTIVE": "false"},
}


def measure(variant: str, requests: int, settle: float) -> list[dict[str, Any]]:
    extra = VARIANTS[variant]
    with tempfile.TemporaryDirectory() as tmp:
        work, port = Path(tmp), free_port()
        env = servers.agent_env(work, "127.0.0.1:1", extra=extra or {})
        command = servers.gunicorn_command(port, workers=2)
        agent = extra is not None
        with servers.run_server(
            "gunicorn", work, command, env, port=port, workers=2, swmp_run=agent, wait_claims=agent
        ) as server:
            for _ in range(requests):
                servers.request(port, "/cpu")
            time.sleep(settle)  # meter reports happen on their own clock: let two pass
            rows = []
            for pid in server.worker_pids():
                info = psutil.Process(pid).memory_full_info()
                rss, uss = info.rss / 2**20, info.uss / 2**20
                rows.append({"variant": variant, "pid": pid, "rss_mib": rss, "uss_mib": uss})
            return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--settle", type=float, default=2.5, help="seconds left after the requests")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for variant in args.variants.split(","):
        rows += measure(variant, args.requests, args.settle)
    print(f"{'variant':16} {'worker pid':>10} {'RSS MiB':>8} {'USS MiB':>8}")
    for r in rows:
        print(f"{r['variant']:16} {r['pid']:>10} {r['rss_mib']:>8.2f} {r['uss_mib']:>8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
