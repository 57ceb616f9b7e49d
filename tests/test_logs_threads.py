"""Log reporting and thread propagation in one process (fast; the Gunicorn versions are in
tests/test_logs_gunicorn.py): what is reported, exactly once, with which trace context."""

from __future__ import annotations

import contextvars
import functools
import gc
import io
import logging
import logging.config
import sys
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest

from ipc import private as ipc_private
from reporter_proc import records as R
from swmp import _sink, tracing
from swmp.config import load
from swmp.instrument import log_reporter, threads
from swmp.instrument import loguru as sw_loguru
from swmp.instrument import structlog as sw_structlog
from swmp.tracing import context as ctx


@pytest.fixture()
def reporting(trace_sink: _sink.MemorySink) -> Iterator[Any]:
    """Install the integrations with the given settings; always uninstalled afterwards."""
    installed: list[Any] = []
    root = logging.getLogger()
    saved = root.handlers[:], root.level  # the tests reconfigure logging as applications do
    root.setLevel(logging.WARNING)  # Python's default, whatever an earlier test module left

    def install(**settings: Any) -> None:
        settings.setdefault("agent_log_reporter_layout", "%(levelname)s %(name)s %(message)s")
        cfg = load({}, **settings)
        for mod in (log_reporter, sw_loguru, sw_structlog, threads):
            mod.install(cfg)
            installed.append(mod)

    yield install
    for mod in installed:
        mod.uninstall()
    root.handlers[:], _ = saved
    root.setLevel(saved[1])


def logs(sink: _sink.MemorySink) -> list[list[Any]]:
    return [orjson.loads(p) for t, p in sink.records if t == R.LOG]


def bodies(sink: _sink.MemorySink) -> list[str]:
    return [rec[5] for rec in logs(sink)]


def segments(sink: _sink.MemorySink) -> list[list[Any]]:
    return [orjson.loads(p) for t, p in sink.records if t == R.SEGMENT]


# -- stdlib logging ----------------------------------------------------------------------------
def test_reported_once_whatever_the_logging_configuration(
    trace_sink: _sink.MemorySink, reporting: Any
) -> None:
    reporting()
    app = logging.getLogger("test.app")
    logging.config.dictConfig(
        {"version": 1, "disable_existing_loggers": False, "root": {"level": "INFO", "handlers": []}}
    )
    app.warning("after dictConfig")
    stream = io.StringIO()
    logging.basicConfig(force=True, stream=stream, format="%(tid)s|%(message)s")
    app.warning("after basicConfig")
    logging.getLogger().handlers.clear()
    app.warning("after a reset")
    quiet = logging.getLogger("test.quiet")
    quiet.propagate = False
    quiet.warning("not propagated")
    app.info("below the reporter's level")
    logging.getLogger("swmp.internal").error("the agent's own")
    logging.getLogger("swmp").error("the agent's own")
    ipc_logger = logging.getLogger("ipc")  # as an application's would be (tests quiet it)
    saved_level, saved_disabled = ipc_logger.level, ipc_logger.disabled
    ipc_logger.setLevel(logging.NOTSET)
    ipc_logger.disabled = False
    try:
        ipc_private._warn_once(f"test {id(trace_sink)}", "the shared-memory package's own")
        ipc_logger.error("an application's logger named ipc")
        logging.getLogger("ipc.server").error("and one under it")
    finally:
        ipc_logger.setLevel(saved_level)
        ipc_logger.disabled = saved_disabled
    logging.getLogger("swmpish").error("a name that only starts like ours")
    assert bodies(trace_sink) == [
        "WARNING test.app after dictConfig",
        "WARNING test.app after basicConfig",
        "WARNING test.app after a reset",
        "WARNING test.quiet not propagated",
        "ERROR ipc an application's logger named ipc",
        "ERROR ipc.server and one under it",
        "ERROR swmpish a name that only starts like ours",
    ]
    assert stream.getvalue() == "N/A|after basicConfig\n"  # %(tid)s outside a trace


