"""A stop signal sent to the whole process group (systemd's KillMode=control-group, Ctrl-C).

The master, every worker, the supervisor and the reporter get the signal at the same moment.
Workers then finish (SIGTERM) or abandon (SIGINT) their in-flight requests, and the reporter
must keep draining until they have exited: every request the server answered is delivered,
and the arena is removed once the master is gone. Real Gunicorn (sync workers), the real
reporter process and the test collector.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid
from pathlib import Path

import psutil
import pytest

from tests.collector import CollectorProcess, free_port
from tests.servers import (
    Result,
    Server,
    agent_env,
    collector_process,
    gunicorn_command,
    request,
    run_server,
    segments_of,
    wait_until,
)

pytestmark = [pytest.mark.servers, pytest.mark.timeout(180)]

WORKERS = 2


def _serving(server: Server, port: int) -> int:
    """How many workers hold an accepted connection on ``port`` (a request in their hands)."""
    busy = 0
    for pid in server.worker_pids():
        try:
            conns = psutil.Process(pid).connections(kind="tcp")
        except psutil.Error:
            continue
        if any(c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port for c in conns):
            busy += 1
    return busy


def _group_stop(tmp_path: Path, col: CollectorProcess, sig: int) -> tuple[list[Result], list[Result], Server]:
    """Quick requests, then one slow request per worker; ``sig`` to the group while they run."""
    port = free_port()
    env = agent_env(
        tmp_path, col.grpc_address, service="grp", extra={"SW_AGENT_REPORTER_SHUTDOWN_TIMEOUT": "20"}
    )
    cmd = gunicorn_command(port, workers=WORKERS)
    with run_server("gunicorn", tmp_path, cmd, env, port=port, workers=WORKERS) as server:
        server.wait_reporter()
        quick = [request(port, "/io", trace_id=f"quick-{uuid.uuid4().hex}") for _ in range(5)]
        assert all(r.status == 200 for r in quick), quick
        slow: list[Result] = []
        lock = threading.Lock()

        def one(trace_id: str) -> None:
            r = request(port, "/sleep?s=1.5", trace_id=trace_id)
            with lock:
                slow.append(r)

        threads = [threading.Thread(target=one, args=(f"slow-{uuid.uuid4().hex}",)) for _ in range(WORKERS)]
        for t in threads:
            t.start()
        wait_until(lambda: _serving(server, port) >= WORKERS, 30, "every worker serving a slow request")
        os.killpg(server.pid, sig)
        for t in threads:
            t.join(60)
        assert server.proc.wait_exit(60) is not None, server.proc.tail()
        # Every process of the application, the reporter included, leaves by itself.
        wait_until(lambda: not server.proc.family(), 60, "every process of the application gone")
        return quick, slow, server


def _delivered(col: CollectorProcess) -> set[str]:
    return {s["traceId"] for s in segments_of(col, "grp")}


def test_sigterm_to_the_group_delivers_in_flight_requests(tmp_path: Path) -> None:
    with collector_process(tmp_path) as col:
        quick, slow, server = _group_stop(tmp_path, col, signal.SIGTERM)
        # A graceful stop lets sync workers finish the request in their hands.
        assert [r.status for r in slow] == [200] * WORKERS, slow
        answered = {r.trace_id for r in [*quick, *slow] if r.status == 200}
        missing = answered - _delivered(col)
        assert not missing, f"answered but not delivered: {sorted(missing)}\n{server.proc.tail()}"
        assert not server.arena_files(), server.arena_files()


def test_ctrl_c_to_the_group_delivers_what_was_answered(tmp_path: Path) -> None:
    with collector_process(tmp_path) as col:
        quick, slow, server = _group_stop(tmp_path, col, signal.SIGINT)
        # Gunicorn's quick shutdown abandons requests in progress; whatever was answered
        # (at least the quick ones) must arrive.
        answered = {r.trace_id for r in [*quick, *slow] if r.status == 200}
        assert len(answered) >= len(quick)
        missing = answered - _delivered(col)
        assert not missing, f"answered but not delivered: {sorted(missing)}\n{server.proc.tail()}"
        assert not server.arena_files(), server.arena_files()
