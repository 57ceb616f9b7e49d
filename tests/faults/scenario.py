"""One fault scenario: Gunicorn under ``swmp run`` with the real reporter, paced load, and
the line it prints.

    with App(tmp, backend, "outage", workers=3) as app, PacedLoad(app.port, 100) as load:
        ...fault...
    outcome = settle(backend, app.service, load.stop(), name="outage")
    print(outcome.line())            # outage: served 3000 / delivered 3000 / duplicated 0 / lost 0 ...

Accounting, by trace id (every request carries its own, see :mod:`tests.faults.load`):
*served* = answered 2xx; *delivered* = served ids the backend received at least once;
*duplicated* = segments received more than once for one id; *lost* = served - delivered.
Requests that got no answer but whose segment arrived anyway are counted *unanswered
delivered* (a worker finished the request after the client gave up): never a loss.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.collector import free_port
from tests.faults.backend import FaultBackend
from tests.faults.load import LoadTally
from tests.servers import (
    REPO_ROOT,
    SWMP_RUN,
    Proc,
    Server,
    agent_env,
    gunicorn_command,
    port_open,
    wait_until,
)

# Durations: each is longer than the whole retry budget of a batch on the code before issue 16
# (5 attempts, 0.5-8 s of backoff, send timeout + 1 s per attempt), so giving up shows as loss.
RATE = float(os.environ.get("SWMP_FAULT_RATE", "100"))  # requests (= segments) per second
WORKERS = int(os.environ.get("SWMP_FAULT_WORKERS", "3"))  # Gunicorn sync workers per application
OUTAGE_S = float(os.environ.get("SWMP_FAULT_OUTAGE_S", "15"))  # backend port closed
BLACKHOLE_S = float(os.environ.get("SWMP_FAULT_BLACKHOLE_S", "20"))  # accepts, never answers
FAULT_S = float(os.environ.get("SWMP_FAULT_S", "10"))  # error answers, disk-full outage
QUIET_S = 6.0  # settle: nothing new for this long and nothing pending: the delivery is final
SETTLE_TIMEOUT_S = float(os.environ.get("SWMP_FAULT_SETTLE_S", "90"))


@dataclass
class Outcome:
    name: str
    served: int
    delivered: int
    duplicated: int
    lost: int
    unanswered: int
    unanswered_delivered: int
    settle_s: float
    notes: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.notes.items())
        return (
            f"{self.name}: served {self.served} / delivered {self.delivered} / duplicated "
            f"{self.duplicated} / lost {self.lost} (unanswered {self.unanswered}, of which delivered "
            f"{self.unanswered_delivered}; settled in {self.settle_s:.1f} s{'; ' + extra if extra else ''})"
        )


def account(name: str, tally: LoadTally, received: Counter[str], settle_s: float = 0.0) -> Outcome:
    served = set(tally.served)
    delivered = served & set(received)
    duplicated = sum(n - 1 for tid, n in received.items() if n > 1 and (tid in served or tid in tally.failed))
    unanswered = set(tally.failed)
    outcome = Outcome(
        name,
        served=len(served),
        delivered=len(delivered),
        duplicated=duplicated,
        lost=len(served - delivered),
        unanswered=len(unanswered),
        unanswered_delivered=len(unanswered & set(received)),
        settle_s=settle_s,
    )
    if tally.late:  # the load could not keep the asked rate (a busy machine): say so
        outcome.notes["late_skipped"] = tally.late
    return outcome


def settle(
    backend: FaultBackend, service: str, tally: LoadTally, name: str, app: App | None = None
) -> Outcome:
    """Wait until every served request's segment arrived, or nothing new came for
    :data:`QUIET_S` while the agent (``app``, when still running) holds nothing pending in
    memory or in its spool; what is missing then is lost. Bounded by SETTLE_TIMEOUT_S."""
    started = time.monotonic()
    want = set(tally.served)
    last_count, last_change = -1, time.monotonic()
    held = 0
    while time.monotonic() - started < SETTLE_TIMEOUT_S:
        received = backend.received(service)
        if want <= set(received):
            time.sleep(0.5)  # a late duplicate (a batch re-sent after a kill) still counts
            break
        count = sum(received.values())
        if count != last_count:
            last_count, last_change = count, time.monotonic()
        elif time.monotonic() - last_change > QUIET_S:
            held = app.held_records() if app is not None else 0
            if not held:
                break
            last_change = time.monotonic()  # the reporter still holds data: it may yet send it
        time.sleep(0.1)
    outcome = account(name, tally, backend.received(service), time.monotonic() - started)
    if held:
        outcome.notes["still_held"] = held
    print("\nFAULT " + outcome.line(), flush=True)
    return outcome


def heal_and_time_resume(backend: FaultBackend, within: float) -> float | None:
    """Heal the backend; seconds until the next segment arrives (None: not within ``within``)."""
    before = backend.collector.segment_count
    healed = time.monotonic()
    backend.heal()
    while time.monotonic() - healed < within:
        if backend.collector.segment_count > before:
            return round(time.monotonic() - healed, 2)
        time.sleep(0.01)
    return None


# -- the application ---------------------------------------------------------------------------
class App:
    """``swmp run -- gunicorn`` (sync workers, examples/app.py) reporting through the proxy.

    Every process it started is stopped by pid on exit (also when the test failed): the
    server's tree plus anything carrying its private arena directory.
    """

    def __init__(
        self,
        workdir: Path,
        backend: FaultBackend,
        service: str,
        *,
        workers: int = WORKERS,
        env: dict[str, str] | None = None,
        wait_claims: int | None = None,
    ) -> None:
        self.workdir = workdir
        self.backend = backend
        self.service = service
        self.workers = workers
        self.port = free_port()
        self.wait_claims = workers if wait_claims is None else wait_claims
        app_dir = workdir / service
        app_dir.mkdir(parents=True, exist_ok=True)
        self.env = agent_env(app_dir, backend.address, service=service, extra=env)
        self.proc = Proc(
            [*SWMP_RUN, *gunicorn_command(self.port, workers=workers)],
            self.env,
            app_dir / f"gunicorn-{self.port}.log",
            marker=self.env["SW_AGENT_ARENA_DIR"],
        )
        self.server = Server(
            "gunicorn", self.proc, self.port, Path(self.env["SW_AGENT_ARENA_DIR"]), workers, self.env
        )

    def start(self) -> App:
        self.proc.start()
        self.server.arena_path()  # named after the master's start time: read it while it lives
        self.proc.wait_log(r"Booting worker with pid", count=self.workers, timeout=60)
        wait_until(lambda: port_open(self.port), 60, f"port {self.port}")
        if self.wait_claims:
            self.server.wait_workers_claimed(self.wait_claims, timeout=60)
        self.server.wait_reporter(timeout=30)
        # Ready means delivering: the reporter has imported its client, connected and
        # announced the workers (a loaded machine takes seconds; a fault injected before
        # that would hit records that never had a chance).
        announced = self.backend.collector.wait_for(
            lambda: self.backend.collector.properties_of(self.service) >= self.wait_claims, timeout=60
        )
        assert announced, f"{self.service}: workers not announced to the backend\n{self.proc.tail()}"
        return self

    def __enter__(self) -> App:
        try:
            return self.start()
        except BaseException:
            self.proc.kill_all()
            raise

    def __exit__(self, *exc: object) -> None:
        self.proc.stop(signal.SIGTERM, timeout=20)

    def family(self) -> list[psutil.Process]:
        return [p for p in self.proc.family() if _running(p)]

    def reporters(self) -> list[psutil.Process]:
        return self.server.reporters()

    def supervisors(self) -> list[psutil.Process]:
        return self.server.named_processes("swmp-supervisor")

    def stop_and_leftovers(
        self, sig: int = signal.SIGTERM, *, group: bool = False, within: float = 30.0
    ) -> list[str]:
        """Signal the master (or its whole process group, as systemd and Ctrl-C do) and
        wait up to ``within`` s for every process of the application to exit; returns a
        description of those still running then (they are killed afterwards by ``__exit__``)."""
        if group:
            os.killpg(os.getpgid(self.proc.pid), sig)
        else:
            self.proc.send(sig)
        family = self.proc.family()
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.proc.popen is not None:
                self.proc.popen.poll()  # reap the master
            if not any(_running(p) for p in family + self.proc.family()):
                return []
            time.sleep(0.1)
        return [f"{p.pid} {_name(p)}" for p in family + self.proc.family() if _running(p)]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``swmp ARGS --dir <this application's arena directory>``, as an operator runs it."""
        return subprocess.run(
            [sys.executable, "-m", "swmp.cli", *args, "--dir", str(self.server.arena_dir)],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            env=self.env,
            timeout=60,
            check=False,
        )

    def status(self) -> dict[str, Any]:
        """This application's agent in ``swmp status --json`` (one reading)."""
        doc = json.loads(self.cli("status", "--json", "--interval", "0").stdout or "{}")
        agents = [a for a in doc.get("agents", []) if a.get("service") == self.service]
        return agents[0] if agents else {}

    def held_records(self) -> int:
        """Bytes pending in a live reporter's memory plus records in its spool (0 when no
        reporter runs: a dead one's last status document promises nothing)."""
        agent = self.status() if self.proc.alive() else {}
        if not (agent.get("reporter") or {}).get("alive"):
            return 0
        return int(agent.get("pending_bytes") or 0) + int((agent.get("spool") or {}).get("records") or 0)

    def health(self) -> subprocess.CompletedProcess[str]:
        return self.cli("health", "--json")


def counted_drops(agent: dict[str, Any]) -> int:
    """Every record the agent says it dropped (rings, reporter, and any newer drop counter)."""
    totals = agent.get("totals", {})
    return sum(int(v or 0) for k, v in totals.items() if "drop" in k)


def unique_service(prefix: str) -> str:
    """A service name of this run only (a spool of an earlier run is never replayed into it)."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return "?"


@contextlib.contextmanager
def tiny_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (root only), unmounted on exit."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
