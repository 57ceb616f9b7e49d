"""Celery instrumentation: edge cases of publishing and running, against kombu's memory
transport (the broker is not the point here) and Celery's in-process test worker (solo pool
on a thread), so the publish and run spans land in one MemorySink. The span shapes against
real brokers are in tests/test_instrument_celery.py.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from reporter_proc import records as R
from swmp import _sink, instrument, tracing
from swmp.config import load
from swmp.instrument import celery as celery_instr
from swmp.tracing import Kind
from swmp.tracing.context import new_entry_span

pytestmark = pytest.mark.timeout(120)

Seg = list[Any]
Span = list[Any]


class UnprintableInt(int):
    """An int whose text cannot be made: JSON sends it as a plain int (``int.__repr__``), but
    Celery's ``saferepr`` calls ``str()`` on it, which raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text for this one")

    __repr__ = __str__


@pytest.fixture(scope="module")
def sink() -> Iterator[_sink.MemorySink]:
    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    cfg = load({}, agent_log_reporter_active=False)
    tracing.configure(cfg)
    assert instrument.install_all(cfg)["celery"] == "installed"
    root = logging.getLogger()  # the in-process worker sets up logging as a worker does
    saved = root.level, root.handlers[:]
    try:
        yield sink
    finally:
        instrument.uninstall_all()
        _sink.set_sink(None)
        celery_instr.settings.params_length = 0
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]


