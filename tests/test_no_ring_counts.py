"""Records that no ring takes are dropped, counted, and shown by ``swmp status``, in both
reporter modes.

In thread mode (``SW_AGENT_REPORTER_PROCESS=false``) each process that reports has a private
arena of its own; what a helper, the master or a process without a ring drops is counted in
the application's name registry, and ``swmp status`` shows it once, with one of the
application's processes. First on the sinks with real arenas, then with a real application
(tests/e2e_apps/exit_app.py), the real agent, the in-test collector and the real CLI.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ipc import Arena
from reporter_proc import records as R
from reporter_proc.process import start_reporter_thread
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from swmp import _sink as swmp_sink
from swmp import lifecycle
from swmp._arena_sink import ArenaSink
from swmp._thread_sink import ThreadSink
from swmp.tracing.identity import identity
from tests.e2e_apps.exit_app import HELPER_LINES, OWNER_LATE_LINES
from tests.servers import REPO_ROOT, Proc, agent_env, collector_process
from tests.test_cli_support import cli, cli_json

APP = REPO_ROOT / "tests" / "e2e_apps" / "exit_app.py"


@pytest.fixture(autouse=True)
def _give_back_process_state() -> Iterator[None]:
    """The sinks name this process and give it a role: later tests must not inherit them."""
    before = (identity.service, identity.instance)
    yield
    identity.set(*before)
    lifecycle.announce_unbound()


def _log(message: str) -> bytes:
    return orjson.dumps([1, "svc", "inst", "", "text", message, "", "", -1, [], ""])


def _no_thread(path: str, settings: ReporterSettings, arena: Arena) -> Any:
    raise AssertionError("a process without a ring must not start a reporter thread")


@pytest.fixture
def as_gunicorn_master(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process is the arbiter of a Gunicorn server (it owns the application)."""
    monkeypatch.delitem(sys.modules, "uwsgi", raising=False)
    monkeypatch.setitem(sys.modules, "gunicorn.arbiter", types.ModuleType("gunicorn.arbiter"))


def test_the_thread_mode_master_counts_its_records_in_the_registry(
    tmp_path: Path, as_gunicorn_master: None
) -> None:
    registry = Arena.create(str(tmp_path / "names.arena"), slots=2, ring_capacity=4096)
    try:
        sink = ThreadSink(
            registry,
            ReporterSettings(service="svc"),
            _no_thread,
            arena_dir=str(tmp_path),
            ring_capacity=1 << 16,
            meta=b"{}",
            service="svc",
            instance_base="base",
            owner_pid=os.getpid(),
        )
        assert not sink.write(R.LOG, _log("worker timeout"))
        assert not sink.write(R.SEGMENT, b"[]")
        assert sink.role == "master" and sink.private is None
        lost = registry.lost_counts()
        assert (lost.master_records, lost.no_slot_records, lost.helper_records) == (2, 0, 0)
    finally:
        registry.close()


def test_a_process_mode_master_without_a_free_slot_counts_apart(
    tmp_path: Path, as_gunicorn_master: None
) -> None:
    arena = Arena.create(str(tmp_path / "one.arena"), slots=1, ring_capacity=1 << 16)
    other = Arena.open(arena.path)  # a worker holds the only slot
    try:
        assert other.claim_slot() is not None
        sink = ArenaSink(arena, "svc", "base", owner_pid=os.getpid())
        assert not sink.write(R.LOG, _log("worker timeout"))
        lost = arena.lost_counts()
        # Not "no slot": that one fails `swmp health` and asks for more slots, for workers.
        assert (lost.master_records, lost.no_slot_records) == (1, 0)
    finally:
        other.release_slot()
        other.close()
        arena.close()


def _start_app(tmp_path: Path, backend: str, scenario: str, reporter_process: bool) -> tuple[Proc, str]:
    env = agent_env(
        tmp_path,
        backend,
        service="exits",
        reporter_process=reporter_process,
        extra={"SW_AGENT_LOG_REPORTER_ACTIVE": "true", "SW_AGENT_REPORTER_SHUTDOWN_TIMEOUT": "3"},
    )
    shm = env["SW_AGENT_ARENA_DIR"]
    app = Proc([sys.executable, str(APP), scenario], env, tmp_path / f"{scenario}.log", marker=shm)
    return app.start(), shm


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reporter_process", [True, False], ids=["process", "thread"])
def test_status_shows_what_helpers_dropped(tmp_path: Path, reporter_process: bool) -> None:
    with collector_process(tmp_path) as col:
        app, shm = _start_app(tmp_path, col.grpc_address, "helpers", reporter_process)
        try:
            app.wait_log(r"READY \d+")
            rc, status = cli_json("status", "--dir", shm, "--interval", "0")
            assert rc == 0, status
            agents = status["agents"]
            # Thread mode: the worker's and the parent's private arenas; the application's
            # counts are shown with one of them, never added twice.
            assert len(agents) == (1 if reporter_process else 2), agents
            assert {a["mode"] for a in agents} == {"process" if reporter_process else "thread"}
            helpers = sorted(a["totals"]["helper_dropped"] for a in agents)
            assert helpers == ([HELPER_LINES] if reporter_process else [0, HELPER_LINES])
            assert all(a["totals"]["no_slot_dropped"] == 0 for a in agents)
            text = cli("status", "--dir", shm, "--interval", "0").stdout
            assert text.count(f"helpers: {HELPER_LINES} not reported") == 1, text
        finally:
            app.stop()
        assert app.popen is not None and app.popen.returncode == 0, app.tail()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reporter_process", [True, False], ids=["process", "thread"])
