"""Log calls of unusual shapes with the log integrations installed: the application's logging
behaves as without the agent, and what can be reported is."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from reporter_proc import records as R
from swmp.config import load
from swmp.instrument import log_reporter
from swmp.instrument import loguru as sw_loguru
from swmp.instrument._incoming import REPORTER_THREAD_NAME

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str, tmp_path: Path, agent: bool) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AGENT": "1" if agent else ""}
    return subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120, check=False
    )


INSTALL = """
import os
if os.environ["AGENT"]:
    from swmp import _sink
    from swmp.config import load
    from swmp.instrument import log_reporter, loguru as sw_loguru
    _sink.set_sink(_sink.MemorySink())
    cfg = load({}, agent_log_reporter_level="DEBUG")
    log_reporter.install(cfg)
    try:
        sw_loguru.install(cfg)
    except ImportError:
        pass
"""


def test_a_loguru_logger_can_still_be_handed_to_a_spawned_process(tmp_path: Path) -> None:
    """loguru's recipe for ``spawn``: the logger is pickled into the child with its sinks; the
    reporter's sink was a closure, and ``Process.start()`` failed with a pickling error."""
    pytest.importorskip("loguru")
    code = (
        INSTALL
        + """
import multiprocessing as mp
import sys
from loguru import logger

def work(lg):
    lg.info("from the child")

if __name__ == "__main__":
    logger.remove()
    logger.add(sys.stdout, enqueue=True, format="{message}", context="spawn")
    p = mp.get_context("spawn").Process(target=work, args=(logger,))
    p.start()
    p.join()
    logger.info("parent done")
    logger.complete()
    logger.remove()
    print("exit", p.exitcode)
"""
    )
    without = _run(code, tmp_path, agent=False)
    assert without.stdout == "from the child\nparent done\nexit 0\n", without.stderr
    with_agent = _run(code, tmp_path, agent=True)
    assert with_agent.stdout == without.stdout, with_agent.stderr
    assert with_agent.returncode == 0


def test_the_loguru_sink_pickles_to_an_equal_one() -> None:
    import pickle

    sink = pickle.loads(pickle.dumps(sw_loguru._Sink(True)))
    assert isinstance(sink, sw_loguru._Sink) and sink.safe_mode is True


SHAPES = (
    INSTALL
    + """
import logging
import sys

logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s %(message)s")
log = logging.getLogger("app")


class Unprintable:
    def __str__(self):
        raise RuntimeError("no text")

    def __repr__(self):
        return "Unprintable()"


log.warning("too few %s %s", 1)
log.warning("a dict %(a)s", {"a": 1})
log.warning("extra", extra={"field": 1})
log.warning(Unprintable())
log.warning("%s", Unprintable())
log.error("no exception", exc_info=True)
log.warning("%d", "not a number")
log.warning("lone \\udce9")
log.warning(None)
if os.environ["AGENT"]:
    for _, payload in _sink.get_sink().records:
        print(__import__("orjson").loads(payload)[5], file=sys.stdout)
"""
)


def test_log_calls_of_every_shape_print_as_without_the_agent(tmp_path: Path) -> None:
    """The same stderr, "--- Logging error ---" blocks included: their call stack (printed from
    the first frame outside the logging package) showed logging's frames and the hook's, and a
    message whose ``__str__`` raises was dropped with a warning of the agent's added."""
    without = _run(SHAPES, tmp_path, agent=False)
    with_agent = _run(SHAPES, tmp_path, agent=True)
    assert without.returncode == with_agent.returncode == 0, with_agent.stderr
    assert without.stderr.count("--- Logging error ---") == 4
    assert with_agent.stderr == without.stderr
    reported = with_agent.stdout.splitlines()
    assert reported[0] == "too few %s %s"  # (the raw message: its arguments do not fit)
    assert reported[3:5] == ["Unprintable()", "%s"]
    assert len(reported) == 9 + 1  # (the traceback text "NoneType: None" is a line of its own)