def test_the_applications_handlers_format_the_record_their_own_way(
    trace_sink: _sink.MemorySink, reporting: Any
) -> None:
    """The reporter formats a record before the application's handlers see it; what it
    formats stays its own: a handler's own ``formatException`` and a filter that drops
    ``exc_info`` give the output they give without the agent."""
    reporting()

    class OneLine(logging.Formatter):
        def formatException(self, ei: Any) -> str:
            return f"EXC={ei[1]!r}"

    def no_traceback(record: logging.LogRecord) -> bool:
        record.exc_info = None
        return True

    app = logging.getLogger("test.exc")
    one_line, quiet = io.StringIO(), io.StringIO()
    first = logging.StreamHandler(one_line)
    first.setFormatter(OneLine("%(levelname)s %(message)s"))
    second = logging.StreamHandler(quiet)
    second.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    second.addFilter(no_traceback)
    app.addHandler(first)
    try:
        try:
            1 / 0  # noqa: B018
        except ZeroDivisionError:
            app.exception("boom")
        app.removeHandler(first)
        app.addHandler(second)
        try:
            {}["k"]
        except KeyError:
            app.exception("failed")
    finally:
        app.removeHandler(first)
        app.removeHandler(second)
    assert one_line.getvalue() == "ERROR boom\nEXC=ZeroDivisionError('division by zero')\n"
    assert quiet.getvalue() == "ERROR failed\n"
    reported = bodies(trace_sink)
    assert reported[0].startswith("ERROR test.exc boom\nTraceback") and "KeyError" in reported[1]


def test_trace_context_and_the_tid_attribute(trace_sink: _sink.MemorySink, reporting: Any) -> None:
    reporting(agent_log_reporter_layout="%(tid)s %(message)s")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("[%(tid)s] %(message)s"))
    app = logging.getLogger("test.tid")
    app.addHandler(handler)
    try:
        with ctx.new_entry_span("/checkout") as span:
            app.warning("paid")
            app.warning("mine", extra={"tid": "set-by-the-app"})
        tid = span.segment.trace_id
    finally:
        app.removeHandler(handler)
    first, second = logs(trace_sink)
    assert first[5] == f"{tid} paid" and first[6] == tid and first[7] == span.segment.segment_id
    assert first[3] == "/checkout" and first[8] == 0
    assert second[5] == "set-by-the-app mine" and second[6] == tid  # the context is still ours
    assert stream.getvalue() == f"[{tid}] paid\n[set-by-the-app] mine\n"


def test_filters_are_honoured_unless_ignore_filter(trace_sink: _sink.MemorySink, reporting: Any) -> None:
    reporting(agent_log_reporter_ignore_filter=True)
    app = logging.getLogger("test.filtered")
    app.addFilter(lambda r: "secret" not in r.getMessage())
    try:
        app.warning("a secret")
        app.disabled = True
        app.warning("disabled logger")
    finally:
        app.disabled = False
        app.filters.clear()
    assert bodies(trace_sink) == ["WARNING test.filtered a secret"]
    log_reporter.uninstall()
    log_reporter.install(load({}))  # default: filters apply
    app.addFilter(lambda r: "secret" not in r.getMessage())
    try:
        app.warning("another secret")
    finally:
        app.filters.clear()
    assert len(logs(trace_sink)) == 1


def test_a_bad_layout_is_reported_once_and_replaced(
    trace_sink: _sink.MemorySink, caplog: pytest.LogCaptureFixture
) -> None:
    for layout in ("%(message", "%(no_such_field)s %(message)s", "no fields at all"):
        caplog.clear()
        reporter = log_reporter.LogReporter(logging.WARNING, layout)
        assert reporter.formatter._fmt == log_reporter.DEFAULT_LAYOUT
        assert sum("cannot format log records" in r.getMessage() for r in caplog.records) == 1
    # A record that cannot be formatted at all (bad arguments) is still reported.
    rec = logging.LogRecord("test.bad", logging.ERROR, __file__, 1, "%d items", ("many",), None)
    log_reporter.LogReporter(logging.WARNING, "%(message)s").report(rec)
    assert bodies(trace_sink) == ["%d items"]
    assert log_reporter.stats.layout_fallbacks >= 1


