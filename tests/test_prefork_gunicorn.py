"""Gunicorn end to end: real servers under real load, a real reporter, the test collector.

Each test counts what it sent and checks what the collector received: exactly one entry
segment per answered request, parent references across two applications, one instance
per worker named after its ring slot, one reporter per application.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from collections import Counter
from pathlib import Path

import pytest

from tests.collector import CollectorProcess, free_port
from tests.servers import (
    Result,
    agent_env,
    check_announced,
    check_two_apps,
    collector_process,
    gunicorn_command,
    load,
    messages,
    quiet_for,
    request,
    run_server,
    segments_of,
    two_app_envs,
    wait_segments,
    wait_until,
)

pytestmark = [pytest.mark.servers, pytest.mark.timeout(180)]

ROUTES = ["/cpu", "/io", "/call"]


def delivered(col: CollectorProcess, service: str) -> Counter[str]:
    return Counter(s["traceId"] for s in segments_of(col, service))


# -- the main scenario: two applications, a known load -------------------------------------------
@pytest.mark.parametrize(
    ("worker_class", "workers", "threads", "reporter_process"),
    [
        pytest.param("sync", 4, 0, True, id="sync"),
        pytest.param("gthread", 2, 4, True, id="gthread"),
        pytest.param("sync", 4, 0, False, id="sync-inprocess"),
    ],
)
def test_two_apps_every_request_has_its_segment(
    tmp_path: Path, worker_class: str, workers: int, threads: int, reporter_process: bool
) -> None:
    with collector_process(tmp_path) as col:
        b_port, a_port = free_port(), free_port()
        env_a, env_b = two_app_envs(tmp_path, col, b_port, reporter_process=reporter_process)
        cmd_b = gunicorn_command(b_port, workers=2)
        cmd_a = gunicorn_command(a_port, workers=workers, worker_class=worker_class, threads=threads)
        with (
            run_server("gunicorn", tmp_path, cmd_b, env_b, port=b_port, workers=2, name="b") as b,
            run_server("gunicorn", tmp_path, cmd_a, env_a, port=a_port, workers=workers, name="a") as a,
        ):
            results = load(a_port, ROUTES, 600, concurrency=8)
            check_two_apps(col, a, b, results)
            expected_reporters = 1 if reporter_process else 0
            assert len(a.reporters()) == expected_reporters
            assert len(b.reporters()) == expected_reporters


# -- start paths ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("how", "preload"),
    [
        pytest.param("swmp-run", True, id="swmp-run-preload"),
        pytest.param("config-file", False, id="config-file"),
        pytest.param("app-module", False, id="app-module-no-preload"),
        pytest.param("app-module", True, id="app-module-preload"),
    ],
)
def test_start_paths(tmp_path: Path, how: str, preload: bool) -> None:
    """Every documented way to start gives one reporter, one instance per worker, all data."""
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(tmp_path, col.grpc_address, service="s")
        app = "examples.started_app:app" if how == "app-module" else "examples.app:app"
        config = "examples/gunicorn_conf.py" if how == "config-file" else ""
        cmd = gunicorn_command(port, app=app, workers=3, preload=preload, config=config)
        swmp_run = how == "swmp-run"
        with run_server("gunicorn", tmp_path, cmd, env, port=port, workers=3, swmp_run=swmp_run) as srv:
            results = load(port, ["/cpu", "/io"], 150, concurrency=6)
            assert all(r.status == 200 for r in results)
            wait_segments(col, 150, "s")
            quiet_for(col, 0.3)
            segs = segments_of(col, "s")
            assert len(segs) == 150
            assert {s["serviceInstance"] for s in segs} <= {"s-w0", "s-w1", "s-w2"}
            check_announced(col, srv, "s")
            reporters = srv.reporters()
            assert len(reporters) == 1
            assert srv.reporter_lock_holder() == reporters[0].pid
            if how == "app-module" and not preload:
                # Started by a worker: detached from it (a worker's death must not take it along).
                assert reporters[0].ppid() not in srv.worker_pids()
            assert srv.arena_path().exists()
        # The master is gone: the reporter drained, left and removed the arena.
        wait_until(lambda: not srv.arena_path().exists(), 15, "the arena to be removed")
        assert not srv.reporters()


def test_uvicorn_workers(tmp_path: Path) -> None:
    with collector_process(tmp_path) as col:
        b_port, a_port = free_port(), free_port()
        env_a, env_b = two_app_envs(tmp_path, col, b_port)
        uvicorn = "uvicorn.workers.UvicornWorker"
        cmd_b = gunicorn_command(b_port, app="examples.asgi_app:app", workers=2, worker_class=uvicorn)
        cmd_a = gunicorn_command(a_port, app="examples.asgi_app:app", workers=2, worker_class=uvicorn)
        with (
            run_server("gunicorn", tmp_path, cmd_b, env_b, port=b_port, workers=2, name="b") as b,
            run_server("gunicorn", tmp_path, cmd_a, env_a, port=a_port, workers=2, name="a") as a,
        ):
            results = load(a_port, ROUTES, 300, concurrency=6)
            check_two_apps(col, a, b, results)
            assert len(a.reporters()) == 1


# -- workers that die, recycle, reload -------------------------------------------------------------
def test_kill_and_recycle_under_load(tmp_path: Path) -> None:
    """SIGKILL workers and recycle them (max_requests) during load: every request a surviving
    or replacement worker answered is delivered once, and the same slots are reused."""
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(tmp_path, col.grpc_address, service="k")
        cmd = gunicorn_command(port, workers=4, max_requests=60, extra=["--max-requests-jitter", "20"])
        with run_server("gunicorn", tmp_path, cmd, env, port=port, workers=4) as srv:
            killed: set[int] = set()
            lock = threading.Lock()
            answered = 0

            def on_result(_: Result) -> None:
                nonlocal answered
                with lock:
                    answered += 1
                    if answered in (200, 500):
                        victims = srv.worker_pids()
                        killed.add(victims[0])
                        os.kill(victims[0], signal.SIGKILL)

            results = load(port, ["/cpu", "/io"], 900, concurrency=8, traced_every=1, on_result=on_result)
            assert len(killed) == 2
            survivors = [r for r in results if r.status == 200 and r.worker_pid not in killed]
            wait_segments(col, len(survivors), "k")
            quiet_for(col, 1.0)
            got = delivered(col, "k")
            missing = [r for r in survivors if got[r.trace_id] != 1]
            assert not missing, f"{len(missing)} of {len(survivors)} answered requests have no segment"
            assert set(got) <= {r.trace_id for r in results}
            assert max(got.values()) == 1
            # Workers were replaced many times, yet only slots 0..3 were ever used.
            assert len({r.worker_pid for r in results if r.status == 200}) > 8
            assert {s["serviceInstance"] for s in segments_of(col, "k")} <= {f"k-w{i}" for i in range(4)}
            assert "ring slots" not in srv.proc.log()
            assert len(srv.reporters()) == 1
            check_announced(col, srv, "k")


def test_hup_reload_keeps_one_reporter(tmp_path: Path) -> None:
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(tmp_path, col.grpc_address, service="h")
        cmd = gunicorn_command(port, workers=3)
        with run_server("gunicorn", tmp_path, cmd, env, port=port, workers=3) as srv:
            before = load(port, ["/cpu"], 100, concurrency=4)
            reporter = srv.reporters()[0].pid
            old_workers = set(srv.worker_pids())
            srv.proc.send(signal.SIGHUP)
            srv.proc.wait_log(r"Booting worker with pid", count=6)
            wait_until(lambda: not old_workers & set(srv.worker_pids()), 30, "the old workers to leave")
            srv.wait_workers_claimed()
            after = load(port, ["/cpu"], 100, concurrency=4)
            assert all(r.status == 200 for r in before + after)
            assert {r.worker_pid for r in after}.isdisjoint(old_workers)
            wait_segments(col, 200, "h")
            quiet_for(col, 0.5)
            assert len(segments_of(col, "h")) == 200
            assert [p.pid for p in srv.reporters()] == [reporter]
            check_announced(col, srv, "h")


def test_timeout_and_fewer_workers(tmp_path: Path) -> None:
    """A worker killed by the master's timeout is replaced on the same slot; a worker removed
    for good (TTOU) stops being kept alive at the backend while the others still are."""
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(tmp_path, col.grpc_address, service="t")
        cmd = gunicorn_command(port, workers=3, timeout=2)
        with run_server("gunicorn", tmp_path, cmd, env, port=port, workers=3) as srv:
            slots_before = srv.live_slots()
            hung = request(port, "/sleep?s=30", timeout=60)
            assert hung.status != 200  # the master killed the worker serving it
            srv.proc.wait_log(r"WORKER TIMEOUT \(pid:\d+\)", count=1)
            victim = int(re.findall(r"WORKER TIMEOUT \(pid:(\d+)\)", srv.proc.log())[0])
            assert victim in slots_before.values()
            wait_until(
                lambda: victim not in srv.live_slots().values() and len(srv.live_slots()) == 3,
                30,
                "a replacement worker holding the freed slot",
            )
            slots_after = srv.live_slots()
            assert set(slots_after) == set(slots_before)  # the replacement took the freed slot
            assert slots_after != slots_before  # ... with a new pid
            check_announced(col, srv, "t")

            results = load(port, ["/cpu"], 60, concurrency=3)
            assert all(r.status == 200 for r in results)
            wait_segments(col, 60, "t")

            srv.proc.send(signal.SIGTTOU)
            wait_until(lambda: len(srv.worker_pids()) == 2, 30, "one worker fewer")
            wait_until(lambda: len(srv.live_slots()) == 2, 30, "its slot to be freed")
            gone = (set(slots_after) - set(srv.live_slots())).pop()
            gone_name, kept = f"t-w{gone}", [f"t-w{s}" for s in srv.live_slots()]

            def pings() -> Counter[str]:
                return Counter(p["serviceInstance"] for p in messages(col, "ping"))

            # Keep-alives are once a second: give the reporter a few periods.
            quiet_start = pings()
            wait_until(lambda: all(pings()[k] >= quiet_start[k] + 3 for k in kept), 20, "3 more pings each")
            settled = pings()[gone_name]
            wait_until(lambda: all(pings()[k] >= quiet_start[k] + 6 for k in kept), 20, "3 more pings each")
            assert pings()[gone_name] == settled  # no keep-alive for the departed instance
            assert quiet_start[gone_name] > 0


@pytest.mark.parametrize("reporter_process", [True, False], ids=["process", "inprocess"])
def test_sigterm_under_load_delivers_every_answered_request(tmp_path: Path, reporter_process: bool) -> None:
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(tmp_path, col.grpc_address, service="g", reporter_process=reporter_process)
        cmd = gunicorn_command(port, workers=4)
        with run_server("gunicorn", tmp_path, cmd, env, port=port, workers=4) as srv:
            stop = threading.Event()
            lock = threading.Lock()
            answered = 0

            def on_result(res: Result) -> None:
                nonlocal answered
                with lock:
                    answered += res.status == 200
                    if answered == 300 and not stop.is_set():
                        srv.proc.send(signal.SIGTERM)
                    if res.status == 0 and answered >= 300:
                        stop.set()  # the listener is closed: nothing more to send

            results = load(
                port, ["/cpu", "/io"], 5000, concurrency=8, traced_every=1, stop=stop, on_result=on_result
            )
            assert srv.proc.wait_exit(60) == 0
            # The reporter drains and leaves after the master; then nothing more can come.
            wait_until(lambda: not srv.reporters(), 30, "the reporter to finish")
            wait_until(lambda: not srv.arena_files(), 30, "the arenas to be removed")
            ok = [r for r in results if r.status == 200]
            assert len(ok) >= 300
            got = delivered(col, "g")
            missing = [r for r in ok if got[r.trace_id] != 1]
            assert not missing, f"{len(missing)} of {len(ok)} answered requests have no segment"
            assert set(got) <= {r.trace_id for r in results}
