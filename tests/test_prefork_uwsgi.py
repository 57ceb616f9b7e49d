"""uWSGI end to end: master + workers, lazy-apps, threads, reloads, with and without the
at-fork hooks, with the reporter process and the in-process reporter thread."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.collector import free_port
from tests.servers import (
    OSAFTERFORK_ABORTS,
    agent_env,
    check_announced,
    check_two_apps,
    collector_process,
    gunicorn_command,
    load,
    quiet_for,
    run_server,
    segments_of,
    two_app_envs,
    uwsgi_command,
    wait_segments,
    wait_until,
)

pytestmark = [pytest.mark.servers, pytest.mark.timeout(180)]

ROUTES = ["/cpu", "/io", "/call"]


@pytest.mark.parametrize(
    ("variant", "extra"),
    [
        pytest.param("default", {}, id="master-workers"),
        pytest.param("threads", {"threads": 4}, id="threads"),
        pytest.param("lazy", {"lazy_apps": True}, id="lazy-apps"),
        pytest.param("inprocess", {}, id="inprocess"),
    ],
)
def test_two_apps_every_request_has_its_segment(
    tmp_path: Path, variant: str, extra: dict[str, object]
) -> None:
    with collector_process(tmp_path) as col:
        b_port, a_port = free_port(), free_port()
        env_a, env_b = two_app_envs(tmp_path, col, b_port, reporter_process=variant != "inprocess")
        cmd_b = gunicorn_command(b_port, workers=2)
        cmd_a = uwsgi_command(a_port, workers=4, **extra)  # type: ignore[arg-type]
        with (
            run_server("gunicorn", tmp_path, cmd_b, env_b, port=b_port, workers=2, name="b") as b,
            run_server("uwsgi", tmp_path, cmd_a, env_a, port=a_port, workers=4, name="a") as a,
        ):
            results = load(a_port, ROUTES, 600, concurrency=8)
            check_two_apps(col, a, b, results)
            assert len(a.reporters()) == (0 if variant == "inprocess" else 1)


@pytest.mark.parametrize(
    ("lazy_apps", "osafterfork"),
    [
        pytest.param(False, False, id="master-import-no-hooks"),
        pytest.param(True, False, id="lazy-apps-no-hooks"),
        pytest.param(True, True, id="lazy-apps-osafterfork", marks=OSAFTERFORK_ABORTS),
    ],
)
def test_explicit_start_in_the_module(tmp_path: Path, lazy_apps: bool, osafterfork: bool) -> None:
    """No ``swmp run``: ``swmp.start()`` in the WSGI module, imported by the master or (lazy-apps)
    by every worker; Python's at-fork hooks may not run at all."""
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(tmp_path, col.grpc_address, service="u")
        cmd = uwsgi_command(
            port, module="examples.started_app:app", workers=4, lazy_apps=lazy_apps, osafterfork=osafterfork
        )
        with run_server("uwsgi", tmp_path, cmd, env, port=port, workers=4, swmp_run=False) as srv:
            results = load(port, ["/cpu", "/io"], 400, concurrency=8)
            assert all(r.status == 200 for r in results)
            wait_segments(col, 400, "u")
            quiet_for(col, 0.5)
            segs = segments_of(col, "u")
            assert len(segs) == 400
            assert len({s["traceSegmentId"] for s in segs}) == 400
            assert {s["serviceInstance"] for s in segs} <= {f"u-w{i}" for i in range(4)}
            check_announced(col, srv, "u")
            reporters = srv.reporters()
            assert len(reporters) == 1
            assert srv.reporter_lock_holder() == reporters[0].pid
            if lazy_apps:
                assert reporters[0].ppid() not in srv.worker_pids()  # detached from its worker
        wait_until(lambda: not srv.reporters(), 20, "the reporter to leave with the master")
        wait_until(lambda: not srv.arena_files(), 20, "the arena to be removed")


@pytest.mark.parametrize(
    ("how", "lazy_apps"),
    [
        pytest.param("hup", False, id="hup"),
        pytest.param("touch", False, id="touch-reload"),
        pytest.param("term", False, id="term-brutal-reload"),
        pytest.param("hup", True, id="hup-lazy-apps"),
    ],
)
def test_reload_keeps_exactly_one_reporter(tmp_path: Path, how: str, lazy_apps: bool) -> None:
    """uWSGI re-execs its master (same pid) and re-imports the app on reload: the agent must
    attach to the running reporter, not start another."""
    with collector_process(tmp_path) as col:
        port = free_port()
        touch = tmp_path / "reload.txt"
        touch.write_text("0")
        env = agent_env(tmp_path, col.grpc_address, service="r")
        extra = ["--touch-reload", str(touch)]
        if lazy_apps:
            cmd = uwsgi_command(
                port, module="examples.started_app:app", workers=3, lazy_apps=True, extra=extra
            )
        else:
            cmd = uwsgi_command(port, workers=3, extra=extra)
        with run_server("uwsgi", tmp_path, cmd, env, port=port, workers=3, swmp_run=not lazy_apps) as srv:
            first = load(port, ["/cpu"], 90, concurrency=3)
            # A client has its answer before the worker's WSGI close() ends the span and writes
            # the segment; a brutal reload (SIGTERM) kills the workers at once and can take the
            # last one with it (seen: 179 of 180). So the reload comes once they are written.
            wait_segments(col, 90, "r")
            reporter = [p.pid for p in srv.reporters()]
            assert len(reporter) == 1
            old = set(srv.worker_pids())
            if how == "touch":
                touch.write_text("1")
                import os

                os.utime(touch, (touch.stat().st_atime + 5, touch.stat().st_mtime + 5))
            else:
                srv.proc.send(signal.SIGHUP if how == "hup" else signal.SIGTERM)
            srv.proc.wait_log(r"(?:spawned|Respawned) uWSGI worker \d+", count=6, timeout=60)
            wait_until(lambda: not old & set(srv.worker_pids()), 30, "the old workers to leave")
            srv.wait_workers_claimed()
            second = load(port, ["/cpu"], 90, concurrency=3)
            assert all(r.status == 200 for r in first + second)
            assert {r.worker_pid for r in second}.isdisjoint(old)
            wait_segments(col, 180, "r")
            quiet_for(col, 0.5)
            assert len(segments_of(col, "r")) == 180
            assert [p.pid for p in srv.reporters()] == reporter
            assert srv.reporter_lock_holder() == reporter[0]
            assert srv.pid == srv.proc.pid  # same master pid after the re-exec
            check_announced(col, srv, "r")
        wait_until(lambda: not srv.reporters(), 20, "the reporter to leave with the master")