def test_text_that_is_not_utf8_is_reported_escaped(trace_sink: _sink.MemorySink, reporting: Any) -> None:
    """Lone surrogates (bytes decoded with "surrogateescape": file names, argv, environ) in
    the message or a tag: the record is reported with them escaped, not dropped."""
    from loguru import logger

    reporting()
    logger.remove()
    logger.add(io.StringIO(), level="INFO")
    errors = log_reporter.stats.errors
    name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")
    try:
        logging.getLogger("test.files").warning("cannot open %s", name)
        threading.current_thread().name, saved = name, threading.current_thread().name
        try:
            logger.warning("loguru: {}", name)
        finally:
            threading.current_thread().name = saved
    finally:
        logger.remove()
        logger.add(io.StringIO())
    got = logs(trace_sink)
    assert [r[5] for r in got] == ["WARNING test.files cannot open caf\\udce9.txt", "loguru: caf\\udce9.txt"]
    assert got[1][9][5] == "caf\\udce9.txt"  # the thread tag
    assert log_reporter.stats.errors == errors


def test_tag_values_are_limited_like_the_body(trace_sink: _sink.MemorySink) -> None:
    """SW_AGENT_LOG_VALUE_MAX_LENGTH bounds every value: with FORMATTED=false an argument or
    a stack is a tag, and a huge one filled the ring (or the backend's message) alone."""
    tracing.configure(load({}, agent_log_value_max_length=100))
    reporter = log_reporter.LogReporter(logging.WARNING, None, formatted=False)
    try:
        raise ValueError("v" * 1000)
    except ValueError:
        exc = sys.exc_info()
    rec = logging.LogRecord("test.big", logging.ERROR, __file__, 1, "m" * 1000 + " %s", ("a" * 1000,), exc)
    try:
        reporter.report(rec)
    finally:
        tracing.configure(load({}))
    (got,) = logs(trace_sink)
    assert len(got[5]) == 100
    tags = dict(zip(got[9][::2], got[9][1::2], strict=True))
    assert tags["argument.0"] == "a" * 100
    assert len(tags["exception"]) == 100 and tags["exception"].startswith("Traceback")


def test_exc_info_without_an_exception_adds_no_exception_tag(
    trace_sink: _sink.MemorySink, reporting: Any
) -> None:
    """With SW_AGENT_LOG_REPORTER_FORMATTED=false the stack is the tag ``exception``;
    ``exc_info=True`` outside an exception (``sys.exc_info()`` is ``(None, None, None)``) has
    none, and gave the tag the text ``NoneType: None``. Inside one the tag is still there."""
    reporting(agent_log_reporter_formatted=False)
    logger = logging.getLogger("test.excinfo")
    logger.error("no exception here", exc_info=True)
    try:
        raise KeyError("k")
    except KeyError:
        logger.error("an exception here", exc_info=True)
    got = logs(trace_sink)
    assert [r[5] for r in got] == ["no exception here", "an exception here"]
    assert got[0][9] == ["level", "ERROR", "logger", "test.excinfo", "thread", "MainThread"]
    tags = dict(zip(got[1][9][::2], got[1][9][1::2], strict=True))
    assert tags["exception"].startswith("Traceback") and "KeyError" in tags["exception"]


# -- loguru and structlog ----------------------------------------------------------------------
def test_loguru_through_its_api_after_remove_and_no_double_report(
    trace_sink: _sink.MemorySink, reporting: Any
) -> None:
    from loguru import logger

    reporting()
    logger.remove()  # the usual start of an application's loguru set-up
    out = io.StringIO()
    logger.add(out, level="INFO", format="{message}")

    class InterceptHandler(logging.Handler):  # stdlib -> loguru, as loguru's docs show
        def emit(self, record: logging.LogRecord) -> None:
            logger.opt(depth=6).log(record.levelname, record.getMessage())

    fwd = logging.getLogger("test.forwarded")
    fwd.addHandler(InterceptHandler())
    fwd.propagate = False
    try:
        with ctx.new_entry_span("/l") as span:
            logger.warning("from loguru {}", 1)
            logger.info("below the level")
            fwd.warning("from the stdlib")
        try:
            raise KeyError("k")
        except KeyError:
            logger.exception("failed")
    finally:
        fwd.handlers.clear()
        logger.remove()
        logger.add(io.StringIO())
    got = logs(trace_sink)
    assert [r[5] for r in got] == ["from loguru 1", "WARNING test.forwarded from the stdlib", "failed"]
    assert got[0][6] == span.segment.trace_id and got[1][6] == span.segment.trace_id
    assert got[0][9][:6] == ["level", "WARNING", "logger", "loguru", "thread", "MainThread"]
    assert "KeyError" in got[2][9][got[2][9].index("exception") + 1]
    assert "from loguru 1" in out.getvalue()  # the application's trace_sink still works


