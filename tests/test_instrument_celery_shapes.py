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
