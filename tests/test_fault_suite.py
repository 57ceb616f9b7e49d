"""The fault suite (issue 16, "Proof"): real Gunicorn, the real reporter over gRPC, and a
backend that fails in the ways real ones do. Each scenario prints one line::

    FAULT outage: served 4000 / delivered 4000 / duplicated 0 / lost 0 (...)

and asserts the guarantee the issue sets for that fault. Scenarios that the code on this
branch cannot pass yet carry ``xfail(strict=True)`` naming the branch that fixes them: they
turn red when the fix lands, and the marker comes off then.

Durations (CI defaults; the documented long run is in docs/reliability.md)::

    SWMP_FAULT_RATE=1000 SWMP_FAULT_OUTAGE_S=600 \
        python3 -m pytest tests/test_fault_suite.py -k outage_under_load -s
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.backend import FaultBackend, fault_backend
from tests.faults.load import PacedLoad
from tests.faults.proxy import FaultProxy
from tests.faults.scenario import (
    BLACKHOLE_S,
    FAULT_S,
    OUTAGE_S,
    RATE,
    App,
    Outcome,
    counted_drops,
    heal_and_time_resume,
    settle,
    tiny_tmpfs,
    unique_service,
)
from tests.servers import request

pytestmark = [pytest.mark.servers, pytest.mark.timeout(int(300 + 2 * OUTAGE_S))]

LEAD_IN_S = 2.0  # load before the fault, so the pipe is known to flow
AFTER_S = 3.0  # load after the backend is back


@pytest.fixture(scope="session")
def backend() -> Iterator[FaultBackend]:
    with fault_backend() as fb:
        yield fb


@pytest.fixture
def healthy(backend: FaultBackend) -> Iterator[FaultBackend]:
    """The backend, healed again after the test whatever happened in it."""
    backend.heal()
    try:
        yield backend
    finally:
        backend.heal()


def run_fault(app: App, backend: FaultBackend, name: str, fault: str, seconds: float) -> Outcome:
    """Load through: healthy, ``fault`` for ``seconds``, healthy again; then account.

    ``resumed_s`` (printed, never asserted): from the heal to the next segment delivered."""
    with PacedLoad(app.port, RATE) as load:
        load.wait_served(int(RATE * LEAD_IN_S))
        getattr(backend, fault)()
        time.sleep(seconds)
        resumed = heal_and_time_resume(backend, AFTER_S)
        load.wait_served(int(RATE * AFTER_S / 2))
    elapsed = time.monotonic() - load.started
    outcome = settle(backend, app.service, load.tally, name, app)
    outcome.notes["served_per_s"] = round(outcome.served / elapsed)
    outcome.notes["resumed_s"] = resumed if resumed is not None else f">{AFTER_S:g}"
    print("FAULT   " + outcome.line(), flush=True)
    return outcome


def assert_nothing_lost(outcome: Outcome) -> None:
    assert outcome.served > 0
    assert outcome.lost == 0, outcome.line()


# -- the harness itself ------------------------------------------------------------------------
@contextlib.contextmanager
def echo_server() -> Iterator[int]:
    """A TCP echo server on a free port (one thread per connection)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the proxy resets it on purpose
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def test_proxy_passes_refuses_and_black_holes() -> None:
    with echo_server() as port, FaultProxy(("127.0.0.1", port)) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as c:
            c.sendall(b"ping")
            assert c.recv(4) == b"ping"
            proxy.set_mode("blackhole")  # the live connection stops answering too
            c.sendall(b"lost")
            c.settimeout(0.5)
            with pytest.raises(TimeoutError):
                c.recv(4)
            proxy.set_mode("pass")  # the black-holed connection is reset: clients reconnect
            c.settimeout(10)
            with pytest.raises(OSError):
                c.sendall(b"x")
                if not c.recv(1):
                    raise ConnectionResetError("closed")
        proxy.set_mode("closed")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        proxy.set_mode("pass")  # the same port again
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as c:
            c.sendall(b"back")
            assert c.recv(4) == b"back"


# -- control: the harness end to end, no fault --------------------------------------------------
def test_no_fault_everything_delivered(tmp_path: Path, healthy: FaultBackend) -> None:
    with App(tmp_path, healthy, unique_service("control")) as app:
        with PacedLoad(app.port, RATE) as load:
            load.wait_served(int(RATE * 3))
        outcome = settle(healthy, app.service, load.tally, "no fault", app)
        assert app.stop_and_leftovers() == []
    assert_nothing_lost(outcome)
    assert outcome.duplicated == 0, outcome.line()