def make_app(**conf: Any) -> Celery:
    app = Celery(f"s{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    app.conf.update(
        task_default_queue=f"q-{uuid.uuid4().hex[:8]}",  # the memory transport is process-wide
        task_ignore_result=True,
        **conf,
    )

    @app.task(name="t.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    return app


def segments(sink: _sink.MemorySink) -> list[Seg]:
    return [orjson.loads(p) for t, p in list(sink.records) if t == R.SEGMENT]


def spans(sink: _sink.MemorySink, kind: int, op: str) -> list[tuple[Seg, Span]]:
    return [
        (seg, s)
        for seg in segments(sink)
        for s in seg[R.SEG_SPANS]
        if s[R.SPAN_TYPE] == kind and s[R.SPAN_OPERATION] == op
    ]


def wait_for(cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def tags(span: Span) -> dict[str, str]:
    t = span[R.SPAN_TAGS] or []
    return dict(zip(t[::2], t[1::2], strict=True))


def linked(parent_seg: Seg, parent: Span, child: Span) -> bool:
    refs = child[R.SPAN_REFS] or []
    return len(refs) == 1 and refs[0][:4] == [
        R.REF_CROSS_PROCESS,
        parent_seg[R.SEG_TRACE_ID],
        parent_seg[R.SEG_SEGMENT_ID],
        parent[R.SPAN_ID],
    ]


# -- celery.parameters -------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", [1, 2])
def test_arguments_without_text_cost_the_parameters_tag_not_the_trace(
    sink: _sink.MemorySink, protocol: int
) -> None:
    """Arguments Celery sends but ``saferepr`` cannot print (protocol 1 prints none; protocol 2
    not when the caller gives ``argsrepr``): the task runs, its run continues the publish span,
    and only the parameters tag is missing. (It once failed the whole tagging step, ``sw8``
    included: the run started a trace of its own.)"""
    sink.clear()
    celery_instr.settings.params_length = 64
    app = make_app(task_protocol=protocol)
    reprs = {"argsrepr": "(2, 3)", "kwargsrepr": "{}"} if protocol == 2 else {}
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        with new_entry_span("/p"):
            app.tasks["t.add"].apply_async((UnprintableInt(2), 3), **reprs)
        wait_for(lambda: len(spans(sink, Kind.ENTRY, "celery/t.add")) == 1)
    ((pub_seg, ex),) = spans(sink, Kind.EXIT, "celery/t.add")
    ((_, en),) = spans(sink, Kind.ENTRY, "celery/t.add")
    assert linked(pub_seg, ex, en)
    assert "celery.parameters" not in tags(ex) and tags(ex)["mq.broker"]
    assert tags(en)["celery.parameters"] == "*[2, 3], **{}"  # the worker got plain ints


# -- what the task sees ------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", [1, 2])
def test_the_request_a_task_sees_is_celerys_plus_the_trace_headers(
    sink: _sink.MemorySink, protocol: int
) -> None:
    """``self.request`` (its ``headers``, ``properties`` and custom header attributes) of a run
    published by the agent is that of a run published without it, but for ``sw8``; the caller's
    own headers arrive as given. Protocol 1 carries the trace too."""
    from swmp.instrument._patch import original

    sink.clear()
    app = make_app(task_protocol=protocol)
    seen: dict[str, dict[str, Any]] = {}

    name = f"t.look{protocol}"

    @app.task(name=name, bind=True, shared=False)
    def look(self: Any, key: str) -> None:
        r = self.request
        props = {k: v for k, v in (r.properties or {}).items() if k not in ("correlation_id", "delivery_tag")}
        seen[key] = {"headers": r.headers, "properties": props, "tenant": getattr(r, "tenant", None)}

    plain_send = original(Celery, "send_task")
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        for headers in ({"tenant": "t1"}, None):
            tag = "own" if headers else "none"
            plain_send(app, name, (f"plain-{tag}",), headers=headers)
            with new_entry_span("/look"):
                look.apply_async((f"traced-{tag}",), headers=headers)
        wait_for(lambda: len(seen) == 4)
    for tag in ("own", "none"):
        plain, traced = seen[f"plain-{tag}"], seen[f"traced-{tag}"]
        assert {"sw8"} <= set(traced["headers"])
        traced["headers"] = {k: v for k, v in traced["headers"].items() if k != "sw8"}
        if plain["headers"] is None:  # protocol 2 without custom headers: None, not {}
            assert traced["headers"] == {}
            traced["headers"] = None
        assert traced == plain
    assert seen["traced-own"]["tenant"] == "t1"
    op = f"celery/{name}"
    traced_exits = [(seg, s) for seg, s in spans(sink, Kind.EXIT, op) if s[R.SPAN_PARENT_ID] == 0]
    assert len(traced_exits) == 2
    runs = spans(sink, Kind.ENTRY, f"celery/{name}")
    assert all(any(linked(seg, ex, en) for _, en in runs) for seg, ex in traced_exits)


# -- outcomes Celery has beyond success and failure --------------------------------------------
def test_reject_is_an_error_ignore_is_not_and_both_keep_celerys_states(sink: _sink.MemorySink) -> None:
    from celery.exceptions import Ignore, Reject

    sink.clear()
    app = Celery(
        f"s{uuid.uuid4().hex[:6]}", broker="memory://", backend="cache+memory://", set_as_current=False
    )
    app.conf.task_default_queue = f"q-{uuid.uuid4().hex[:8]}"

    @app.task(name="t.reject", acks_late=True)
    def reject() -> None:
        raise Reject("not for me", requeue=False)

    @app.task(name="t.ignore")
    def ignore() -> None:
        raise Ignore()

    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        with new_entry_span("/r"):
            rejected, ignored = reject.delay(), ignore.delay()
        wait_for(lambda: len(spans(sink, Kind.ENTRY, "celery/t.ignore")) == 1)
        wait_for(lambda: len(spans(sink, Kind.ENTRY, "celery/t.reject")) == 1)
        wait_for(lambda: rejected.state == "FAILURE")
        assert ignored.state == "PENDING"  # Celery stores nothing for an ignored run
    ((_, rej),) = spans(sink, Kind.ENTRY, "celery/t.reject")
    ((_, ign),) = spans(sink, Kind.ENTRY, "celery/t.ignore")
    assert rej[R.SPAN_IS_ERROR] and not ign[R.SPAN_IS_ERROR]
    assert not ign[R.SPAN_LOGS]


# -- a prefork worker --------------------------------------------------------------------------
@pytest.mark.servers
@pytest.mark.timeout(180)
def test_terminate_with_the_default_signal_is_one_span_the_runs_own(
    tmp_path: Path, redis_server: Any
) -> None:
    """``revoke(terminate=True)`` sends SIGTERM, which billiard's pool child turns into
    ``SystemExit``: the run's own span ends with it (error flag, the exception logged), and the
    main process adds no revoked span for that run (it once did: two entry spans, one publish).
    SIGKILL, which leaves the run's span unfinished, is tests/test_prefork_celery.py's case."""
    from swmp.instrument._patch import original
    from tests.celery_support import celery_env, new_queue, run_celery, worker_command
    from tests.servers import collector_process, entry_span, quiet_for, segments_of, sw8_header, wait_until

    broker, queue = f"redis://127.0.0.1:{redis_server.port}/11", new_queue()
    app = Celery(f"rv{uuid.uuid4().hex[:6]}", broker=broker, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = True
    send = original(Celery, "send_task")  # this test process sends without the agent
    marker, trace_id = tmp_path / "sleeper.pid", "e" * 32
    with collector_process(tmp_path) as col:
        env = celery_env(tmp_path, col.grpc_address, broker, queue)
        with run_celery(tmp_path, env, worker_command("prefork", 2), children=2) as worker:
            sent = send(
                app, "examples.sleep", (60, str(marker)), queue=queue, headers={"sw8": sw8_header(trace_id)}
            )
            wait_until(lambda: marker.exists() and marker.read_text().strip().isdigit(), 30, "the sleeper")
            app.control.revoke(sent.id, terminate=True)
            wait_until(lambda: f"Terminating {sent.id}" in worker.proc.log(), 30, "the revoke")
            # A later task's segment: the worker has handled what came before it.
            send(app, "examples.work", (1,), queue=queue, headers={"sw8": sw8_header("c" * 32)})
            wait_until(lambda: any(s["traceId"] == "c" * 32 for s in segments_of(col, "cel")), 30, "work")
            quiet_for(col, 2.0)
    app.close()
    runs = [seg for seg in segments_of(col, "cel") if seg["traceId"] == trace_id]
    assert len(runs) == 1, runs
    span = entry_span(runs[0])
    assert span["operationName"] == "celery/examples.sleep" and span["isError"]
    fields = {kv["key"]: kv["value"] for log in span["logs"] for kv in log["data"]}
    assert fields["error.kind"] == "SystemExit"


# -- gevent and eventlet pools ---------------------------------------------------------------------
@pytest.mark.servers
@pytest.mark.timeout(180)
@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_a_green_pools_terminated_or_timed_out_run_is_one_failed_span(
    tmp_path: Path, redis_server: Any, pool: str
) -> None:
    """A green pool runs its tasks in the worker's own process: ``revoke(terminate=True)``
    kills the run's greenlet (``GreenletExit``), whatever the signal, and gevent's hard time
    limit raises its ``Timeout`` in it. Each ends the run's own span, which must say the run
    failed, as a prefork child's ``SystemExit`` does (before: logged as interrupted, no error
    flag), and be the run's one span (before: SIGKILL added a revoked span beside it)."""
    from swmp.instrument._patch import original
    from tests.celery_support import celery_env, new_queue, run_celery, worker_command
    from tests.servers import (
        NotReady,
        collector_process,
        entry_span,
        quiet_for,
        segments_of,
        sw8_header,
        wait_until,
    )

    broker, queue = f"redis://127.0.0.1:{redis_server.port}/11", new_queue()
    app = Celery(f"gr{uuid.uuid4().hex[:6]}", broker=broker, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = True
    send = original(Celery, "send_task")  # this test process sends without the agent
    expected = {"a" * 32: "GreenletExit", "b" * 32: "GreenletExit"}  # terminated: TERM, KILL
    if pool == "gevent":
        expected["d" * 32] = "Timeout"  # its hard time limit (eventlet's pool has none)
    with collector_process(tmp_path) as col:
        env = celery_env(tmp_path, col.grpc_address, broker, queue)
        with run_celery(tmp_path, env, worker_command(pool, 4)) as worker:
            for trace_id, signal in (("a" * 32, None), ("b" * 32, "SIGKILL")):
                marker = tmp_path / f"{trace_id[0]}.pid"
                sent = send(
                    app,
                    "examples.sleep",
                    (60, str(marker)),
                    queue=queue,
                    headers={"sw8": sw8_header(trace_id)},
                )
                wait_until(lambda m=marker: m.exists() and m.read_text().strip().isdigit(), 30, "the sleeper")
                # Sent again until the worker takes it: a broadcast published before the
                # worker's control consumer listens is lost (Redis pub/sub; once in a whole-suite
                # run on the loaded machine, a gevent worker's consumer was not there yet).
                for attempt in range(12):
                    app.control.revoke(sent.id, terminate=True, signal=signal)
                    try:
                        wait_until(lambda s=sent: f"Terminating {s.id}" in worker.proc.log(), 5, "the revoke")
                        break
                    except NotReady:
                        if attempt == 11:
                            raise
            if pool == "gevent":
                send(
                    app,
                    "examples.sleep",
                    (60,),
                    queue=queue,
                    time_limit=1,
                    headers={"sw8": sw8_header("d" * 32)},
                )
            # A later task's segment: the worker has handled what came before it.
            send(app, "examples.work", (1,), queue=queue, headers={"sw8": sw8_header("c" * 32)})
            wait_until(lambda: any(s["traceId"] == "c" * 32 for s in segments_of(col, "cel")), 30, "work")
            if pool == "gevent":
                wait_until(
                    lambda: any(s["traceId"] == "d" * 32 for s in segments_of(col, "cel")), 30, "timeout"
                )
            quiet_for(col, 2.0)
    app.close()
    for trace_id, kind in expected.items():
        runs = [seg for seg in segments_of(col, "cel") if seg["traceId"] == trace_id]
        assert len(runs) == 1, (trace_id[0], runs)
        span = entry_span(runs[0])
        assert span["operationName"] == "celery/examples.sleep" and span.get("isError"), (trace_id[0], span)
        fields = {kv["key"]: kv.get("value") for log in span["logs"] for kv in log["data"]}
        assert fields["event"] == "error" and fields["error.kind"] == kind, (trace_id[0], fields)
