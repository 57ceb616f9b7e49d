"""Records a process made where no ring of its own could take them are counted where
``swmp status`` shows them, not only in the process's memory:

* ``prestart``: records made before the agent started in the process (``NullSink.dropped``),
  per process (a forked child does not count its parent's), added to the ring the process
  binds (a prefork master, which binds none for them: with its records, ``master``). Shown,
  never a loss for ``swmp health`` (nothing was running to lose them).
* ``stale``: records a disabled ring writer refused (its slot given back, inherited across
  fork; ``RingWriter._lost``), in both writer forms: forwarded to the agent, which counts them
  in the ring the process holds now, else with its records that no ring takes (``late``), else
  (no shared file left at all) in its report at exit. A loss.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ipc.ring_writer as ring_writer_module
from ipc import Arena
from ipc.ring import anonymous_ring
from reporter_proc import records as R
from reporter_proc.process import start_reporter_thread
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from swmp import _sink
from swmp._arena_sink import ArenaSink
from swmp._thread_sink import ThreadSink
from swmp.tracing.identity import identity
from tests.collector import free_port
from tests.servers import agent_env, gunicorn_command, run_server, wait_until
from tests.test_agent_runtime import segment
from tests.test_cli_support import cli_json

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def null_sink(trace_sink: _sink.MemorySink) -> Iterator[None]:
    """No agent sink installed (as before ``swmp.start()``), this process's count at 0."""
    _sink.set_sink(None)
    _sink.take_prestart()
    yield
    _sink.take_prestart()
    _sink.set_sink(trace_sink)


@pytest.fixture(autouse=True)
def _keep_identity() -> Iterator[None]:
    before = (identity.service, identity.instance)
    yield
    identity.set(*before)


@pytest.fixture
def arena(tmp_path: Path) -> Iterator[Arena]:
    a = Arena.create(str(tmp_path / "a.arena"), slots=2, ring_capacity=1 << 16)
    yield a
    a.close()


def sink_for(arena: Arena) -> ArenaSink:
    return ArenaSink(arena, "svc", "base", owner_pid=os.getppid())  # never a prefork master


# -- the null sink: per process ----------------------------------------------------------------
def test_the_null_sink_counts_this_processs_records_only(null_sink: None) -> None:
    null = _sink.get_sink()
    assert isinstance(null, _sink.NullSink)
    assert not null.write(R.SEGMENT, b"x") and not null.write(R.SEGMENT, b"x")
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            null.write(R.SEGMENT, b"x")
            os.write(wr, b"%d" % _sink.take_prestart())
        finally:
            os._exit(0)
    os.close(wr)
    answer = os.read(rd, 64)
    os.close(rd)
    os.waitpid(pid, 0)
    assert answer == b"1"  # its own record, not its parent's two as well
    assert _sink.take_prestart() == 2 and _sink.take_prestart() == 0  # handed over once


# -- the ring's words -------------------------------------------------------------------------
def test_the_writer_adds_to_its_prestart_and_stale_words() -> None:
    writer, reader, _control = anonymous_ring()
    assert writer.add_prestart(2) and writer.add_stale(3) and not writer.add_stale(0)
    st = reader.stats()
    assert (st.prestart_records, st.stale_records, st.dropped_records, st.unbuilt_records) == (2, 3, 0, 0)
    writer._disable("released its slot")
    assert not writer.add_prestart(1) and not writer.add_stale(1)  # not this process's words any more
    assert (reader.stats().prestart_records, reader.stats().stale_records) == (2, 3)