# -- backend faults ----------------------------------------------------------------------------
def test_outage_under_load_loses_nothing(tmp_path: Path, healthy: FaultBackend) -> None:
    with App(tmp_path, healthy, unique_service("outage")) as app:
        outcome = run_fault(app, healthy, f"outage {OUTAGE_S:.0f} s at {RATE:.0f}/s", "outage", OUTAGE_S)
        assert app.stop_and_leftovers() == []
    assert_nothing_lost(outcome)


def test_backend_that_never_answers_loses_nothing(tmp_path: Path, healthy: FaultBackend) -> None:
    # A 1 s send timeout: the hung calls time out and are retried many times within the fault.
    env = {"SW_AGENT_REPORTER_SEND_TIMEOUT": "1"}
    with App(tmp_path, healthy, unique_service("blackhole"), env=env) as app:
        outcome = run_fault(app, healthy, f"black hole {BLACKHOLE_S:.0f} s", "blackhole", BLACKHOLE_S)
        assert app.stop_and_leftovers() == []
    assert_nothing_lost(outcome)


def test_backend_answering_unavailable_loses_nothing(tmp_path: Path, healthy: FaultBackend) -> None:
    with App(tmp_path, healthy, unique_service("errors")) as app:
        outcome = run_fault(app, healthy, f"UNAVAILABLE {FAULT_S:.0f} s", "answer_errors", FAULT_S)
        assert app.stop_and_leftovers() == []
    assert_nothing_lost(outcome)
    assert healthy.collector.failed_calls, "the collector never answered an error"


def test_oversize_rejection_splits_and_loses_nothing(tmp_path: Path, healthy: FaultBackend) -> None:
    # A second of records per batch: well over the strict collector's 16 KiB per message.
    env = {"SW_AGENT_REPORTER_FLUSH_INTERVAL": "1"}
    with App(tmp_path, healthy, unique_service("oversize"), env=env) as app:
        healthy.oversize_limit(True)
        with PacedLoad(app.port, RATE) as load:
            load.wait_served(int(RATE * 4))
        outcome = settle(healthy, app.service, load.tally, "oversize (16 KiB limit)", app)
        assert app.stop_and_leftovers() == []
    assert_nothing_lost(outcome)


# -- process faults ----------------------------------------------------------------------------
def test_reporter_sigkill_under_load_loses_nothing(tmp_path: Path, healthy: FaultBackend) -> None:
    with App(tmp_path, healthy, unique_service("reporter-kill")) as app:
        with PacedLoad(app.port, RATE) as load:
            load.wait_served(int(RATE * LEAD_IN_S))
            first = app.reporters()
            assert len(first) == 1
            first[0].kill()
            load.wait_served(int(RATE * 1))
            # The supervisor starts another reporter; the load goes on meanwhile.
            app.server.wait_reporter(timeout=30)
            load.wait_served(int(RATE * AFTER_S))
        outcome = settle(healthy, app.service, load.tally, "reporter SIGKILL", app)
        assert [p.pid for p in app.reporters()] != [first[0].pid]
        assert app.stop_and_leftovers() == []
    assert_nothing_lost(outcome)


def test_supervisor_and_reporter_sigkill_loses_nothing(tmp_path: Path, healthy: FaultBackend) -> None:
    with App(tmp_path, healthy, unique_service("supervisor-kill")) as app:
        with PacedLoad(app.port, RATE) as load:
            load.wait_served(int(RATE * LEAD_IN_S))
            supervisors = app.supervisors()
            assert len(supervisors) == 1
            supervisors[0].kill()
            load.wait_served(int(RATE * 1))
            # Whoever reports now: kill it too; someone must start the next one.
            for p in app.reporters():
                p.kill()
            load.wait_served(int(RATE * (1 + AFTER_S)))
        outcome = settle(healthy, app.service, load.tally, "supervisor + reporter SIGKILL", app)
        outcome.notes["reporters_after"] = len(app.reporters())
        assert app.stop_and_leftovers() == []
    assert_nothing_lost(outcome)


