"""Celery instrumentation: span shapes against a real Redis broker and a real worker.

The worker runs in this process (Celery's own test worker: the solo pool on a thread), so
the publisher's exit spans and the worker's entry spans land in one MemorySink and their
links can be checked field by field. Process-level behaviour (prefork children, recycling,
shutdown) is in tests/test_prefork_celery.py.
"""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from celery import Celery, chain, group
from celery.contrib.testing.worker import start_worker

from reporter_proc import records as R
from swmp import _sink, instrument, tracing
from swmp.config import load
from swmp.instrument import celery as celery_instr
from swmp.instrument._patch import is_patched
from swmp.tracing import Component, Kind
from swmp.tracing.constants import Layer
from swmp.tracing.context import new_entry_span
from swmp.tracing.limits import limits
from tests.daemons import ServerInfo

pytestmark = pytest.mark.timeout(120)

Seg = list[Any]
Span = list[Any]


class Flaky(RuntimeError):
    pass


def make_app(broker: str) -> Celery:
    app = Celery(f"t{uuid.uuid4().hex[:6]}", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=f"q-{uuid.uuid4().hex[:8]}",
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
    )

    @app.task(name="t.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="t.fail")
    def fail(msg: str) -> None:
        raise ValueError(msg)

    @app.task(name="t.flaky", bind=True, max_retries=2)
    def flaky(self: Any, x: int) -> int:
        if self.request.retries == 0:
            raise self.retry(exc=Flaky(f"try again {x}"), countdown=0)
        return x

    return app


@pytest.fixture(scope="module")
def setup(redis_server: ServerInfo) -> Iterator[tuple[Celery, _sink.MemorySink, ServerInfo]]:
    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    cfg = load({}, agent_log_reporter_active=False)
    tracing.configure(cfg)
    status = instrument.install_all(cfg)
    assert status["celery"] == "installed"
    app = make_app(f"redis://127.0.0.1:{redis_server.port}/3")
    # The in-process worker sets up logging as a worker does (root level ERROR, its own
    # handlers): give the next test modules the logging configuration they started with.
    root = logging.getLogger()
    saved = root.level, root.handlers[:]
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            yield app, sink, redis_server
    finally:
        instrument.uninstall_all()
        _sink.set_sink(None)
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]


@pytest.fixture()
def celery_env(
    setup: tuple[Celery, _sink.MemorySink, ServerInfo],
) -> tuple[Celery, _sink.MemorySink, ServerInfo]:
    setup[1].clear()
    celery_instr.settings.params_length = 0
    return setup


def segments(sink: _sink.MemorySink) -> list[Seg]:
    return [orjson.loads(p) for t, p in list(sink.records) if t == R.SEGMENT]


def spans_where(sink: _sink.MemorySink, pred: Callable[[Span], bool]) -> list[tuple[Seg, Span]]:
    return [(seg, s) for seg in segments(sink) for s in seg[R.SEG_SPANS] if pred(s)]


def entries(sink: _sink.MemorySink, op: str) -> list[tuple[Seg, Span]]:
    return spans_where(sink, lambda s: s[R.SPAN_TYPE] == Kind.ENTRY and s[R.SPAN_OPERATION] == op)


def exits(sink: _sink.MemorySink, op: str) -> list[tuple[Seg, Span]]:
    return spans_where(sink, lambda s: s[R.SPAN_TYPE] == Kind.EXIT and s[R.SPAN_OPERATION] == op)