def test_loguru_sink_does_not_widen_what_the_application_logs(
    trace_sink: _sink.MemorySink, reporting: Any
) -> None:
    """Below the application's sinks' level loguru must not format or call lazy arguments."""
    from loguru import logger

    reporting()
    called: list[str] = []

    def expensive() -> str:
        called.append("called")
        return "value"

    logger.remove()
    out = io.StringIO()
    errors_only = logger.add(out, level="ERROR", format="{message}")
    try:
        logger.warning("{0} {1}", "one argument for two fields")  # loguru would raise formatting it
        logger.opt(lazy=True).warning("lazy {}", expensive)
        logger.error("an error {}", 1)
        assert called == []
        assert bodies(trace_sink) == ["an error 1"]  # a WARNING the application drops is not reported
        logger.remove(errors_only)
        logger.configure(handlers=[{"sink": out, "level": "DEBUG", "format": "{message}"}])
        logger.opt(lazy=True).warning("lazy {}", expensive)  # the application takes it now
        logger.info("info, below the reporter's level")
        assert called == ["called"]
        assert bodies(trace_sink) == ["an error 1", "lazy value"]
        logger.remove()
        logger.warning("{0} {1}", "no trace_sink of the application's")  # nothing formats it
        assert bodies(trace_sink) == ["an error 1", "lazy value"]
    finally:
        logger.remove()
        logger.add(io.StringIO())
    assert "info, below" in out.getvalue()


def test_structlog_through_its_api(trace_sink: _sink.MemorySink, reporting: Any) -> None:
    import structlog

    reporting()
    out = io.StringIO()
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    try:
        log = structlog.get_logger()
        with ctx.new_entry_span("/s") as span:
            log.warning("paid", amount=3)
            log.info("below the level")
        structlog.configure(
            processors=[structlog.stdlib.render_to_log_kwargs],
            logger_factory=structlog.stdlib.LoggerFactory(),
            wrapper_class=structlog.stdlib.BoundLogger,
        )
        structlog.get_logger("test.viastdlib").warning("via the stdlib")  # reported once, as stdlib
    finally:
        structlog.reset_defaults()
    got = logs(trace_sink)
    assert len(got) == 2
    assert orjson.loads(got[0][5]) == {"event": "paid", "amount": 3, "level": "warning"}
    assert got[0][6] == span.segment.trace_id and got[0][9][3] == "structlog"
    assert got[1][5] == "WARNING test.viastdlib via the stdlib"
    assert '"paid"' in out.getvalue()


