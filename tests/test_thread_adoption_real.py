"""Thread mode: what a pool process SIGTERMed by ``Pool.terminate()`` wrote but its reporter
thread had not sent is delivered by a live process that adopts its private arena.

A real program under ``swmp run`` reports to the in-process test collector over gRPC. The
flush interval is long (30 s), so every pool process's segments are still in its ring (read
into an unsent batch, never committed) when ``terminate()`` ends it: before adoption, none of
them arrived.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.collector import Collector
from tests.test_agent_launcher import base_env

pytestmark = pytest.mark.timeout(180)

POOL_TERMINATED = textwrap.dedent(
    """
    import json, multiprocessing, os, sys

    import swmp


    def traced(name):
        with swmp.entry_span(name):
            pass
        return os.getpid()


    if __name__ == "__main__":
        method, out, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
        ctx = multiprocessing.get_context(method)
        traced("main")
        pids = []
        for r in range(rounds):
            with ctx.Pool(2) as pool:  # the block's end is terminate(): SIGTERM, no atexit
                pids += pool.map(traced, [f"task-{r}-{i}" for i in range(4)], chunksize=1)
        with open(out, "w") as f:
            json.dump({"main": os.getpid(), "pids": pids}, f)
    """
)


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector(enable_http=False) as c:
        yield c


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_segments_of_pool_processes_ended_by_terminate_arrive_exactly_once(
    tmp_path: Path, collector: Collector, method: str
) -> None:
    script = tmp_path / "prog.py"
    script.write_text(POOL_TERMINATED)
    out = tmp_path / "out.json"
    rounds = 3
    env = base_env(
        tmp_path,
        collector,
        SW_AGENT_NAME="adopt",
        SW_AGENT_INSTANCE_NAME="adopt",
        SW_AGENT_REPORTER_PROCESS="false",
        SW_AGENT_REPORTER_FLUSH_INTERVAL="30",
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "swmp.cli",
            "run",
            "--",
            sys.executable,
            str(script),
            method,
            str(out),
            str(rounds),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads(out.read_text())
    pool_pids = set(info["pids"])
    assert len(pool_pids) >= 2 and info["main"] not in pool_pids
    wanted = {f"task-{r}-{i}" for r in range(rounds) for i in range(4)} | {"main"}
    # The program's own final flush delivers what it adopted last: by the time it exited.
    names = Counter(s.spans[0].operationName for s in collector.segments)
    assert names == Counter(wanted), names
    # Attributed to the pool processes' instances (their WORKER_START, announced once).
    instance_of = {s.spans[0].operationName: s.serviceInstance for s in collector.segments}
    main_instance = instance_of["main"]
    assert all(instance_of[n] != main_instance for n in wanted - {"main"}), instance_of
    announced = {
        p.serviceInstance: {kv.key: kv.value for kv in p.properties}.get("Process No.")
        for p in collector.properties
    }
    for name in wanted - {"main"}:
        assert announced.get(instance_of[name]) in {str(p) for p in pool_pids}, (name, announced)
