"""Run Celery workers and beat (with the agent, under ``swmp run``) for tests.

The application is ``examples/celery_app.py``; the broker and the queue come from the
environment (``CELERY_BROKER_URL``, ``CELERY_QUEUE``: a fresh queue per test, since the
brokers are shared by the session). Processes are started and stopped like the servers of
``tests/servers.py`` (by pid, strays found by the test's arena directory), and a worker is
a :class:`~tests.servers.Server` whose "workers" are the pool children.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.servers import SWMP_RUN, Proc, Server, agent_env, wait_until

CELERY = [sys.executable, "-m", "celery", "-A", "examples.celery_app"]
REPO_ROOT = Path(__file__).resolve().parent.parent
_SUCCEEDED = re.compile(r"Task [\w.]+\[([0-9a-f-]+)\] succeeded")
_RECEIVED = re.compile(r"Task [\w.]+\[([0-9a-f-]+)\] received")


def celery_env(
    workdir: Path,
    backend: str,
    broker: str,
    queue: str,
    *,
    service: str = "cel",
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    return agent_env(
        workdir,
        backend,
        service=service,
        extra={"CELERY_BROKER_URL": broker, "CELERY_QUEUE": queue, **(extra or {})},
    )


def new_queue() -> str:
    return f"swmp-{uuid.uuid4().hex[:10]}"


def worker_command(
    pool: str = "prefork", concurrency: int = 4, extra: Sequence[str] = (), *, app: str = ""
) -> list[str]:
    """A worker of ``examples.celery_app`` (or of ``app``)."""
    return [
        *(CELERY if not app else [*CELERY[:-1], app]),
        "worker",
        "--pool",
        pool,
        "-c",
        str(concurrency),
        "-n",
        f"w{uuid.uuid4().hex[:6]}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-l",
        "info",
        *extra,
    ]


@contextlib.contextmanager
def run_celery(
    workdir: Path,
    env: dict[str, str],
    command: list[str],
    *,
    children: int = 0,
    name: str = "celery",
    ready: str = r"\S+@\S+ ready\.",
    swmp_run: bool = True,
) -> Iterator[Server]:
    """Start a Celery command; wait for ``ready`` in its log and ``children`` pool children
    holding ring slots. Stopped with SIGTERM (a warm shutdown), then by pid."""
    argv = [*SWMP_RUN, *command] if swmp_run else command
    log = workdir / f"{name}-{uuid.uuid4().hex[:6]}.log"
    proc = Proc(argv, env, log, marker=env["SW_AGENT_ARENA_DIR"])
    server = Server("celery", proc, 0, Path(env["SW_AGENT_ARENA_DIR"]), children, env)
    proc.start()
    try:
        server.arena_path()  # while the main process is alive
        proc.wait_log(ready, timeout=60)
        if children:
            server.wait_workers_claimed()
        yield server
    finally:
        proc.stop()


def succeeded(server: Server) -> set[str]:
    """Ids of the tasks the worker logged as succeeded (the log line is written by the main
    process once the child reported the result: after the task's span finished)."""
    return set(_SUCCEEDED.findall(server.proc.log()))


def deliveries(server: Server) -> Counter[str]:
    """How many times the worker logged each task id as received (a message the broker
    delivers again, e.g. one restored unacknowledged at a shutdown, is received again)."""
    return Counter(_RECEIVED.findall(server.proc.log()))


def publish(broker: str, queues: Sequence[str], n: int, workdir: Path) -> dict[str, dict[str, str]]:
    """``n`` tasks to each queue from a process without the agent, each task with its own
    trace id; returns ``{queue: {task id: trace id}}``."""
    out = workdir / f"published-{uuid.uuid4().hex[:6]}.json"
    subprocess.run(
        [sys.executable, "-m", "tests.e2e_apps.celery_publish", broker, ",".join(queues), str(n), str(out)],
        cwd=REPO_ROOT,
        check=True,
        timeout=60,
    )
    traces: dict[str, dict[str, str]] = json.loads(out.read_text())
    return traces


def wait_exit(server: Server, timeout: float = 60.0) -> int | None:
    code = server.proc.wait_exit(timeout)
    if code is not None:
        wait_until(lambda: not server.reporters(), 30, "the reporter to finish")
    return code


def publish_canvas(
    env: dict[str, str], n: int, workdir: Path, module: str = "tests.e2e_apps.celery_canvas"
) -> dict[str, Any]:
    """Run ``tests/e2e_apps/celery_canvas.py`` (or another publisher ``module`` taking the same
    ``N OUT.json`` arguments) under ``swmp run`` with ``env``: a chord of ``n`` tasks, a chain
    and a group sent inside one entry span; returns their results and the trace id once they
    are all done."""
    out = workdir / f"canvas-{uuid.uuid4().hex[:6]}.json"
    log = workdir / f"{out.stem}.log"
    with open(log, "wb") as f:
        done = subprocess.run(
            [*SWMP_RUN, sys.executable, "-m", module, str(n), str(out)],
            cwd=REPO_ROOT,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, log.read_text()
    results: dict[str, Any] = json.loads(out.read_text())
    return results


def slot_claims(server: Server) -> dict[int, int]:
    """``{slot: claims so far}`` of every slot of the worker's arena ever claimed (the
    arena counts each claim in the slot's control words)."""
    from ipc import Arena

    with Arena.open(str(server.arena_path()), wait_s=0) as arena:
        claims = {slot: arena.slot_identity(slot)[1] for slot in range(arena.slots)}
    return {slot: n for slot, n in claims.items() if n}
