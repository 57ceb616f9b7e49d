"""The logging cookbook's listener pattern with real processes: workers log through a
``QueueHandler`` into a ``multiprocessing`` queue, and a listener process takes each record off
the queue and has it handled again (``logging.getLogger(record.name).handle(record)``). Every
process runs the log reporter: each record is reported exactly once, by the process that
made it, with that process's trace context, never again by the listener with its own."""

from __future__ import annotations

import logging
import logging.handlers
import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from reporter_proc import records as R
from swmp import _sink, tracing
from swmp.config import load
from swmp.instrument import log_reporter
from swmp.tracing import context as ctx

_fork = multiprocessing.get_context("fork")


class FileSink:
    """Records of every process, appended to one file: ``pid`` then the payload, a line each
    (what a forked process writes, the test reads)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, rtype: int, payload: bytes) -> bool:
        if rtype == R.LOG:
            line = orjson.dumps([os.getpid(), orjson.loads(payload)]) + b"\n"
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        return True

    def reports(self) -> list[tuple[int, list[Any]]]:
        if not self.path.exists():
            return []
        return [tuple(orjson.loads(line)) for line in self.path.read_bytes().splitlines()]  # type: ignore[misc]


@pytest.fixture()
def file_sink(tmp_path: Path) -> Iterator[FileSink]:
    sink = FileSink(tmp_path / "logs.jsonl")
    _sink.set_sink(sink)
    tracing.configure(load({}))
    log_reporter.install(load({}, agent_log_reporter_layout="%(name)s %(message)s"))
    try:
        yield sink
    finally:
        log_reporter.uninstall()
        _sink.set_sink(None)


def _worker(queue: Any, n: int) -> None:
    """A worker process: its loggers hand every record to the queue (the cookbook's
    worker_configurer), logged inside a trace of its own."""
    root = logging.getLogger()
    root.handlers[:] = [logging.handlers.QueueHandler(queue)]
    with ctx.new_entry_span(f"/work/{n}") as span:
        logging.getLogger("app.worker").warning("from worker %d trace %s", n, span.segment.trace_id)
    logging.getLogger("app.worker").error("from worker %d outside a trace", n)


class _Handled(logging.Handler):
    """The listener's own output: what its handlers see of each record."""

    def __init__(self, out: Any) -> None:
        super().__init__()
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        self.out.put((record.process, record.getMessage(), getattr(record, "tid", None)))


def _listener(queue: Any, out: Any) -> None:
    """The listener process: each record off the queue is handled by a logger of this
    process (the cookbook's listener_process), here inside a trace of the listener's own."""
    root = logging.getLogger()
    root.handlers[:] = [_Handled(out)]
    with ctx.new_entry_span("/listener"):
        while True:
            record = queue.get()
            if record is None:
                break
            logging.getLogger(record.name).handle(record)
    logging.getLogger("app.listener").warning("listener done")
    out.put(None)


def test_a_listener_does_not_report_records_of_other_processes_again(file_sink: FileSink) -> None:
    queue = _fork.Queue()
    out = _fork.Queue()
    listener = _fork.Process(target=_listener, args=(queue, out))
    listener.start()
    workers = [_fork.Process(target=_worker, args=(queue, n)) for n in range(3)]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
            assert w.exitcode == 0
        queue.put(None)
        handled = []
        while (item := out.get(timeout=60)) is not None:
            handled.append(item)
        listener.join(60)
        assert listener.exitcode == 0
    finally:
        for p in [*workers, listener]:
            if p.is_alive():
                p.kill()
                p.join(10)
    worker_pids = {w.pid for w in workers}
    reports = file_sink.reports()
    bodies = sorted(rec[5] for _, rec in reports)
    # Each record exactly once: the six of the workers, and the listener's own.
    assert len(bodies) == len(set(bodies)) == 7, bodies
    for pid, rec in reports:
        body, trace_id = rec[5], rec[6]
        if body == "app.listener listener done":
            assert pid == listener.pid
            continue
        assert pid in worker_pids  # reported where it was made, not by the listener
        if "outside a trace" in body:
            assert trace_id == ""
        else:
            assert body.endswith(f"trace {trace_id}") and trace_id
    # The listener's handlers still get every record, with the tid of the process that made it
    # (a worker's trace, or N/A outside one), not the listener's.
    assert len(handled) == 7
    for pid, message, tid in handled:
        if pid == listener.pid:
            continue
        assert pid in worker_pids
        assert tid == (message.rsplit(" ", 1)[1] if " trace " in message else log_reporter.NO_TRACE)


def test_a_record_of_another_process_without_a_tid_gets_no_trace_of_this_one(
    file_sink: FileSink,
) -> None:
    """A record from a process that does not run the agent (no ``tid`` on it), handled here
    inside a trace: not reported, and its ``tid`` is N/A, not this process's trace id."""
    seen: list[Any] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.tid)  # type: ignore[attr-defined]

    logger = logging.getLogger("test.received")
    logger.addHandler(Keep())
    logger.propagate = False
    try:
        record = logging.makeLogRecord(
            {"name": "test.received", "levelno": logging.ERROR, "levelname": "ERROR", "msg": "elsewhere",
             "process": os.getpid() + 1}
        )  # fmt: skip
        with ctx.new_entry_span("/here"):
            logger.handle(record)
            logger.error("made here")
    finally:
        logger.handlers.clear()
        logger.propagate = True
    assert [rec[5] for _, rec in file_sink.reports()] == ["test.received made here"]
    assert seen[0] == log_reporter.NO_TRACE and seen[1] != log_reporter.NO_TRACE