def wait_for(cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def tags(span: Span) -> dict[str, str]:
    t = span[R.SPAN_TAGS] or []
    return dict(zip(t[::2], t[1::2], strict=True))


def log_fields(span: Span) -> list[dict[str, str]]:
    return [dict(zip(data[::2], data[1::2], strict=True)) for _, data in span[R.SPAN_LOGS] or []]


def linked(parent_seg: Seg, parent: Span, child: Span) -> bool:
    refs = child[R.SPAN_REFS] or []
    return len(refs) == 1 and refs[0][:4] == [
        R.REF_CROSS_PROCESS,
        parent_seg[R.SEG_TRACE_ID],
        parent_seg[R.SEG_SEGMENT_ID],
        parent[R.SPAN_ID],
    ]


# -- shapes ------------------------------------------------------------------------------------
def test_publish_exit_span_and_task_entry_span(celery_env: Any) -> None:
    app, sink, redis = celery_env
    with new_entry_span("/orders"):
        app.tasks["t.add"].delay(2, 3)
    wait_for(lambda: len(entries(sink, "celery/t.add")) == 1)

    ((pub_seg, ex),) = exits(sink, "celery/t.add")
    assert ex[R.SPAN_PEER] == f"127.0.0.1:{redis.port}"
    assert ex[R.SPAN_LAYER] == Layer.MQ
    assert ex[R.SPAN_COMPONENT] == Component.CELERY == 7011
    assert not ex[R.SPAN_IS_ERROR]
    assert tags(ex) == {"mq.broker": f"redis://127.0.0.1:{redis.port}/3"}
    assert pub_seg[R.SEG_SPANS][-1][R.SPAN_OPERATION] == "/orders"  # the exit span is the request's child

    ((run_seg, en),) = entries(sink, "celery/t.add")
    assert en[R.SPAN_LAYER] == Layer.MQ
    assert en[R.SPAN_COMPONENT] == Component.CELERY
    assert en[R.SPAN_PARENT_ID] == -1
    assert en[R.SPAN_PEER]  # the publisher's host name (from the message's origin)
    assert not en[R.SPAN_IS_ERROR]
    assert tags(en) == {"mq.broker": f"redis://127.0.0.1:{redis.port}/3"}
    assert run_seg[R.SEG_TRACE_ID] == pub_seg[R.SEG_TRACE_ID]
    assert run_seg[R.SEG_SEGMENT_ID] != pub_seg[R.SEG_SEGMENT_ID]
    assert linked(pub_seg, ex, en)
    ref = en[R.SPAN_REFS][0]
    assert "/orders" in ref and f"127.0.0.1:{redis.port}" in ref  # parent endpoint, address used


@pytest.mark.parametrize("headers", [{"mine": "kept"}, None], ids=["own-headers", "no-headers"])
def test_publish_outside_a_trace_starts_one(celery_env: Any, headers: dict[str, str] | None) -> None:
    """With headers of the caller's, ``sw8`` goes as the option; without, into the message;
    either way the send's segment (started natively for a plain new trace) is its own."""
    app, sink, _ = celery_env
    app.send_task("t.add", (1, 1), headers=headers)
    wait_for(lambda: len(entries(sink, "celery/t.add")) == 1)
    ((pub_seg, ex),) = exits(sink, "celery/t.add")
    assert len(pub_seg[R.SEG_SPANS]) == 1 and ex[R.SPAN_PARENT_ID] == -1
    ((_, en),) = entries(sink, "celery/t.add")
    assert linked(pub_seg, ex, en)


def test_user_headers_kept_and_not_mutated(celery_env: Any) -> None:
    app, sink, _ = celery_env
    seen: list[dict[str, Any]] = []

    from celery import signals

    def on_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
        seen.append(dict(headers or {}))

    signals.before_task_publish.connect(on_publish, weak=False)
    try:
        mine = {"tenant": "t1"}
        app.send_task("t.add", (1, 2), headers=mine)
        assert mine == {"tenant": "t1"}  # the caller's dict is not touched
    finally:
        signals.before_task_publish.disconnect(on_publish)
    assert seen[0]["tenant"] == "t1"
    assert seen[0]["sw8"].startswith("1-")
    wait_for(lambda: len(entries(sink, "celery/t.add")) == 1)


def test_propagation_headers_of_an_earlier_message_give_way_to_the_new_span(celery_env: Any) -> None:
    """A retry copies its request's headers: the old sw8, sw8-correlation and sw8-x must not
    survive beside the new span's (this trace has no correlation and is analysed)."""
    app, sink, _ = celery_env
    seen: list[dict[str, Any]] = []

    from celery import signals

    def on_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
        seen.append(dict(headers or {}))

    stale = {"sw8": "1-stale", "sw8-correlation": "a2V5:dmFsdWU=", "sw8-x": "1", "tenant": "t1"}
    signals.before_task_publish.connect(on_publish, weak=False)
    try:
        app.send_task("t.add", (1, 2), headers=dict(stale))
    finally:
        signals.before_task_publish.disconnect(on_publish)
    got = seen[0]
    assert got["tenant"] == "t1"
    assert got["sw8"].startswith("1-") and got["sw8"] != "1-stale"
    assert "sw8-correlation" not in got and "sw8-x" not in got
    wait_for(lambda: len(entries(sink, "celery/t.add")) == 1)


class _SendSpy:
    """Records what ``app.amqp.send_task_message`` is given (the ``headers`` option and the
    message's own headers), then sends as Celery would."""

    def __init__(self, app: Celery) -> None:
        self.real = app.amqp.send_task_message
        self.options: list[Any] = []
        self.messages: list[Any] = []
        self.headers: list[dict[str, Any]] = []  # the message's headers before Celery merges the option
        app.amqp.send_task_message = self  # an instance attribute over the cached property

    def __call__(self, producer: Any, name: str, message: Any, **options: Any) -> Any:
        self.options.append(options.get("headers"))
        self.messages.append(message)
        self.headers.append(dict(message.headers))
        return self.real(producer, name, message, **options)


def test_the_trace_goes_into_the_message_not_through_an_option(celery_env: Any) -> None:
    """Without headers of the caller's, ``sw8`` is written into the message Celery builds
    (``headers=`` through ``send_task`` cost ~6,700 instructions of keyword matching) and
    the run still continues the publish; the message is still Celery's type."""
    from celery.app import amqp

    from swmp.instrument._patch import original

    app, sink, _ = celery_env
    spy = _SendSpy(app)
    try:
        with new_entry_span("/orders"):
            app.tasks["t.add"].delay(2, 3)
    finally:
        del app.amqp.send_task_message
    wait_for(lambda: len(entries(sink, "celery/t.add")) == 1)
    assert spy.options == [None]
    (message,) = spy.messages
    assert isinstance(message, original(amqp, "task_message"))
    assert message.headers["sw8"].startswith("1-") and message.headers["task"] == "t.add"
    ((pub_seg, ex),) = exits(sink, "celery/t.add")
    ((_, en),) = entries(sink, "celery/t.add")
    assert linked(pub_seg, ex, en)
    # Outside a send, the type builds messages as Celery's does.
    plain = amqp.task_message({"a": 1}, {}, (), None)
    assert plain.headers == {"a": 1} and plain._replace(body=1).body == 1


def test_an_app_with_its_own_message_builder_gets_the_trace_as_an_option(
    celery_env: Any, caplog: Any
) -> None:
    """A custom ``amqp`` class builds its messages its own way: ``sw8`` goes as the
    ``headers`` option. An app that passes the check but builds a message past the carrier
    (no ``sw8`` in that one message) is logged once and gets the option from then on."""
    from celery.app import amqp

    from swmp.instrument import _celery_message
    from swmp.instrument._patch import original

    stock = original(amqp, "task_message")

    class OwnAMQP(amqp.AMQP):
        def as_task_v2(self, *args: Any, **kwargs: Any) -> Any:
            built = super().as_task_v2(*args, **kwargs)
            return stock(dict(built.headers), built.properties, built.body, built.sent_event)

    def sent_sw8(app: Celery, spy: _SendSpy) -> list[Any]:
        with new_entry_span("/orders"):
            app.send_task("t.add", (1, 2))
        return [(spy.options[-1] or {}).get("sw8", ""), spy.headers[-1].get("sw8", "")]

    own = Celery(f"own{uuid.uuid4().hex[:6]}", broker="memory://", amqp=OwnAMQP, set_as_current=False)
    spy = _SendSpy(own)
    option, in_message = sent_sw8(own, spy)
    assert option.startswith("1-") and in_message == ""  # the option; Celery merges it later

    class PastTheCarrier(amqp.AMQP):
        """Builds its message where the armed headers are not seen."""

        def as_task_v2(self, *args: Any, **kwargs: Any) -> Any:
            token = _celery_message._armed.set(None)
            try:
                return super().as_task_v2(*args, **kwargs)
            finally:
                _celery_message._armed.reset(token)

    # An app the check passes (its builder counted as Celery's) whose message skips the type.
    tricky = Celery(
        f"trk{uuid.uuid4().hex[:6]}", broker="memory://", amqp=PastTheCarrier, set_as_current=False
    )
    spy2 = _SendSpy(tricky)
    saved = _celery_message._builders
    _celery_message._builders = (*saved, PastTheCarrier.as_task_v2)
    try:
        with caplog.at_level(logging.WARNING, logger="swmp.instrument"):
            first = sent_sw8(tricky, spy2)
            second = sent_sw8(tricky, spy2)
            sent_sw8(tricky, spy2)
    finally:
        _celery_message._builders = saved
    assert first == ["", ""]  # that one message went without the trace
    assert second[0].startswith("1-")  # then the option
    warned = [r for r in caplog.records if "without celery.app.amqp.task_message" in r.getMessage()]
    assert len(warned) <= 1  # once per process (an earlier test may have said it already)
    assert warned or _celery_message._missed


def test_failure_is_an_error_with_the_exception(celery_env: Any) -> None:
    app, sink, _ = celery_env
    app.tasks["t.fail"].delay("no stock")
    wait_for(lambda: len(entries(sink, "celery/t.fail")) == 1)
    ((_, en),) = entries(sink, "celery/t.fail")
    assert en[R.SPAN_IS_ERROR]
    (log,) = log_fields(en)
    assert log["event"] == "error" and log["error.kind"] == "ValueError" and log["message"] == "no stock"
    assert "raise ValueError(msg)" in log["stack"]
    ((_, ex),) = exits(sink, "celery/t.fail")
    assert not ex[R.SPAN_IS_ERROR]  # publishing worked


def test_retry_is_visible_and_the_retried_run_continues_the_trace(celery_env: Any) -> None:
    app, sink, _ = celery_env
    app.tasks["t.flaky"].delay(7)
    wait_for(lambda: len(entries(sink, "celery/t.flaky")) == 2)
    runs = entries(sink, "celery/t.flaky")
    ((first_seg, first),) = [(seg, s) for seg, s in runs if "retry" in tags(s)]
    ((second_seg, second),) = [(seg, s) for seg, s in runs if "retry" not in tags(s)]
    assert first[R.SPAN_IS_ERROR]
    assert tags(first)["retry"].startswith("Retry in 0s: Flaky(")
    assert log_fields(first)[0]["error.kind"] == "Flaky"
    assert "celery.retries" not in tags(first)
    assert not second[R.SPAN_IS_ERROR]
    assert tags(second)["celery.retries"] == "1"
    # The retry was published from inside the first run: its exit span is there, and the
    # second run hangs off it, in the same trace as the original publish.
    retry_exit = [s for s in first_seg[R.SEG_SPANS] if s[R.SPAN_TYPE] == Kind.EXIT]
    assert [s[R.SPAN_OPERATION] for s in retry_exit] == ["celery/t.flaky"]
    assert linked(first_seg, retry_exit[0], second)
    assert second_seg[R.SEG_TRACE_ID] == first_seg[R.SEG_TRACE_ID]


def test_retry_without_a_publish_span_continues_the_run_not_the_original_publish(
    celery_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the span limit, the retry's publish is not recorded: the retry message must not
    carry the retried message's sw8 (Celery copies the request's headers), or the retry's run
    would hang off the original publish. It carries the run's own span instead (the
    unrecorded publish propagates from the recorded span it is under)."""
    app, sink, _ = celery_env
    monkeypatch.setattr(limits, "span_limit", 1)  # each segment: its first span only
    app.tasks["t.flaky"].delay(7)
    wait_for(lambda: len(entries(sink, "celery/t.flaky")) == 2)
    ((pub_seg, pub),) = exits(sink, "celery/t.flaky")  # the retry's publish: over the limit
    runs = entries(sink, "celery/t.flaky")
    ((first_seg, first),) = [(seg, s) for seg, s in runs if "retry" in tags(s)]
    ((second_seg, second),) = [(seg, s) for seg, s in runs if "retry" not in tags(s)]
    assert linked(pub_seg, pub, first)
    assert linked(first_seg, first, second)  # not linked(pub_seg, pub, second)
    assert pub_seg[R.SEG_TRACE_ID] == first_seg[R.SEG_TRACE_ID] == second_seg[R.SEG_TRACE_ID]


def test_ignored_retry_drops_the_retried_messages_propagation_headers(celery_env: Any) -> None:
    """The task's operation is ignored (SW_TRACE_IGNORE_PATH): no span anywhere. A message
    sent outside any task keeps the headers its caller gave (sw8 included); its retry, sent
    from the run, does not carry them on (no span is current there to propagate instead)."""
    app, sink, _ = celery_env
    from celery import signals

    with new_entry_span("/origin") as origin:
        given = {**origin.inject(), "tenant": "t1"}
    sink.clear()
    published: list[dict[str, Any]] = []
    done: list[Any] = []

    def on_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
        published.append(dict(headers or {}))

    def on_success(sender: Any = None, **_: Any) -> None:
        done.append(sender)

    signals.before_task_publish.connect(on_publish, weak=False)
    signals.task_success.connect(on_success, weak=False)
    cfg = load({}, agent_log_reporter_active=False, agent_trace_ignore_path="celery/t.flaky")
    tracing.configure(cfg)
    try:
        app.send_task("t.flaky", (7,), headers=dict(given))
        wait_for(lambda: len(done) == 1)
    finally:
        tracing.configure(load({}, agent_log_reporter_active=False))
        signals.before_task_publish.disconnect(on_publish)
        signals.task_success.disconnect(on_success)
    first, retry = published
    assert {k: first[k] for k in given} == given  # the caller's, untouched
    assert retry["retries"] == 1 and retry["tenant"] == "t1"
    assert not {"sw8", "sw8-correlation", "sw8-x"} & retry.keys()
    assert entries(sink, "celery/t.flaky") == [] and exits(sink, "celery/t.flaky") == []


def test_expired_task_is_a_revoked_error_span(celery_env: Any) -> None:
    app, sink, _ = celery_env
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    with new_entry_span("/late"):
        app.tasks["t.add"].apply_async((1, 2), expires=past)
    wait_for(lambda: len(entries(sink, "celery/t.add")) == 1)
    ((_, en),) = entries(sink, "celery/t.add")
    assert en[R.SPAN_IS_ERROR]
    assert log_fields(en) == [{"event": "revoked", "message": "expired"}]
    ((pub_seg, ex),) = exits(sink, "celery/t.add")
    assert linked(pub_seg, ex, en)


def test_canvas_every_message_has_its_exit_span(celery_env: Any) -> None:
    app, sink, _ = celery_env
    add = app.tasks["t.add"]
    with new_entry_span("/canvas"):
        group(add.s(i, i) for i in range(3)).apply_async()
        chain(add.s(1, 2), add.s(10)).apply_async()
    wait_for(lambda: len(entries(sink, "celery/t.add")) == 5)
    req_seg = next(seg for seg in segments(sink) if seg[R.SEG_SPANS][-1][R.SPAN_OPERATION] == "/canvas")
    pub_exits = [s for s in req_seg[R.SEG_SPANS] if s[R.SPAN_TYPE] == Kind.EXIT]
    assert len(pub_exits) == 4  # three group members and the chain's first task
    runs = entries(sink, "celery/t.add")
    # The chain's second task is sent by the worker when the first one finished, from
    # inside the first run's span.
    from_worker = [(seg, s) for seg, s in exits(sink, "celery/t.add") if seg != req_seg]
    assert len(from_worker) == 1
    parents = [(req_seg, e) for e in pub_exits] + from_worker
    for _, en in runs:
        assert sum(linked(pseg, pex, en) for pseg, pex in parents) == 1
    assert {seg[R.SEG_TRACE_ID] for seg, _ in runs} == {req_seg[R.SEG_TRACE_ID]}


def test_parameters_only_when_asked_and_cut(celery_env: Any) -> None:
    app, sink, _ = celery_env
    app.tasks["t.add"].delay(1, 2)
    wait_for(lambda: len(entries(sink, "celery/t.add")) == 1)
    assert all("celery.parameters" not in tags(s) for _, s in spans_where(sink, lambda s: True))

    sink.clear()
    celery_instr.settings.params_length = 12
    app.tasks["t.add"].apply_async((123456, 789), {})
    wait_for(lambda: len(entries(sink, "celery/t.add")) == 1)
    ((_, ex),) = exits(sink, "celery/t.add")
    ((_, en),) = entries(sink, "celery/t.add")
    assert tags(ex)["celery.parameters"] == "*(123456, 78"
    assert tags(en)["celery.parameters"] == "*[123456, 78"  # the worker sees a list (JSON)
    assert "*(123456, 789), **{}".startswith(tags(ex)["celery.parameters"])


def test_setting_is_read_from_config() -> None:
    cfg = load({"SW_PLUGIN_CELERY_PARAMETERS_LENGTH": "64"})
    assert cfg.plugin_celery_parameters_length == 64
    assert load({}).plugin_celery_parameters_length == 0


def test_eager_run_is_a_local_span_of_the_caller(celery_env: Any) -> None:
    app, sink, _ = celery_env
    with new_entry_span("/eager"):
        assert app.tasks["t.add"].apply((4, 5)).get() == 9
    (seg,) = segments(sink)
    ops = {s[R.SPAN_OPERATION]: s for s in seg[R.SEG_SPANS]}
    assert ops["celery/t.add"][R.SPAN_TYPE] == Kind.LOCAL
    assert ops["celery/t.add"][R.SPAN_PARENT_ID] == ops["/eager"][R.SPAN_ID]


def test_exceptions_and_results_unchanged(celery_env: Any) -> None:
    app, _, _ = celery_env
    with pytest.raises(ValueError, match="boom"):
        app.tasks["t.fail"].apply(("boom",), throw=True)
    assert app.tasks["t.add"].apply((1, 2)).get() == 3
    res = app.send_task("t.add", (1, 2), task_id="fixed-id")
    assert res.id == "fixed-id"


@pytest.mark.parametrize(
    ("broker", "peer", "tag"),
    [
        (
            "sqla+postgresql://celery:s3cret@db.internal/celery",
            "db.internal",
            "sqla+postgresql://db.internal/celery",
        ),
        (
            "sqlalchemy+postgresql://celery:s3cret@db.internal:5433/celery",
            "db.internal:5433",
            "sqlalchemy+postgresql://db.internal:5433/celery",
        ),
        # SQLAlchemy reads a password up to the '@', '/' included; kombu's masking reads
        # "1234" as a port and keeps the password. A query after the path may hold one too.
        (
            "sqla+postgresql://celery:1234/s3cret@db.internal:5433/celery?password=s3cret",
            "db.internal:5433",
            "sqla+postgresql://db.internal:5433/celery",
        ),
        ("sqla+sqlite:////var/lib/s3cret.db", "localhost", "sqla+sqlite:////var/lib/s3cret.db"),
        ("redis://:s3cret@cache.internal:6380/2", "cache.internal:6380", "redis://cache.internal:6380/2"),
        ("amqp://guest:s3cret@mq.internal//", "mq.internal:5672", "amqp://mq.internal:5672//"),
    ],
)
def test_broker_peer_and_tag_carry_no_credentials(broker: str, peer: str, tag: str) -> None:
    """A transport that parses its own URL (SQLAlchemy's) keeps it whole, password included,
    as the connection's hostname: the peer is that URL's host and port, cleaned as the tag
    is. (A file path is no secret; the SQLite case shows the peer is not the URL.)"""
    app = Celery(f"b{uuid.uuid4().hex[:6]}", broker=broker, set_as_current=False)
    got = celery_instr.broker_of(app)
    assert got == (peer, tag)
    assert "s3cret" not in got[0] and ("s3cret" not in got[1] or "sqlite" in broker)


def test_patched_and_restored(setup: Any) -> None:
    from celery import Celery as C
    from celery.app import trace

    assert is_patched(C, "send_task") and is_patched(trace, "build_tracer")
    celery_instr.uninstall()
    try:
        assert not is_patched(C, "send_task") and not is_patched(trace, "build_tracer")
    finally:
        celery_instr.install(load({}))
    assert is_patched(C, "send_task")