def test_process_group_sigterm_under_load_loses_nothing(tmp_path: Path, healthy: FaultBackend) -> None:
    with App(tmp_path, healthy, unique_service("pgroup")) as app:
        slow: list[str] = []

        def slow_request() -> None:
            # In flight when the group gets SIGTERM: a sync worker finishes it, then exits.
            trace_id = uuid.uuid4().hex
            if request(app.port, "/sleep?s=1.5", trace_id).status == 200:
                slow.append(trace_id)

        with PacedLoad(app.port, RATE) as load:
            load.wait_served(int(RATE * LEAD_IN_S))
            threads = [threading.Thread(target=slow_request) for _ in range(app.workers)]
            for t in threads:
                t.start()
            time.sleep(0.5)
            leftovers = app.stop_and_leftovers(signal.SIGTERM, group=True)
            for t in threads:
                t.join(30)
        load.tally.served.extend(slow)
        outcome = settle(healthy, app.service, load.tally, "process-group SIGTERM")
        outcome.notes["in_flight_served"] = len(slow)
    assert leftovers == []
    assert slow, "no request was in flight at the SIGTERM"
    assert_nothing_lost(outcome)
    assert not app.server.arena_path().exists(), "arena left behind"


def test_master_sigterm_during_outage_then_restart_loses_nothing(
    tmp_path: Path, healthy: FaultBackend
) -> None:
    service = unique_service("stop-in-outage")
    with App(tmp_path, healthy, service) as app:
        with PacedLoad(app.port, RATE) as load:
            load.wait_served(int(RATE * LEAD_IN_S))
            healthy.outage()
            load.wait_served(int(RATE * 3))
        leftovers = app.stop_and_leftovers(signal.SIGTERM)
    assert leftovers == [], "processes still running after SIGTERM during an outage"
    healthy.heal()
    # The same application (same service, same directories) started again: what the first
    # run kept is delivered now.
    with App(tmp_path, healthy, service) as again:
        outcome = settle(healthy, service, load.tally, "master SIGTERM in outage, restart", again)
    assert_nothing_lost(outcome)


def test_slot_exhaustion_is_counted_and_unhealthy(tmp_path: Path, healthy: FaultBackend) -> None:
    env = {"SW_AGENT_ARENA_SLOTS": "2"}
    with App(tmp_path, healthy, unique_service("slots"), workers=4, env=env, wait_claims=2) as app:
        with PacedLoad(app.port, RATE) as load:
            load.wait_served(int(RATE * 3))
            # While records are being lost: health looks at an interval, as a probe does.
            health = app.health()
        outcome = settle(healthy, app.service, load.tally, "slot exhaustion (4 workers, 2 slots)", app)
        agent = app.status()
        outcome.notes["counted_drops"] = counted_drops(agent)
        outcome.notes["health_exit"] = health.returncode
        print("FAULT   " + outcome.line(), flush=True)
        assert app.stop_and_leftovers() == []
    # Loss is expected here (two workers have no ring); silent loss is not.
    assert counted_drops(agent) >= outcome.lost, outcome.line()
    assert health.returncode != 0, health.stdout


def test_disk_full_spool_counts_what_it_drops(tmp_path: Path, healthy: FaultBackend) -> None:
    # A 256 KiB disk for the spool and a 64 KiB memory cap: an outage fills both in seconds.
    with tiny_tmpfs(tmp_path / "spool", "256k") as spool:
        env = {
            "SW_AGENT_SPOOL_DIR": str(spool),
            "SW_AGENT_SPOOL_MAX_BYTES": str(64 * 1024 * 1024),  # the disk is the limit, not the cap
            "SW_AGENT_REPORTER_MAX_PENDING_BYTES": str(64 * 1024),
        }
        with App(tmp_path, healthy, unique_service("disk-full"), env=env) as app:
            with PacedLoad(app.port, RATE) as load:
                load.wait_served(int(RATE * LEAD_IN_S))
                healthy.outage()
                load.wait_served(int(RATE * FAULT_S))
                filled = os.statvfs(spool)
                healthy.heal()
                load.wait_served(int(RATE * AFTER_S))
            outcome = settle(healthy, app.service, load.tally, "disk full (256 KiB spool disk)", app)
            agent = app.status()
            outcome.notes["counted_drops"] = counted_drops(agent)
            outcome.notes["spool_free_at_heal"] = filled.f_bavail * filled.f_frsize
            print("FAULT   " + outcome.line(), flush=True)
            assert app.stop_and_leftovers() == []
    # The scenario happened: the spool filled its disk.
    assert filled.f_bavail * filled.f_frsize < 64 * 1024, outcome.line()
    # The application never noticed; every loss is counted.
    assert outcome.unanswered == 0, outcome.line()
    assert counted_drops(agent) >= outcome.lost, outcome.line()
