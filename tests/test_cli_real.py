"""``swmp health`` / ``swmp status`` against the real pieces: the reporter process
(``python -m reporter_proc``) sending over gRPC to the in-test collector, and Gunicorn
started with ``swmp run`` (the agent creates the arena and forks the reporter itself)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest

import ipc
from reporter_proc.process import settings_to_json
from reporter_proc.settings import ReporterSettings
from swmp.ops.schema import HEALTH_SCHEMA, STATUS_SCHEMA
from tests import test_cli_support as support
from tests.collector import Collector, CollectorProcess

HEALTH = jsonschema.Draft202012Validator(HEALTH_SCHEMA)
STATUS = jsonschema.Draft202012Validator(STATUS_SCHEMA)


S = support  # the helpers, under the short name these tests use


def published(arena: ipc.Arena) -> dict[str, Any]:
    raw = arena.status.snapshot().document
    return orjson.loads(raw) if raw else {}


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def test_real_reporter_through_a_backend_outage(tmp_path: Path, procs: Any) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    collector = Collector().start()
    arena = S.make_arena(shm, meta={"service": "real"})
    settings = ReporterSettings(
        service="real",
        protocol="grpc",
        backends=(collector.grpc_address,),
        flush_interval_s=0.02,
        poll_interval_s=0.02,
        status_interval_s=0.05,
        keepalive_interval_s=0.2,
        retry_backoff_base_s=0.01,
        retry_backoff_max_s=0.05,
        send_timeout_s=1.0,
    )
    reporter = subprocess.Popen(
        [sys.executable, "-m", "reporter_proc", "--arena", arena.path, "--owner-pid", str(os.getpid()),
         "--settings", settings_to_json(settings), "--no-supervise", "--log-level", "ERROR"],
        cwd=S.REPO, env=S.env(),
    )  # fmt: skip
    try:
        S.wait_for(lambda: arena.reporter_pid() == reporter.pid, 30, "the reporter to take the arena")
        procs.writer(arena, count=5, rate=20, valid=True)
        S.wait_for(lambda: published(arena).get("backend", {}).get("state") == "ok", what="a delivery")

        rc, doc = S.cli_json("health", "--dir", str(shm), "--interval", "0.3")
        HEALTH.validate(doc)
        assert rc == 0, doc
        checks = {c["name"]: c for c in doc["agents"][0]["checks"]}
        assert checks["reporter"]["figures"]["pid"] == reporter.pid
        assert checks["backend"]["figures"]["address"] == collector.grpc_address

        collector.stop()  # the backend goes away; the writer keeps producing
        S.wait_for(
            lambda: published(arena).get("backend", {}).get("consecutive_failures", 0) >= 3,
            30,
            "the reporter to notice the outage",
        )
        ready = S.cli("health", "--dir", str(shm), "--readiness", "--interval", "0.3")
        assert ready.returncode == 1, ready.stdout
        fails = [ln for ln in ready.stdout.splitlines() if "FAIL" in ln]
        assert len(fails) == 1 and fails[0].startswith(f"  FAIL backend: {collector.grpc_address}: failing, ")
        live = S.cli("health", "--dir", str(shm), "--liveness", "--interval", "0.3")
        assert live.returncode == 0, live.stdout

        kill(reporter.pid)
        reporter.wait(timeout=30)
        dead = S.cli("health", "--dir", str(shm), "--liveness", "--interval", "0.3")
        assert dead.returncode == 1
        assert f"  FAIL reporter: no live reporter process (the last one, pid {reporter.pid}, is gone)" in (
            dead.stdout.splitlines()
        )
    finally:
        kill(reporter.pid)
        reporter.wait(timeout=30)
        collector.stop()
        arena.unlink()
        arena.close()


def stop_server(server: subprocess.Popen[bytes]) -> None:
    """TERM, then KILL if it does not go within 30 s."""
    kill(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        kill(server.pid)
        server.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


APP = """
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]
"""


@pytest.mark.servers
def test_gunicorn_with_the_agent(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    (tmp_path / "app.py").write_text(APP)
    secret = "gunicorn-s3cret-token"
    port = _free_port()
    with CollectorProcess(str(tmp_path)) as collector:
        env = S.env(
            SW_AGENT_ARENA_DIR=str(shm),
            SW_AGENT_NAME="gunicorn-app",
            SW_AGENT_COLLECTOR_BACKEND_SERVICES=collector.grpc_address,
            SW_AGENT_AUTHENTICATION=secret,
        )
        server = subprocess.Popen(
            [sys.executable, "-m", "swmp.cli", "run", "--", "gunicorn", "-w", "2", "-b", f"127.0.0.1:{port}",
             "--control-socket", str(tmp_path / "gunicorn.ctl"), "app:app"],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        arena: ipc.Arena | None = None
        others: list[int] = []
        try:
            path = S.wait_for(lambda: next(iter(ipc.discover(str(shm))), None), 60, "the agent's arena")
            arena = ipc.Arena.open(path)
            a = arena
            S.wait_for(lambda: len(a.live_slots()) == 2, 60, "two workers to claim slots")
            S.wait_for(
                lambda: (
                    published(a).get("backend", {}).get("state") == "ok"
                    and len(published(a).get("instances", {})) == 2
                ),
                60,
                "the reporter to register both workers",
            )
            others = [*a.live_slots().values(), a.reporter_pid() or 0]

            proc = S.cli("health", "--dir", str(shm), "--interval", "0.3")
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert proc.stdout.startswith(f"healthy (all): service gunicorn-app, pid {server.pid}")

            rc, doc = S.cli_json("status", "--dir", str(shm), "--interval", "0.3")
            STATUS.validate(doc)
            assert rc == 0
            (agent,) = doc["agents"]
            assert agent["owner_pid"] == server.pid and agent["mode"] == "process"
            assert agent["authentication"] == "****"
            assert agent["reporter"]["alive"] and agent["reporter"]["pid"] == a.reporter_pid()
            assert sorted(s["pid"] for s in agent["slots"]) == sorted(a.live_slots().values())
            assert all(s["instance"] for s in agent["slots"])  # named by the reporter
            worker = agent["slots"][0]["pid"]
            rc, doc = S.cli_json("health", "--dir", str(shm), "--pid", str(worker), "--interval", "0")
            assert rc == 0 and doc["agents"][0]["owner_pid"] == server.pid

            text = S.cli("status", "--dir", str(shm), "--interval", "0")
            everything = json.dumps(doc) + text.stdout + text.stderr + proc.stdout + proc.stderr
            assert secret not in everything
        finally:
            stop_server(server)
            for pid in others:  # workers and reporter follow the master; make sure of it
                if pid:
                    kill(pid)
            if arena is not None:
                arena.close()


@pytest.mark.servers
def test_gunicorn_in_thread_mode_is_healthy(tmp_path: Path) -> None:
    """With the reporter on a thread of each worker, the application's shared arena only names
    the processes: no reporter ever holds it, and a probe must not count it as an agent."""
    shm = tmp_path / "shm"
    shm.mkdir()
    (tmp_path / "app.py").write_text(APP)
    port = _free_port()
    with CollectorProcess(str(tmp_path)) as collector:
        env = S.env(
            SW_AGENT_ARENA_DIR=str(shm),
            SW_AGENT_NAME="threaded-app",
            SW_AGENT_REPORTER_PROCESS="false",
            SW_AGENT_COLLECTOR_BACKEND_SERVICES=collector.grpc_address,
        )
        server = subprocess.Popen(
            [sys.executable, "-m", "swmp.cli", "run", "--", "gunicorn", "-w", "2", "-b", f"127.0.0.1:{port}",
             "--control-socket", str(tmp_path / "gunicorn.ctl"), "app:app"],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:

            def reporting_workers() -> list[ipc.Arena] | None:
                arenas = []
                for path in ipc.discover(str(shm)):
                    try:
                        arenas.append(ipc.Arena.open(path, wait_s=0))
                    except (OSError, ipc.ArenaError):
                        continue
                live = [a for a in arenas if a.reporter_pid() is not None and published(a)]
                for a in arenas:
                    a.close()
                return live if len(live) == 2 else None

            S.wait_for(reporting_workers, 60, "both workers' reporter threads to publish their status")
            proc = S.cli("health", "--dir", str(shm), "--liveness", "--interval", "0.3")
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert "UNHEALTHY" not in proc.stdout, proc.stdout
            rc, doc = S.cli_json("status", "--dir", str(shm), "--interval", "0")
            STATUS.validate(doc)
            assert rc == 0 and sorted(a["mode"] for a in doc["agents"]) == ["thread", "thread"], doc
        finally:
            stop_server(server)