def test_a_record_after_the_goodbye_is_counted_not_reported(tmp_path: Path, reporter_process: bool) -> None:
    with collector_process(tmp_path) as col:
        app, _ = _start_app(tmp_path, col.grpc_address, "late", reporter_process)
        try:
            assert app.wait_exit(60) == 0, app.tail()
        finally:
            app.stop()
    found = re.search(r"^RESULT (.*)$", app.log(), re.M)
    assert found, app.tail()
    result = json.loads(found.group(1))
    assert result["status"] == 0, app.tail()
    # One claim: no second WORKER_START after the WORKER_STOP (process mode), no second
    # name, reporter thread and private arena in the exiting worker (thread mode).
    assert result["claims"] == 1, result
    assert result["private"] == [], result
    # The record is dropped and counted where `swmp status` reads it, apart from the
    # records lost for want of a slot.
    assert (result["late"], result["no_slot"]) == (1, 0), result


def _unseen_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "nothing running can count" in r.getMessage()]


def test_the_thread_mode_owner_reports_at_exit_what_it_dropped_after_its_goodbye(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The owner removes the name registry at its goodbye (agent._at_exit): its own later drops
    went into that removed file, where nobody could ever see them. Now they stay with the sink
    and the last exit hook logs how many; one after that hook is said at once."""
    registry = Arena.create(str(tmp_path / "names.arena"), slots=2, ring_capacity=4096)
    sender = MemorySender()

    def start_thread(path: str, s: ReporterSettings, arena: Arena) -> Any:
        return start_reporter_thread(path, s, arena=arena, sender=sender)

    sink = ThreadSink(
        registry,
        ReporterSettings(service="svc", flush_interval_s=0.01),
        start_thread,
        arena_dir=str(tmp_path),
        ring_capacity=1 << 16,
        meta=b"{}",
        service="svc",
        instance_base="base",
        owner_pid=os.getpid(),
    )
    me = os.getpid()
    try:
        assert sink.write(R.LOG, _log("the owner reports"))
        sink.leave(timeout=5, for_good=True)
        registry.unlink()  # as the owner's exit hook does after the goodbye
        with caplog.at_level(logging.WARNING, logger="swmp.agent"):
            assert not sink.write(R.LOG, _log("an exit handler after the agent's"))
            assert not sink.write(R.SEGMENT, b"[]")
            assert registry.lost_counts().late_records == 0  # not into the removed file
            assert sink.unseen_drops()["late"] == 2
            assert _unseen_messages(caplog) == []  # said once, at the end
            swmp_sink.set_sink(sink)
            try:
                swmp_sink.report_unseen()  # the last exit hook
            finally:
                swmp_sink.set_sink(None)
            assert _unseen_messages(caplog) == [
                f"swmp: process {me} dropped 2 records that nothing running can count any more "
                "(after exit: 2)"
            ]
            # An exit handler registered before `import swmp` runs after that report.
            assert not sink.write(R.LOG, _log("later still"))
            assert not sink.write(R.LOG, _log("and again"))
        assert _unseen_messages(caplog)[1:] == [
            f"swmp: process {me} dropped a record made after the agent's exit report; nothing "
            "running can count it (more are dropped silently)"
        ]
    finally:
        registry.close()
    assert sender.logs  # the record before the goodbye was reported


def test_a_process_mode_straggler_keeps_its_counts_once_the_arena_is_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Process mode: the counts go to the shared arena while it is there (the reporter shows
    them); once the last reporter out removed it, as in thread mode."""
    arena = Arena.create(str(tmp_path / "app.arena"), slots=1, ring_capacity=1 << 16)
    try:
        sink = ArenaSink(arena, "svc", "base", owner_pid=os.getpid())
        assert sink.write(R.LOG, _log("reported"))
        sink.leave(timeout=5, for_good=True)
        assert not sink.write(R.LOG, _log("late, the arena still there"))
        assert arena.lost_counts().late_records == 1
        arena.unlink()
        assert not sink.write(R.LOG, _log("late, the arena gone"))
        assert arena.lost_counts().late_records == 1
        assert sink.unseen_drops()["late"] == 1
        with caplog.at_level(logging.WARNING, logger="swmp.agent"):
            sink.report_unseen()
        assert _unseen_messages(caplog) == [
            f"swmp: process {os.getpid()} dropped 1 records that nothing running can count any more "
            "(after exit: 1)"
        ]
    finally:
        arena.close()


@pytest.mark.timeout(120)
def test_the_thread_mode_owner_says_at_exit_how_many_records_it_dropped_after_its_goodbye(
    tmp_path: Path,
) -> None:
    """A real single-process application in thread mode whose exit handler (registered after
    ``import swmp``, before ``swmp.start()``) logs after the agent's goodbye."""
    with collector_process(tmp_path) as col:
        app, _ = _start_app(tmp_path, col.grpc_address, "owner-late", reporter_process=False)
        try:
            assert app.wait_exit(60) == 0, app.tail()
        finally:
            app.stop()
    found = re.search(r"^READY (\d+)$", app.log(), re.M)
    assert found, app.tail()
    expected = (
        f"swmp: process {found.group(1)} dropped {OWNER_LATE_LINES} records that nothing running can "
        f"count any more (after exit: {OWNER_LATE_LINES})"
    )
    assert app.log().count(expected) == 1, app.tail()
