"""Thread mode: what a pool process SIGTERMed by ``Pool.terminate()`` wrote but its reporter
thread had not sent is delivered by a live process that adopts its private arena.

A real program under ``swmp run`` reports to the in-process test collector over gRPC. In the
first test every pool process records, then stays busy in its task until ``terminate()``
SIGTERMs it, and the flush interval is an hour: its segments are still in its ring (read into
an unsent batch, never committed) when it dies, and no process but the program itself ever
sends. Before adoption none of them arrived (0 of 6, the program's own one did).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.collector import Collector
from tests.test_agent_launcher import base_env

pytestmark = pytest.mark.timeout(180)

POOL_TERMINATED = textwrap.dedent(
    """
    import json, multiprocessing, os, sys, time

    import swmp


    def traced(name):
        with swmp.entry_span(name):
            pass
        return os.getpid()


    def blocked(name, marks):  # records, says so, and is still busy when terminate() comes
        traced(name)
        with open(os.path.join(marks, name + ".tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.rename(os.path.join(marks, name + ".tmp"), os.path.join(marks, name))  # whole or absent
        time.sleep(600)


    def others(directory, me):  # private arenas of other processes than this one (the pool's)
        return [
            name
            for sub in os.listdir(directory)
            for name in os.listdir(os.path.join(directory, sub))
            if name.endswith(".arena") and f"-{me}-t" not in name and "-t" in name
        ]


    def wait_until(done):
        deadline = time.monotonic() + 60
        while not done() and time.monotonic() < deadline:
            time.sleep(0.02)


    if __name__ == "__main__":
        method, out, rounds, how = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
        ctx = multiprocessing.get_context(method)
        traced("main")
        pids = []
        marks = out + ".marks"
        os.mkdir(marks)
        for r in range(rounds):
            with ctx.Pool(2) as pool:  # the block's end is terminate(): SIGTERM, no atexit
                if how == "block":  # each process busy in its task: no clean exit first
                    names = [f"task-{r}-{i}" for i in range(2)]
                    for name in names:
                        pool.apply_async(blocked, (name, marks))
                    wait_until(lambda: all(os.path.exists(os.path.join(marks, n)) for n in names))
                    for name in names:
                        with open(os.path.join(marks, name)) as f:
                            pids.append(int(f.read()))
                else:
                    pids += pool.map(traced, [f"task-{r}-{i}" for i in range(4)], chunksize=1)
        left = []
        if how == "wait":  # a long-running parent: its reporter thread adopts them on its tick
            directory = os.environ["SW_AGENT_ARENA_DIR"]
            wait_until(lambda: not others(directory, os.getpid()))
            left = others(directory, os.getpid())
        with open(out, "w") as f:
            json.dump({"main": os.getpid(), "pids": pids, "left": left}, f)
    """
)


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector(enable_http=False) as c:
        yield c


def run(
    tmp_path: Path, collector: Collector, method: str, rounds: int, *, how: str, flush: str
) -> dict[str, Any]:
    script = tmp_path / "prog.py"
    script.write_text(POOL_TERMINATED)
    out = tmp_path / "out.json"
    env = base_env(
        tmp_path,
        collector,
        SW_AGENT_NAME="adopt",
        SW_AGENT_INSTANCE_NAME="adopt",
        SW_AGENT_REPORTER_PROCESS="false",
        SW_AGENT_REPORTER_FLUSH_INTERVAL=flush,
    )
    argv = [sys.executable, str(script), method, str(out), str(rounds), how]
    done = subprocess.run(
        [sys.executable, "-m", "swmp.cli", "run", "--", *argv],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    info: dict[str, Any] = json.loads(out.read_text())
    return info


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_segments_of_pool_processes_ended_by_terminate_arrive_exactly_once(
    tmp_path: Path, collector: Collector, method: str
) -> None:
    # Only the program sends (at its exit): a process SIGTERMed between its own send and its
    # commit would have those records sent again by its adopter (at-least-once), which the
    # second test allows.
    rounds = 3
    info = run(tmp_path, collector, method, rounds, how="block", flush="3600")
    pool_pids = set(info["pids"])
    assert len(pool_pids) >= 2 and info["main"] not in pool_pids
    wanted = {f"task-{r}-{i}" for r in range(rounds) for i in range(2)} | {"main"}
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


def test_a_long_running_parent_adopts_what_its_pools_left_while_it_runs(
    tmp_path: Path, collector: Collector
) -> None:
    """The parent keeps running after its pools (no process starts reporting after them): its
    own reporter thread adopts their arenas on its tick, delivers and removes them."""
    info = run(tmp_path, collector, "spawn", 2, how="wait", flush="0.05")
    assert info["left"] == []  # removed while the parent still ran
    wanted = {f"task-{r}-{i}" for r in range(2) for i in range(4)} | {"main"}
    names = {s.spans[0].operationName for s in collector.segments}
    # At least once: a pool process SIGTERMed between its own send and its commit has those
    # records sent again by its adopter.
    assert names == wanted


KILLED_THEN_STARTED = textwrap.dedent(
    """
    import os, signal, sys

    import swmp

    with swmp.entry_span(sys.argv[1]):
        pass
    if sys.argv[2] == "kill":  # no exit handler, no final flush: the segment stays in the ring
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_what_a_killed_program_left_is_delivered_by_its_next_start(
    tmp_path: Path, collector: Collector
) -> None:
    """A thread-mode program SIGKILLed (the OOM killer, a container's kill) before its reporter
    thread sent anything, then started again: the second start's clean-up of dead arenas used
    to remove the first one's private arena, records and all (``ipc.cleanup_stale`` ran before
    the new reporter thread could adopt it). It is left for the adopter now."""
    script = tmp_path / "prog.py"
    script.write_text(KILLED_THEN_STARTED)
    env = base_env(
        tmp_path,
        collector,
        SW_AGENT_NAME="restart",
        SW_AGENT_REPORTER_PROCESS="false",
        SW_AGENT_REPORTER_FLUSH_INTERVAL="3600",  # nothing is sent before the kill
    )

    def start(name: str, how: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "swmp.cli", "run", "--", sys.executable, str(script), name, how]
        return subprocess.run(
            argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
        )

    first = start("first", "kill")
    assert first.returncode == -9, first.stderr[-3000:]
    assert not collector.segments
    second = start("second", "exit")
    assert second.returncode == 0, second.stderr[-3000:]
    names = Counter(s.spans[0].operationName for s in collector.segments)
    assert names == Counter({"first": 1, "second": 1}), names
    shm = tmp_path / "shm"
    assert not [p for p in shm.rglob("*.arena") if "-t" in p.name]  # adopted, delivered, removed