@pytest.mark.parametrize("form", ["native", "pure"])
def test_a_disabled_writer_forwards_what_it_refuses(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if form == "pure":
        monkeypatch.setattr(ring_writer_module, "_NativeWriter", None)
    elif not ring_writer_module.NATIVE:
        pytest.skip("the native ring writer is not built")
    writer, reader, _control = anonymous_ring()
    assert writer.write(1, b"live")
    forwarded: list[int] = []
    writer.forward_refused(forwarded.append)
    writer._disable("released its slot")
    assert not writer.write(1, b"a") and not writer.write(1, b"b")
    assert forwarded == [1, 1] and writer.disabled_drops == 0
    assert reader.stats().dropped_records == 0  # the slot's words were left alone

    def broken(n: int) -> None:
        raise RuntimeError("nowhere to count")

    writer.forward_refused(broken)  # a forward that fails keeps the count in the process
    assert not writer.write(1, b"c")
    assert writer.disabled_drops == 1
    writer.forward_refused(forwarded.append)  # and hands it over with the next one set
    assert forwarded == [1, 1, 1] and writer.disabled_drops == 0


# -- the agent's sink -----------------------------------------------------------------------------
def test_records_made_before_the_agent_are_counted_in_the_ring_it_binds(
    null_sink: None, arena: Arena
) -> None:
    for _ in range(3):
        _sink.get_sink().write(R.SEGMENT, segment("base"))
    sink = sink_for(arena)
    _sink.set_sink(sink)
    assert sink.write(R.SEGMENT, segment("base"))  # the first record binds
    assert sink.slot is not None
    st = arena.ring_stats(sink.slot)
    assert st.prestart_records == 3 and st.dropped_records == 0
    assert arena.lost_counts().no_slot_records == 0
    sink.leave()
    _sink.set_sink(None)
    _sink.get_sink().write(R.SEGMENT, b"x")  # after stop(): counted at the next start's bind
    sink.rebind()
    assert sum(arena.ring_stats(s).prestart_records for s in range(arena.slots)) == 4


def test_a_prefork_masters_records_before_the_agent_are_its_records(null_sink: None, arena: Arena) -> None:
    _sink.get_sink().write(R.SEGMENT, b"x")
    _sink.get_sink().write(R.LOG, b"x")
    sink = sink_for(arena)
    sink.count_master_prestart()
    assert arena.lost_counts().master_records == 2
    assert _sink.take_prestart() == 0


def test_records_a_given_up_writer_refuses_are_counted(arena: Arena) -> None:
    sink = sink_for(arena)
    assert sink.write(R.SEGMENT, segment("base"))
    old = sink._writer
    assert old is not None
    sink.leave()  # stop(): the slot is given back; a thread that took the writer just before...
    assert not old.write(R.SEGMENT, segment("base"))  # ...writes through it: refused
    assert old.disabled_drops == 0
    assert arena.lost_counts().late_records == 1  # no ring now: with its records no ring took
    assert sink.write(R.SEGMENT, segment("base"))  # start() again: a ring
    assert not old.write(R.SEGMENT, segment("base"))
    assert sink.slot is not None and arena.ring_stats(sink.slot).stale_records == 1
    sink.leave(for_good=True)


def test_a_thread_mode_writer_given_up_refuses_and_counts(tmp_path: Path) -> None:
    registry = Arena.create(str(tmp_path / "names.arena"), slots=2, ring_capacity=4096)
    sender = MemorySender()
    settings = ReporterSettings(service="svc", flush_interval_s=0.01, keepalive_interval_s=0.1)

    def start_thread(path: str, s: ReporterSettings, arena: Arena) -> Any:
        return start_reporter_thread(path, s, arena=arena, sender=sender)

    sink = ThreadSink(
        registry,
        settings,
        start_thread,
        arena_dir=str(tmp_path),
        ring_capacity=1 << 16,
        meta=b"{}",
        service="svc",
        instance_base="base",
        owner_pid=os.getppid(),
    )
    try:
        assert sink.write(R.SEGMENT, segment("base"))
        old = sink._writer
        assert old is not None
    finally:
        sink.leave(timeout=5)
    # Its reporter thread is gone: the ring is no longer read. Before, the write landed there
    # ("written") and was lost uncounted.
    assert not old.write(R.SEGMENT, segment("base"))
    assert registry.lost_counts().late_records == 1
    registry.close()


def test_a_forked_childs_refusals_are_its_own(arena: Arena) -> None:
    sink = sink_for(arena)
    assert sink.write(R.SEGMENT, segment("base"))
    inherited = sink._writer
    assert inherited is not None and sink.slot is not None
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            ok = inherited.write(R.SEGMENT, segment("base"))  # disabled at fork: refused
            os._exit(0 if not ok and inherited.disabled_drops == 0 else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # A child of a worker is a helper (no ring): counted as its records, never in the
    # parent's ring, whose writer is still its own.
    assert arena.lost_counts().helper_records == 1
    assert arena.ring_stats(sink.slot).stale_records == 0
    assert sink.write(R.SEGMENT, segment("base"))
    sink.leave(for_good=True)


def test_refusals_with_no_shared_file_left_are_reported_at_exit(
    arena: Arena, caplog: pytest.LogCaptureFixture
) -> None:
    sink = sink_for(arena)
    assert sink.write(R.SEGMENT, segment("base"))
    old = sink._writer
    assert old is not None
    sink.leave(for_good=True)
    arena.unlink()  # the last reporter out removed it
    assert not old.write(R.SEGMENT, segment("base"))
    assert arena.lost_counts().late_records == 0
    with caplog.at_level(logging.WARNING, logger="swmp.agent"):
        sink.report_unseen()
    messages = [r.getMessage() for r in caplog.records if "nothing running can count" in r.getMessage()]
    assert messages == [
        f"swmp: process {os.getpid()} dropped 1 records that nothing running can count any more "
        "(after exit: 1)"
    ]


# -- real processes, then ``swmp status`` --------------------------------------------------------
# Nothing answers at 127.0.0.1:1: a stop spends its whole flushing deadline failing to deliver
# (5 s by default, twice in "thread-restart"). What these tests read happens before any stop.
NO_BACKEND = {"SW_AGENT_REPORTER_SHUTDOWN_TIMEOUT": "0.5"}
SCRIPT = """
import sys
import swmp
from swmp import agent
from swmp.tracing.context import new_local_span
for _ in range(2):
    with new_local_span("before the agent"):
        pass
swmp.start()
with new_local_span("reported"):
    pass
if sys.argv[2] == "restart":
    sink = agent._running.sink
    old = sink._writer
    swmp.stop()
    assert not old.write(1, b"x")  # a write racing the stop: the slot was given back
    swmp.start()
    with new_local_span("reported again"):
        pass
    assert not old.write(1, b"x")  # the same, while the process holds a ring again
open(sys.argv[1], "w").close()
sys.stdin.read()  # until the test is done reading the arena
"""


@pytest.mark.parametrize(
    ("mode", "restart", "expected"),
    [
        ("process", True, (2, 1, 1)),
        ("thread", False, (2, 0, 0)),
        # Thread mode: the first private arena (its prestart word with it) is removed at stop().
        ("thread", True, (0, 1, 1)),
    ],
    ids=["process", "thread", "thread-restart"],
)
def test_swmp_status_shows_records_before_the_agent_and_after_a_ring(
    tmp_path: Path, mode: str, restart: bool, expected: tuple[int, int, int]
) -> None:
    shm = tmp_path / "shm"
    script, ready = tmp_path / "app.py", tmp_path / "ready"
    script.write_text(SCRIPT)
    env = agent_env(tmp_path, "127.0.0.1:1", reporter_process=mode == "process", extra=NO_BACKEND)
    app = subprocess.Popen(
        [sys.executable, str(script), str(ready), "restart" if restart else "once"],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        wait_until(lambda: ready.exists() or app.poll() is not None, 60, "the application")
        assert app.poll() is None, "the application exited early"
        _rc, report = cli_json("status", "--interval", "0", "--dir", str(shm))
        (agent,) = report["agents"]
        totals = agent["totals"]
        prestart, stale, _late = expected
        assert (totals["prestart"], totals["stale"], totals["late_dropped"]) == expected, totals
        assert [sl["prestart"] for sl in agent["slots"] if sl["prestart"]] == ([prestart] if prestart else [])
        assert [sl["stale"] for sl in agent["slots"] if sl["stale"]] == ([stale] if stale else [])
        _rc, health = cli_json("health", "--interval", "0", "--dir", str(shm))
        (drops,) = [c for a in health["agents"] for c in a["checks"] if c["name"] == "drops"]
        figures = drops["figures"]
        assert (figures["prestart"], figures["stale"]) == (prestart, stale)
        assert figures["dropped"] == stale  # those before the agent are no loss
        text = subprocess.run(
            [sys.executable, "-m", "swmp.cli", "status", "--interval", "0", "--dir", str(shm)],
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
        if prestart:
            assert f"{prestart} records made before the agent started in their process" in text, text
        if stale:
            assert f"{stale} records written after their process gave its ring up" in text, text
    finally:
        if app.poll() is None:
            assert app.stdin is not None
            app.stdin.close()
            try:
                app.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(app.pid, signal.SIGKILL)
                app.wait()


# A span in the master before any agent (and the master never starts one), then in each worker
# one before the agent that the worker starts itself (post_fork); or the agent started in the
# master, after two spans of its own.
GUNICORN_CONFIGS = {
    "worker": """
        import swmp
        from swmp.tracing.context import new_local_span
        for _ in range(3):
            with new_local_span("in the master, before any agent"):
                pass
        control_socket_disable = True

        def post_fork(server, worker):
            with new_local_span("in the worker, before its agent"):
                pass
            swmp.start()
        """,
    "master": """
        import swmp
        from swmp.tracing.context import new_local_span
        for _ in range(2):
            with new_local_span("in the master, before the agent"):
                pass
        swmp.start()
        control_socket_disable = True
        """,
}


@pytest.mark.servers
@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["worker", "master"])
def test_gunicorn_records_before_the_agent_are_counted_per_process(tmp_path: Path, where: str) -> None:
    workers = 2
    config = tmp_path / "gunicorn_conf.py"
    config.write_text(textwrap.dedent(GUNICORN_CONFIGS[where]))
    env = agent_env(tmp_path, "127.0.0.1:1", service="ps", extra=NO_BACKEND)
    port = free_port()
    cmd = gunicorn_command(port, workers=workers, config=str(config))
    with run_server("gunicorn", tmp_path, cmd, env, port=port, workers=workers, swmp_run=False) as srv:

        def status() -> dict[str, Any]:
            _rc, report = cli_json("status", "--interval", "0", "--dir", str(srv.arena_dir))
            (agent,) = report["agents"]
            return dict(agent)

        agent = status()
        totals = agent["totals"]
        if where == "worker":
            # Each worker its own record, not the master's three (inherited at fork) as well.
            assert sorted(sl["prestart"] for sl in agent["slots"] if sl["alive"]) == [1] * workers
            assert totals["prestart"] == workers and totals["master_dropped"] == 0, totals
        else:
            wait_until(lambda: status()["totals"]["master_dropped"] == 2, 30, "the master's count")
            assert totals["prestart"] == 0, totals  # the workers, forked after the start, made none
        assert totals["stale"] == 0


def test_the_reporters_exit_line_lists_stale_records_as_lost() -> None:
    from reporter_proc.status import exit_summary

    level, message = exit_summary({"sent.segment": 5}, frozenset({"segment"}), 0, 0, 0, ring_stale=2)
    assert level == logging.WARNING and "lost 2 (stale 2)" in message, message
