"""A killed supervisor is replaced by its reporter, and ``swmp health`` flags the gap.

Without a supervisor nobody restarts the next reporter that dies. The reporter watches its
supervisor and starts a replacement (``python -m reporter_proc --adopt PID``) that adopts
it; the replacement then restarts the reporter when it is killed. Real processes: an owner
subprocess with the memory sender, and real Gunicorn with the test collector. To see the
gap before the recovery (which takes well under a second), the reporter is paused with
SIGSTOP while its supervisor is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from reporter_proc import records as R
from tests.collector import free_port
from tests.servers import agent_env, collector_process, gunicorn_command, request, run_server, segments_of
from tests.servers import wait_until as wait_servers
from tests.test_cli_support import cli
from tests.test_reporter_helpers import Owner, pid_alive, segment, status_doc, trace_ids, wait_for, write_all
from tests.test_reporter_process import settings_json


def supervisor_check(*where: str) -> dict[str, Any]:
    proc = cli("health", *where, "--interval", "0", "--json")
    checks = {c["name"]: c for c in json.loads(proc.stdout)["agents"][0]["checks"]}
    return checks["supervisor"]  # type: ignore[no-any-return]


def supervisor_of(doc: dict[str, Any]) -> int:
    return int(doc.get("supervisor", {}).get("pid", 0))


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGKILL)


def test_reporter_replaces_a_killed_supervisor_which_then_restarts_the_reporter(tmp_path: Path) -> None:
    o = Owner(str(tmp_path), settings_json(str(tmp_path)))
    replacement = 0
    try:
        rep = o.reporter_pid()
        sup = o.spawned[0]
        assert supervisor_of(status_doc(o.arena)) == sup
        assert supervisor_check("--arena", o.arena_path)["status"] == "ok"

        os.kill(rep, signal.SIGSTOP)  # it cannot react: the gap stays visible
        os.kill(sup, signal.SIGKILL)
        wait_for(lambda: not pid_alive(sup), 10, "the supervisor gone")
        gap = supervisor_check("--arena", o.arena_path)
        assert gap["status"] == "fail" and f"supervisor pid {sup} is gone" in gap["message"], gap
        os.kill(rep, signal.SIGCONT)

        def replaced() -> int:
            doc = status_doc(o.arena)
            return supervisor_of(doc) if doc.get("supervisor", {}).get("replaced") == 1 else 0

        replacement = int(wait_for(replaced, 20, "a replacement supervisor"))
        assert pid_alive(replacement)
        healed = supervisor_check("--arena", o.arena_path)
        assert healed["status"] == "ok" and healed["figures"]["replaced"] == 1, healed

        # The replacement restarts the next reporter that dies, and nothing is lost.
        write_all(o.arena_path, [(R.SEGMENT, segment(f"a-{i}")) for i in range(30)])
        os.kill(rep, signal.SIGKILL)
        second = o.reporter_pid(not_pid=rep)
        assert supervisor_of(status_doc(o.arena)) == replacement
        write_all(o.arena_path, [(R.SEGMENT, segment(f"b-{i}")) for i in range(30)])
        path = str(tmp_path / "delivered.jsonl")
        wait_for(lambda: len(set(trace_ids(path))) >= 60, 20, "delivery after the restart")
        assert set(trace_ids(path)) == {f"{t}-{i}" for t in "ab" for i in range(30)}
        assert second != rep
    finally:
        if replacement:
            _kill(replacement)
        o.cleanup()


@pytest.mark.servers
@pytest.mark.timeout(180)
def test_gunicorn_keeps_reporting_after_supervisor_and_reporter_are_killed(tmp_path: Path) -> None:
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(tmp_path, col.grpc_address, service="sup")
        cmd = gunicorn_command(port, workers=2)
        with run_server("gunicorn", tmp_path, cmd, env, port=port, workers=2) as server:
            server.wait_reporter()
            where = ("--dir", str(server.arena_dir))
            (sup,) = server.named_processes("swmp-supervisor")
            (rep,) = server.reporters()
            wait_servers(lambda: supervisor_check(*where)["status"] == "ok", 30, "supervisor check ok")

            rep.suspend()
            sup.kill()
            wait_servers(lambda: not pid_alive(sup.pid), 10, "the supervisor gone")
            gap = supervisor_check(*where)
            assert gap["status"] == "fail" and f"supervisor pid {sup.pid} is gone" in gap["message"], gap
            rep.resume()
            wait_servers(lambda: supervisor_check(*where)["status"] == "ok", 30, "a replacement supervisor")

            rep.kill()
            wait_servers(
                lambda: [p.pid for p in server.reporters()] not in ([], [rep.pid]), 30, "a new reporter"
            )
            ids = [f"after-{uuid.uuid4().hex}" for _ in range(10)]
            assert all(request(port, "/io", trace_id=t).status == 200 for t in ids)
            wait_servers(lambda: set(ids) <= {s["traceId"] for s in segments_of(col, "sup")}, 30, "delivery")