def test_structlog_events_orjson_refuses(
    trace_sink: _sink.MemorySink, reporting: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An event dict with a tuple key or text that is not UTF-8 was skipped silently: it is
    reported with those as (escaped) text. One that still cannot be encoded (a dict that
    holds itself) is counted with the log reporter's errors and said once, as in the
    stdlib path; the application's logger gets every event as before."""
    import structlog

    reporting()
    seen: list[dict[str, Any]] = []

    class AppLogger:
        def warning(self, **event: Any) -> None:
            seen.append(event)

    structlog.configure(
        processors=[structlog.processors.add_log_level],  # the event dict is the final result
        logger_factory=lambda *args: AppLogger(),
        cache_logger_on_first_use=False,
    )
    errors = log_reporter.stats.errors
    log_reporter._warned.discard("build")  # said once per process: maybe already, by another test
    loop: dict[str, Any] = {}
    loop["self"] = loop
    try:
        log = structlog.get_logger()
        log.warning("by cell", cells={(1, 2): "v"})
        log.warning("file", path=b"caf\xff".decode("utf-8", "surrogateescape"))
        log.warning("loop", data=loop)
        log.warning("loop again", data=loop)
    finally:
        structlog.reset_defaults()
    assert [orjson.loads(b) for b in bodies(trace_sink)] == [
        {"event": "by cell", "cells": {"(1, 2)": "v"}, "level": "warning"},
        {"event": "file", "path": "caf\\udcff", "level": "warning"},
    ]
    assert [e["event"] for e in seen] == ["by cell", "file", "loop", "loop again"]
    assert log_reporter.stats.errors == errors + 2
    assert sum("cannot build a log record" in r.getMessage() for r in caplog.records) == 1


# -- threads -----------------------------------------------------------------------------------
def _child_span(name: str) -> None:
    with ctx.new_local_span(name):
        logging.getLogger("test.threads").warning(name)


def test_threads_and_pool_work_continue_the_trace(trace_sink: _sink.MemorySink, reporting: Any) -> None:
    reporting()
    with ThreadPoolExecutor(max_workers=1) as pool:
        with ctx.new_entry_span("/a") as a:
            t = threading.Thread(target=_child_span, args=("thread-a",))
            t.start()
            t.join()
            pool.submit(_child_span, "pool-a").result()
            pool.submit(logging.getLogger("test.threads").warning, "no span in the pool").result()
        with ctx.new_entry_span("/b") as b:
            pool.submit(_child_span, "pool-b").result()  # the same worker thread: now trace b
        pool.submit(_child_span, "pool-none").result()  # outside any trace: a trace of its own
    by_op = {seg[R.SEG_SPANS][0][R.SPAN_OPERATION]: seg for seg in segments(trace_sink)}
    for op, parent in (("thread-a", a), ("pool-a", a), ("pool-b", b)):
        seg = by_op[op]
        assert seg[R.SEG_TRACE_ID] == parent.segment.trace_id, op
        (ref,) = seg[R.SEG_SPANS][0][R.SPAN_REFS]
        assert ref[0] == 1 and ref[2] == parent.segment.segment_id and ref[3] == parent.span_id, op
    assert by_op["pool-none"][R.SEG_SPANS][0][R.SPAN_REFS] == []
    assert by_op["pool-none"][R.SEG_TRACE_ID] not in (a.segment.trace_id, b.segment.trace_id)
    # A log in a pool work item with no span of its own carries the submitting span.
    (plain,) = [r for r in logs(trace_sink) if r[5].endswith("no span in the pool")]
    assert plain[6] == a.segment.trace_id and plain[7] == a.segment.segment_id


def test_a_finished_thread_started_in_a_trace_is_freed_without_the_collector(
    trace_sink: _sink.MemorySink, reporting: Any
) -> None:
    """The wrapper that carries the trace into a thread hangs on the thread only while it
    runs: a finished thread is freed by its reference count, as without the agent (not left
    in a cycle for the garbage collector), and a ``run`` of the thread's own is given back."""
    reporting()

    class Own(threading.Thread):
        pass

    gc.disable()
    try:
        with ctx.new_entry_span("/a"):
            plain = threading.Thread(target=_child_span, args=("thread-free",))
            plain.start()
            plain.join()
            own = Own(target=_child_span, args=("thread-own",))
            own_run = own.run = functools.partial(_child_span, "thread-own")  # type: ignore[method-assign]
            own.start()
            own.join()
        assert own.run is own_run and "run" not in plain.__dict__
        gone = weakref.ref(plain)
        del plain
        assert gone() is None
    finally:
        gc.enable()
    assert {seg[R.SEG_SPANS][0][R.SPAN_OPERATION] for seg in segments(trace_sink)} >= {
        "thread-free",
        "thread-own",
    }


def test_work_run_in_a_copy_of_the_callers_context_stays_in_its_segment(
    trace_sink: _sink.MemorySink, reporting: Any
) -> None:
    """``asyncio.to_thread`` and asgiref's ``sync_to_async`` (Django's ASGI views) run the
    function in a copy of the caller's context, where the caller's span is current: its spans
    are children in the caller's segment. The pool's submit adds no snapshot (it would be
    set outside that copy, for nothing); a plain submit from the same coroutine still does."""
    import asyncio

    from asgiref.sync import SyncToAsync, sync_to_async

    reporting()
    wrapped: list[str] = []
    submit = threads._make_submit(lambda self, fn, *a, **k: wrapped.append(fn.__class__.__name__))

    async def main() -> Any:
        with ctx.new_entry_span("/async") as entry:
            await asyncio.to_thread(_child_span, "to-thread")
            await sync_to_async(_child_span, thread_sensitive=False)("sync-to-async")
            await sync_to_async(_child_span)("thread-sensitive")
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, _child_span, "run-in-executor")
            submit(None, lambda: None)  # a plain work item: wrapped
            submit(None, functools.partial(_child_span, "x"))  # a plain partial: wrapped
            # What to_thread and sync_to_async submit: passed through as they are.
            submit(None, functools.partial(contextvars.copy_context().run, _child_span, "x"))
            submit(None, functools.partial(SyncToAsync(_child_span).thread_handler, None))
        return entry

    entry = asyncio.run(main())
    assert wrapped == ["function", "function", "partial", "partial"]
    segs = segments(trace_sink)
    (seg,) = [s for s in segs if s[R.SEG_SPANS][-1][R.SPAN_OPERATION] == "/async"]
    children = {sp[R.SPAN_OPERATION]: sp for sp in seg[R.SEG_SPANS][:-1]}
    assert set(children) == {"to-thread", "sync-to-async", "thread-sensitive"}
    assert all(sp[R.SPAN_PARENT_ID] == entry.span_id for sp in children.values())
    # run_in_executor copies no context: the work item continues the trace across threads.
    (other,) = [s for s in segs if s[R.SEG_SPANS][0][R.SPAN_OPERATION] == "run-in-executor"]
    assert other[R.SEG_TRACE_ID] == entry.segment.trace_id
    assert other[R.SEG_SPANS][0][R.SPAN_REFS][0][2] == entry.segment.segment_id


