"""Python forks of the uWSGI master are helpers, not workers, in both reporter modes.

uWSGI forks its workers in C; the agent learns of each from uWSGI's post-fork hook (and, with
``--py-call-osafterfork`` or ``--py-call-uwsgi-fork-hooks``, from Python's at-fork hooks run
by uWSGI, in C). A Python fork in the master (``os.fork``, ``subprocess`` with ``preexec_fn``,
a ``multiprocessing`` fork, here while the master imports the application) runs Python's
at-fork hooks too, and used to be bound as a worker: a slot claimed, an instance announced
(``-wN`` with the child's pid) and what it recorded reported. Real uWSGI under ``swmp run``,
the real reporter, the in-test collector; the app is tests/e2e_apps/master_fork_app.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ipc import Arena
from tests.collector import free_port
from tests.servers import (
    OSAFTERFORK_ABORTS,
    Server,
    agent_env,
    announced,
    check_announced,
    collector_process,
    request,
    run_server,
    segments_of,
    uwsgi_command,
    wait_segments,
    wait_until,
)

pytestmark = [pytest.mark.servers, pytest.mark.timeout(180)]

WORKERS = 2
SERVICE = "umf"
REQUESTS = 6


def _claims(server: Server) -> tuple[int, set[int]]:
    """Slot claims made in the master's arena so far, and the last claimer of each slot."""
    with Arena.open(str(server.arena_path()), wait_s=0) as arena:
        ids = [arena.slot_identity(s) for s in range(arena.slots)]
    return sum(claims for _, claims, _ in ids), {pid for pid, claims, _ in ids if claims}


@pytest.mark.parametrize(
    ("reporter_process", "fork_hooks"),
    [
        # swmp run's default, --py-call-uwsgi-fork-hooks: Python's at-fork hooks run around
        # uWSGI's fork, before it numbers the worker.
        pytest.param(True, "", id="process-uwsgi-fork-hooks"),
        pytest.param(False, "", id="thread-uwsgi-fork-hooks"),
        pytest.param(True, "--py-call-osafterfork", id="process-osafterfork", marks=OSAFTERFORK_ABORTS),
    ],
)
def test_master_python_forks_stay_helpers(tmp_path: Path, reporter_process: bool, fork_hooks: str) -> None:
    out = tmp_path / "master-forks.json"
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(
            tmp_path,
            col.grpc_address,
            service=SERVICE,
            reporter_process=reporter_process,
            extra={"SW_AGENT_ARENA_SLOTS": str(WORKERS + 2), "MASTER_FORKS_OUT": str(out)},
        )
        cmd = uwsgi_command(
            port,
            module="tests.e2e_apps.master_fork_app:app",
            workers=WORKERS,
            extra=[fork_hooks] if fork_hooks else [],
        )
        with run_server("uwsgi", tmp_path, cmd, env, port=port, workers=WORKERS) as srv:
            forks = json.loads(out.read_text())  # written by the master before its workers
            children = {forks["fork"][0], forks["preexec"][0]}
            assert forks["fork"][1] == 0 and forks["preexec"][1] == 0, forks
            workers = set(srv.worker_pids())
            assert len(workers) == WORKERS and not children & workers
            # Each worker claimed once; the master's Python children claimed nothing.
            assert _claims(srv) == (WORKERS, workers)

            # The real workers report: one segment per request, from their own instances.
            for _ in range(REQUESTS):
                res = request(port, "/pid")
                assert res.status == 200 and json.loads(res.body)["worker"] in workers, res
            segments = wait_segments(col, REQUESTS, service=SERVICE)
            assert len(segments) >= REQUESTS
            operations = [span["operationName"] for seg in segments_of(col, SERVICE) for span in seg["spans"]]
            assert not [op for op in operations if op.startswith("/helper/")], operations
            assert {s["serviceInstance"] for s in segments} <= {f"{SERVICE}-w{i}" for i in range(WORKERS)}

            if reporter_process:
                check_announced(col, srv, SERVICE)
                pids = {int(p["Process No."]) for reports in announced(col).values() for p in reports}
                wait_until(lambda: workers <= pids, 10, "every worker announced")
                assert not pids & children, (pids, children)
                with Arena.open(str(srv.arena_path()), wait_s=0) as arena:
                    lost = arena.lost_counts()
                    # The forked child left through the exit hooks: it counted its span.
                    assert lost.helper_records >= 1
                    assert lost.no_slot_records == 0 and lost.no_slot_workers == 0
