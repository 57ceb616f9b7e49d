"""Forks of the Gunicorn master that are not workers stay helpers, in both reporter modes.

Only ``Arbiter.spawn_worker``'s fork is a worker. A master hook running ``subprocess`` with
``preexec_fn`` (the child runs Python's at-fork hooks, then execs) and USR2's re-exec (fork,
then exec a new master) used to be bound as workers: a slot claimed, an instance announced
(``-wN`` with the helper's pid) and, in thread mode, a reporter thread started between fork
and exec whose private arena was never removed. Real Gunicorn under ``swmp run``, the real
reporter, the in-test collector.
"""

from __future__ import annotations

import contextlib
import re
import signal
import textwrap
from pathlib import Path

import psutil
import pytest

from ipc import Arena
from tests.collector import free_port
from tests.servers import (
    Server,
    agent_env,
    announced,
    check_announced,
    collector_process,
    gunicorn_command,
    run_server,
    wait_until,
)

pytestmark = [pytest.mark.servers, pytest.mark.timeout(180)]

WORKERS = 2
SERVICE = "mf"

# The program is run with -S: under swmp run it would otherwise start an agent of its own (an
# application of its own, not this test's subject).
CONFIG = textwrap.dedent(
    """
    import os, subprocess, sys

    def when_ready(server):
        # Any preexec_fn makes subprocess run Python's at-fork hooks in the child before exec.
        proc = subprocess.Popen([sys.executable, "-S", "-c", "pass"], preexec_fn=os.getpid)
        proc.wait()
        with open(OUT + ".tmp", "w") as f:
            f.write(str(proc.pid))
        os.rename(OUT + ".tmp", OUT)
    """
)


def _claims(server: Server) -> tuple[int, set[int]]:
    """Slot claims made in the master's arena so far, and the last claimer of each slot."""
    with Arena.open(str(server.arena_path()), wait_s=0) as arena:
        ids = [arena.slot_identity(s) for s in range(arena.slots)]
    return sum(claims for _, claims, _ in ids), {pid for pid, claims, _ in ids if claims}


def _masters(server: Server) -> list[int]:
    """The pids that logged a Gunicorn start, first to last (USR2 adds the new master)."""
    pids = [int(p) for p in re.findall(r"\[(\d+)\] \[INFO\] Starting gunicorn", server.proc.log())]
    return list(dict.fromkeys(pids))


def _arena_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*/*") if p.name.endswith((".arena", ".wake")))


def _private_arenas_of(directory: Path, pid: int) -> list[str]:
    return [n for n in _arena_files(directory) if re.search(rf"-{pid}-t[0-9a-f]+\.arena$", n)]


@pytest.mark.parametrize("reporter_process", [True, False], ids=["process", "thread"])
def test_master_forks_that_are_not_workers_stay_helpers(tmp_path: Path, reporter_process: bool) -> None:
    hook_out = tmp_path / "hook-child.pid"
    config = tmp_path / "gunicorn_conf.py"
    config.write_text(f"OUT = {str(hook_out)!r}\n{CONFIG}")
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(
            tmp_path,
            col.grpc_address,
            service=SERVICE,
            reporter_process=reporter_process,
            extra={"SW_AGENT_ARENA_SLOTS": str(WORKERS + 1)},  # a spare slot a helper would take
        )
        arena_dir = Path(env["SW_AGENT_ARENA_DIR"])
        cmd = gunicorn_command(port, workers=WORKERS, config=str(config))
        new_master: psutil.Process | None = None
        with run_server("gunicorn", tmp_path, cmd, env, port=port, workers=WORKERS) as srv:
            try:
                wait_until(hook_out.exists, 30, "the when_ready hook's child")
                hook_child = int(hook_out.read_text())
                workers = set(srv.worker_pids())
                assert hook_child not in workers
                if reporter_process:  # instances: process mode; the slot claims: both modes
                    check_announced(col, srv, SERVICE)
                # Each worker claimed once; the hook's child claimed nothing, started nothing.
                assert _claims(srv) == (WORKERS, workers)
                assert not _private_arenas_of(arena_dir, hook_child)

                # USR2: the master forks a child that execs a new master (its own application).
                srv.proc.send(signal.SIGUSR2)
                srv.proc.wait_log(r"Booting worker with pid", count=2 * WORKERS)
                wait_until(lambda: len(_masters(srv)) == 2, 30, "the new master")
                new_master = psutil.Process(_masters(srv)[-1])
                assert new_master.ppid() == srv.pid
                assert _claims(srv) == (WORKERS, workers)
                assert not _private_arenas_of(arena_dir, new_master.pid)
                if reporter_process:
                    pids = {int(p["Process No."]) for reports in announced(col).values() for p in reports}
                    assert not pids & {hook_child, new_master.pid}, pids
            finally:
                if new_master is not None:
                    with contextlib.suppress(psutil.Error):
                        new_master.terminate()
                        new_master.wait(30)
        # Both masters gone: their reporters drained and removed their arenas, and no
        # helper left a private arena behind.
        wait_until(lambda: not _arena_files(arena_dir), 30, "no arena file left")
