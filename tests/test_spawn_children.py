"""Processes that ``multiprocessing`` starts with a fresh interpreter, under ``swmp run``.

A script opens a ``Pool`` of 3 with the *spawn* (and the *forkserver*) start method and runs
traced work in every pool process. Expected: one reporter process for the whole application
(the pool processes join the arena of the script's main process, each with a slot and an
instance name of its own), every segment delivered exactly once, and no agent at all in
multiprocessing's resource tracker and forkserver (no arena, no reporter). In thread mode
(``SW_AGENT_REPORTER_PROCESS=false``) there is no reporter process; the pool processes still
take their names from the main process's arena instead of each being ``-w0`` of its own.
Real processes, the real reporter, the in-test collector.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.collector import CollectorProcess, free_port
from tests.servers import (
    SWMP_RUN,
    Proc,
    agent_env,
    collector_process,
    gunicorn_command,
    is_swmp,
    quiet_for,
    request,
    run_server,
    segments_of,
    wait_segments,
    wait_until,
)
from tests.web_checks import new_trace, running, segments_of_trace

pytestmark = [pytest.mark.servers, pytest.mark.timeout(180)]

SERVICE = "spawnapp"
TASKS = 12  # the first 3 (one per pool process, held at a barrier), then 9 more

SCRIPT = textwrap.dedent(
    """
    import json, multiprocessing, os, sys, time

    import swmp

    _barrier = None


    def traced(op):
        with swmp.entry_span(op):
            swmp.tag("pid", str(os.getpid()))


    def init(barrier):
        global _barrier
        _barrier = barrier


    def first(i):
        _barrier.wait(60)  # each of the 3 pool processes runs one of the first 3 tasks
        traced(f"task-{i}")
        return os.getpid()


    def more(i):
        traced(f"task-{i}")
        return os.getpid()


    if __name__ == "__main__":
        method, out, release = sys.argv[1:4]
        ctx = multiprocessing.get_context(method)
        traced("main")
        pool = ctx.Pool(3, initializer=init, initargs=(ctx.Barrier(3),))
        pids = pool.map(first, range(3), chunksize=1) + pool.map(more, range(3, TASKS), chunksize=1)
        with open(out + ".tmp", "w") as f:
            json.dump({"main": os.getpid(), "pids": pids}, f)
        os.rename(out + ".tmp", out)
        deadline = time.monotonic() + 120
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)  # the test counts processes now
        pool.close()  # the pool processes end normally (no terminate): they leave cleanly
        pool.join()
    """
).replace("TASKS", str(TASKS))


@pytest.fixture(scope="module")
def col(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CollectorProcess]:
    with collector_process(tmp_path_factory.mktemp("spawn-collector")) as c:
        yield c


def _infrastructure(proc: Proc, marker: str) -> list[psutil.Process]:
    """multiprocessing's resource tracker / forkserver started by the script (not the
    forkserver's children: they have its command line too)."""
    out = []
    for p in proc.family():
        with contextlib.suppress(psutil.Error):
            if marker in " ".join(p.cmdline()) and p.ppid() == proc.pid and p.status() != "zombie":
                out.append(p)
    return out


def _files_open_in(p: psutil.Process, directory: Path) -> list[str]:
    found = []
    with contextlib.suppress(psutil.Error):
        for fd in os.listdir(f"/proc/{p.pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{p.pid}/fd/{fd}")
                if target.startswith(str(directory)):
                    found.append(target)
    return found


