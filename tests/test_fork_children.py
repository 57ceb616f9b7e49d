"""Helpers forked by a worker stay inert, in both reporter modes, under real Gunicorn and uWSGI.

A helper is a process that a server worker forks from its request code: ``os.fork``, a
``multiprocessing`` fork pool, ``subprocess`` with ``preexec_fn``. It must claim no ring
slot, never appear as an instance, and in thread mode start no reporter thread, open no
gRPC channel (the worker's live one is inherited: touching it crashed or hung children)
and leave no private arena behind. The reporter is the real one, with the real gRPC
sender, against the in-test collector; the app is tests/e2e_apps/fork_app.py.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from ipc import Arena
from tests.collector import free_port
from tests.servers import (
    agent_env,
    announced,
    collector_process,
    gunicorn_command,
    request,
    run_server,
    segments_of,
    uwsgi_command,
    wait_segments,
    wait_until,
)

pytestmark = [pytest.mark.servers, pytest.mark.timeout(240)]

WORKERS = 2
ROUTES = {"/fork": 3, "/pool": 2, "/preexec": 5}


def _arena_files(directory: Path) -> list[str]:
    """Arena and doorbell files in ``directory`` and in the private per-user directories in it."""
    found = [p for p in directory.glob("*") if p.name.endswith((".arena", ".wake"))]
    found += [p for p in directory.glob("*/*") if p.name.endswith((".arena", ".wake"))]
    return sorted(p.name for p in found)


@pytest.mark.parametrize("server_kind", ["gunicorn", "uwsgi"])
@pytest.mark.parametrize("reporter_process", [True, False], ids=["process", "thread"])
def test_helpers_forked_by_workers_stay_inert(
    tmp_path: Path, reporter_process: bool, server_kind: str
) -> None:
    with collector_process(tmp_path) as col:
        port = free_port()
        # One spare slot: a helper that claimed slots would find it free.
        env = agent_env(
            tmp_path,
            col.grpc_address,
            service="forks",
            reporter_process=reporter_process,
            extra={"SW_AGENT_ARENA_SLOTS": str(WORKERS + 1)},
        )
        app = "tests.e2e_apps.fork_app:app"
        if server_kind == "gunicorn":
            cmd = gunicorn_command(port, app=app, workers=WORKERS, worker_class="gthread", threads=2)
        else:
            cmd = uwsgi_command(port, module=app, workers=WORKERS, threads=2)
        with run_server(server_kind, tmp_path, cmd, env, port=port, workers=WORKERS) as server:
            workers = set(server.worker_pids())
            helpers: set[int] = set()
            answered = 0
            for route, times in ROUTES.items():
                for _ in range(times):
                    res = request(port, route, timeout=90)
                    assert res.status == 200, (route, res.status, res.body)
                    body = orjson.loads(res.body)
                    assert body["worker"] in workers
                    # No helper was killed by a signal (SIGSEGV, SIGABRT...). Pool children
                    # exit 1 under Gunicorn with or without the agent; the others exit 0.
                    ok = (0, 1) if route == "/pool" else (0,)
                    assert body["ended"] and all(code in ok for code in body["ended"]), (route, body)
                    helpers.update(body["children"])
                    answered += 1
            assert helpers and not helpers & workers

            # The workers still report: one entry segment per request.
            wait_segments(col, answered, service="forks")
            operations = [span["operationName"] for seg in segments_of(col, "forks") for span in seg["spans"]]
            assert not [op for op in operations if op.startswith("/helper/")]

            # Only the workers were announced as instances, never a helper.
            def announced_pids() -> set[int]:
                return {int(p["Process No."]) for reports in announced(col).values() for p in reports}

            wait_until(lambda: workers <= announced_pids(), 30, "every worker announced")
            assert announced_pids() == workers
            assert set(server.live_slots().values()) <= workers

            arena_dir = Path(env["SW_AGENT_ARENA_DIR"])
            with Arena.open(str(server.arena_path()), wait_s=0) as arena:
                # The spare slot was never claimed by anyone.
                assert [arena.slot_identity(s)[1] for s in range(arena.slots)].count(0) >= 1
                lost = arena.lost_counts()
                assert lost.no_slot_records == 0 and lost.no_slot_workers == 0
                if reporter_process:
                    # The forked children left through the exit hooks: each counted its span.
                    assert lost.helper_records >= ROUTES["/fork"]
            if not reporter_process:
                # One private arena per worker, none per helper (preexec_fn used to leak one).
                private = [n for n in _arena_files(arena_dir) if n.endswith(".arena") and "-t" in n]
                assert len(private) == WORKERS, _arena_files(arena_dir)
        if server_kind == "gunicorn":
            # Stopped: nothing left behind. (uWSGI's SIGINT kills its workers without their
            # exit hooks; a later start removes what they left: not this test's subject.)
            wait_until(lambda: not _arena_files(arena_dir), 30, "no arena file left")
