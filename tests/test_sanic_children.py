"""The children of a Sanic worker, under ``swmp run``: one arena and one reporter still.

Sanic sets ``SANIC_WORKER_NAME`` in the environment its workers are started with, so every
interpreter a worker starts inherits it. A multiprocessing spawn child of the worker used to
take the worker for its Sanic main process: an arena named after the worker's pid and a second
reporter, detached, for the same application; a Python subprocess of the worker did the same.
Real Sanic (one worker), the real reporter, the in-test collector.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

import ipc
from tests.collector import free_port
from tests.servers import agent_env, belongs, collector_process, is_swmp, request, segments_of, wait_until
from tests.web_checks import running, spans_where

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]

APP = "tests.e2e_apps.async_web"
SERVICE = "sanic-kids"


def _reporters(arena_dir: Path) -> list[int]:
    out = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if is_swmp(p, "swmp-reporter") and p.status() != "zombie" and belongs(p, str(arena_dir)):
                out.append(p.pid)
    return out


def test_children_of_a_sanic_worker_join_its_application(tmp_path: Path) -> None:
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(tmp_path / "sanic", col.grpc_address, service=SERVICE, extra={"SWMP_TEST_SANIC": "1"})
        arena_dir = Path(env["SW_AGENT_ARENA_DIR"])
        argv = [sys.executable, "-m", "sanic", f"{APP}:sanic_app", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--workers", "1", "--no-motd"]
        with running(tmp_path, "sanic", argv, env, port) as proc:
            arena_path = ipc.arena_path(proc.pid, str(arena_dir))  # swmp run execs: the main's pid
            worker = request(port, "/users/1").worker_pid
            with ipc.Arena.open(arena_path, wait_s=0) as arena:
                wait_until(lambda: worker in arena.live_slots().values(), 30, "the worker holding a slot")
                worker_slot = next(s for s, pid in arena.live_slots().items() if pid == worker)
            wait_until(lambda: len(_reporters(arena_dir)) == 1, 30, "the main process's reporter")
            reporter = _reporters(arena_dir)

            res = request(port, "/children?op=spawned-op", timeout=90)
            assert res.status == 200, res
            spawned, sub_pid, sub_owner = (int(x) for x in res.body.split())

            # The subprocess is an application of its own (its own pid owns it), not the worker's.
            assert sub_owner == sub_pid != worker

            # The spawn child joined the main process's arena with a slot of its own.
            def child_span() -> list[dict[str, Any]]:
                return spans_where(segments_of(col, SERVICE), operationName="spawned-op")

            wait_until(lambda: bool(child_span()), 30, "the spawn child's span")
            (span,) = child_span()
            instance = span["_segment"]["serviceInstance"]
            assert instance.startswith(f"{SERVICE}-w") and instance != f"{SERVICE}-w{worker_slot}"
            # One arena and one reporter once the children are gone (the subprocess's own
            # reporter drains and leaves with it, removing its arena).
            wait_until(lambda: _arena_names(arena_dir) == [Path(arena_path).name], 30, "one arena")
            wait_until(lambda: _reporters(arena_dir) == reporter, 30, "one reporter")
            assert spawned != worker


def _arena_names(arena_dir: Path) -> list[str]:
    return sorted(p.name for p in arena_dir.glob("*/*.arena"))