def test_an_unprintable_message_or_argument_is_reported_by_its_repr(trace_sink: Any) -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no text")

        def __repr__(self) -> str:
            return "Unprintable()"

    class Nothing(Unprintable):
        def __repr__(self) -> str:
            raise RuntimeError("no repr either")

    raw = log_reporter.LogReporter(formatted=False)
    made = logging.LogRecord("app", logging.WARNING, __file__, 1, Unprintable(), (Nothing(),), None)
    body, tags = raw.body_and_tags(made)
    assert body == "Unprintable()" and tags[-2:] == ["argument.0", "<unprintable Nothing object>"]
    errors = log_reporter.stats.errors
    log_reporter.LogReporter(layout="%(message)s").report(made)
    assert log_reporter.stats.errors == errors
    assert [orjson.loads(p)[5] for t, p in trace_sink.records if t == R.LOG] == ["Unprintable()"]


@pytest.fixture()
def installed(trace_sink: Any) -> Iterator[None]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.setLevel(logging.WARNING)
    log_reporter.install(load({}, agent_log_reporter_layout="%(name)s %(message)s"))
    try:
        yield
    finally:
        log_reporter.uninstall()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_a_record_logged_inside_a_handler_is_reported(trace_sink: Any, installed: None) -> None:
    """Records made while a handler runs (its own code logs, or a signal handler or finalizer
    that runs inside it) were not reported: only the record being handled must not be again."""
    forwarded = logging.getLogger("test.forwarded")
    forwarded.propagate = False

    class Shipping(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.name == "test.app":
                logging.getLogger("test.shipper").warning("retrying the log shipper")
                forwarded.handle(record)  # the same record: reported once

    shipping = Shipping()
    logging.getLogger().addHandler(shipping)
    try:
        logging.getLogger("test.app").warning("order failed")
    finally:
        logging.getLogger().removeHandler(shipping)
    bodies = [orjson.loads(p)[5] for t, p in trace_sink.records if t == R.LOG]
    assert bodies == ["test.app order failed", "test.shipper retrying the log shipper"]
    assert not log_reporter.reporting()


def test_the_reporters_own_records_are_not_reported(trace_sink: Any, installed: None) -> None:
    """In thread mode the reporter's transport libraries log on its thread (aiokafka's
    "Unable connect to ..." on every retry while the broker is down): those were reported as
    the application's, one more record to send for each failure to send."""

    def log_from(thread_name: str) -> None:
        t = threading.Thread(
            target=lambda: logging.getLogger("aiokafka").error("Unable connect to node"), name=thread_name
        )
        t.start()
        t.join()

    log_from(REPORTER_THREAD_NAME)
    log_from("app-worker")
    bodies = [orjson.loads(p)[5] for t, p in trace_sink.records if t == R.LOG]
    assert bodies == ["aiokafka Unable connect to node"]


def test_a_record_logged_inside_the_first_claim_does_not_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal handler (or finalizer) that logs while this thread claims its ring slot, the
    process's first record: the nested write waited for the claim lock, then for the arena's
    lock, that the same thread held: the process hung for good. Now the nested record is
    dropped and counted, and the claim completes."""
    import ipc.arena as ipc_arena
    from ipc import Arena, procinfo
    from swmp._arena_sink import ArenaSink
    from swmp.tracing.identity import identity

    arena = Arena.create(str(tmp_path / "t.arena"), slots=2, ring_capacity=1 << 16)
    sink = ArenaSink(arena, "svc", "base", owner_pid=os.getppid())
    record = orjson.dumps([0, "svc", "i", "", "text", "nested", "", "", -1, [], ""])
    nested: list[bool] = []
    ticks = procinfo.process_start_ticks

    def start_ticks(pid: int) -> int:  # runs inside claim_slot, under the arena's lock
        if not nested:
            nested.append(sink.write(R.LOG, record))  # what the signal handler's log call does
        return ticks(pid)

    monkeypatch.setattr(ipc_arena, "process_start_ticks", start_ticks)
    before = (identity.service, identity.instance)
    done: list[bool] = []
    t = threading.Thread(target=lambda: done.append(sink.write(R.LOG, record)), daemon=True)
    try:
        t.start()
        t.join(120)  # (a hang, not a timing: the write takes milliseconds)
        assert done == [True] and nested == [False]
        assert sink.slot == 0 and sink.role == "worker"
    finally:
        identity.set(*before)
        if not t.is_alive():
            arena.close()