def _arena_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*/*.arena"))


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize("reporter_process", [True, False], ids=["process", "thread"])
def test_pool_processes_join_the_application(
    tmp_path: Path, col: CollectorProcess, reporter_process: bool, method: str
) -> None:
    service = f"{SERVICE}-{method}-{'process' if reporter_process else 'thread'}"
    script = tmp_path / "pool_app.py"
    script.write_text(SCRIPT)
    out, release = tmp_path / "pids.json", tmp_path / "release"
    env = agent_env(tmp_path, col.grpc_address, service=service, reporter_process=reporter_process)
    arena_dir = Path(env["SW_AGENT_ARENA_DIR"])
    argv = [*SWMP_RUN, sys.executable, str(script), method, str(out), str(release)]
    proc = Proc(argv, env, tmp_path / "pool_app.log", marker=str(arena_dir))
    proc.start()
    try:

        def written() -> bool:
            if not proc.alive():
                raise AssertionError(f"the script exited:\n{proc.tail()}")
            return out.exists()

        wait_until(written, 90, "the pool's work done")
        info = json.loads(out.read_text())
        main, children = info["main"], set(info["pids"][:3])
        assert len(children) == 3 and main not in children

        # One reporter for the application (thread mode: none; each process reports on a thread).
        reporters = [p for p in proc.family() if is_swmp(p, "swmp-reporter") and p.status() != "zombie"]
        if reporter_process:
            wait_until(
                lambda: len([p for p in proc.family() if is_swmp(p, "swmp-reporter")]) >= 1, 30, "a reporter"
            )
            reporters = [p for p in proc.family() if is_swmp(p, "swmp-reporter") and p.status() != "zombie"]
            assert len(reporters) == 1, [" ".join(p.cmdline()) for p in reporters]
        else:
            assert reporters == []

        # No agent in the resource tracker nor in the forkserver: no arena, nothing open in
        # the arena directory. Only the application's own shared arena exists.
        tracker = _infrastructure(proc, "multiprocessing.resource_tracker")
        assert len(tracker) == 1
        infrastructure = tracker + _infrastructure(proc, "multiprocessing.forkserver")
        assert len(infrastructure) == (2 if method == "forkserver" else 1)
        for p in infrastructure:
            assert _files_open_in(p, arena_dir) == [], " ".join(p.cmdline())
        shared = [n for n in _arena_files(arena_dir) if "-t" not in n]
        assert len(shared) == 1 and f"-{main}-" in shared[0], _arena_files(arena_dir)

        release.touch()
        assert proc.wait_exit(60) == 0, proc.tail()
    finally:
        proc.stop()

    # Every segment arrived, exactly once; each pool process is an instance of its own.
    wait_segments(col, TASKS + 1, service=service)
    quiet_for(col, 1.0)
    segments = segments_of(col, service)
    ops = Counter(seg["spans"][0]["operationName"] for seg in segments)
    assert ops == Counter(["main", *[f"task-{i}" for i in range(TASKS)]])
    instance_of: dict[int, set[str]] = {}
    for seg in segments:
        tags = {t["key"]: t.get("value", "") for t in seg["spans"][0].get("tags", [])}
        instance_of.setdefault(int(tags["pid"]), set()).add(seg["serviceInstance"])
    assert set(instance_of) == {main, *children}
    names = [next(iter(v)) for v in instance_of.values() if len(v) == 1]
    assert len(names) == 4 and len(set(names)) == 4, instance_of  # one name per process, all distinct
    assert all(n.startswith(f"{service}-w") for n in names), names
    # Nothing left behind once the application ended.
    wait_until(lambda: not _arena_files(arena_dir), 30, "no arena file left")


WEB_APP = textwrap.dedent(
    """
    import json, multiprocessing, os

    import swmp


    def child():
        with swmp.entry_span("spawned-by-worker"):
            swmp.tag("pid", str(os.getpid()))
        return os.getpid()


    def app(environ, start_response):
        pool = multiprocessing.get_context("spawn").Pool(1)
        pid = pool.apply(child)
        pool.close()
        pool.join()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps({"worker": os.getpid(), "child": pid}).encode()]
    """
)


def test_a_gunicorn_workers_spawn_child_joins_the_master(tmp_path: Path, col: CollectorProcess) -> None:
    """A spawn pool opened by a Gunicorn worker: its process is one more instance of the
    application (a slot of the master's arena, so not ``-w0`` a second time), reported by the
    master's one reporter."""
    (tmp_path / "spawn_web.py").write_text(WEB_APP)
    service = f"{SERVICE}-gunicorn"
    env = agent_env(tmp_path, col.grpc_address, service=service)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    port = free_port()
    cmd = gunicorn_command(port, app="spawn_web:app", workers=2)
    with run_server("gunicorn", tmp_path, cmd, env, port=port, workers=2) as server:
        slots = server.live_slots()
        res = request(port, "/")
        assert res.status == 200, res
        body = json.loads(res.body)
        assert body["worker"] in slots.values()
        (seg,) = wait_segments(col, 1, service=service)
        assert seg["spans"][0]["operationName"] == "spawned-by-worker"
        worker_names = {f"{service}-w{slot}" for slot in slots}
        assert seg["serviceInstance"].startswith(f"{service}-w")
        assert seg["serviceInstance"] not in worker_names, (seg["serviceInstance"], worker_names)
        assert len(server.reporters()) == 1
        assert [p.name for p in server.arena_files()] == [server.arena_path().name]


def test_uvicorn_workers_share_one_reporter(tmp_path: Path, col: CollectorProcess) -> None:
    """``uvicorn --workers 2`` spawns its workers with multiprocessing: they join the main
    process's arena (slots 0 and 1 when they first record); one reporter in all (it was one
    each for the main process, the resource tracker and every worker)."""
    service = f"{SERVICE}-uvicorn"
    env = agent_env(tmp_path, col.grpc_address, service=service)
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "tests.e2e_apps.web_asgi:app",
        "--port",
        str(port),
        "--workers",
        "2",
    ]
    with running(tmp_path, "uvicorn", argv, env, port) as proc:
        instances: set[str] = set()
        for _ in range(60):  # the kernel spreads the connections over the two workers
            trace = new_trace()
            assert request(port, "/starlette/users/3", trace).status == 200
            (seg,) = segments_of_trace(col, trace)
            instances.add(seg["serviceInstance"])
            if len(instances) == 2:
                break
        assert instances == {f"{service}-w0", f"{service}-w1"}
        reporters = [p for p in proc.family() if is_swmp(p, "swmp-reporter") and p.status() != "zombie"]
        assert len(reporters) == 1, [" ".join(p.cmdline()) for p in reporters]
        assert len(_arena_files(Path(env["SW_AGENT_ARENA_DIR"]))) == 1