def test_grpc_threads_carry_their_own_context(trace_sink: _sink.MemorySink, reporting: Any) -> None:
    """grpc starts its threads (a sync channel's spin thread, on the first call after it
    went idle) through ``ForkManagedThread``, whose target runs in a copy of the starting
    context: no snapshot is added (the thread's ``run`` is its class's), and a span its
    target opens is still a child of the span that was current where it started. The
    server's ``submit(context.run, ...)`` is passed through the same way."""
    from grpc._cython import cygrpc

    reporting()
    wrapped: list[Any] = []
    submit = threads._make_submit(lambda self, fn, *a, **k: wrapped.append(fn))
    with ctx.new_entry_span("/grpc-call") as entry:
        managed = cygrpc.ForkManagedThread(target=_child_span, args=("grpc-thread",))
        managed.start()
        managed.join()
        plain = threading.Thread(target=_child_span, args=("plain-thread",))
        plain.start()
        plain.join()
        copied = contextvars.copy_context()
        submit(None, copied.run, _child_span, "x")
        submit(None, _child_span, "x")
    # (Which thread got a snapshot shows in the segments below: the managed thread's span is
    # in the starting segment, the plain thread's in one of its own, referring to it.)
    assert wrapped[0] == copied.run and wrapped[1] is not _child_span
    segs = segments(trace_sink)
    (seg,) = [s for s in segs if s[R.SEG_SPANS][-1][R.SPAN_OPERATION] == "/grpc-call"]
    (child,) = [sp for sp in seg[R.SEG_SPANS] if sp[R.SPAN_OPERATION] == "grpc-thread"]
    assert child[R.SPAN_PARENT_ID] == entry.span_id
    (other,) = [s for s in segs if s[R.SEG_SPANS][0][R.SPAN_OPERATION] == "plain-thread"]
    assert other[R.SEG_SPANS][0][R.SPAN_REFS][0][2] == entry.segment.segment_id


def test_thread_propagation_can_be_turned_off(trace_sink: _sink.MemorySink, reporting: Any) -> None:
    reporting(agent_thread_propagation=False)
    with ctx.new_entry_span("/a") as a:
        t = threading.Thread(target=_child_span, args=("thread-off",))
        t.start()
        t.join()
    (seg,) = [s for s in segments(trace_sink) if s[R.SEG_SPANS][0][R.SPAN_OPERATION] == "thread-off"]
    assert seg[R.SEG_TRACE_ID] != a.segment.trace_id and seg[R.SEG_SPANS][0][R.SPAN_REFS] == []


def test_reporting_off_keeps_the_tid_attribute(trace_sink: _sink.MemorySink, reporting: Any) -> None:
    reporting(agent_log_reporter_active=False)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(tid)s %(message)s"))
    app = logging.getLogger("test.off")
    app.addHandler(handler)
    try:
        with ctx.new_entry_span("/off") as span:
            app.warning("kept")
    finally:
        app.removeHandler(handler)
    assert stream.getvalue() == f"{span.segment.trace_id} kept\n"
    assert logs(trace_sink) == []
