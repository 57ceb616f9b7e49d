"""The native Celery publish (``CelerySend``, swmp/_native/celery.c) does what the Python
wrapper (``swmp.instrument.celery._py_send_task``) does, for every shape of publish it takes
and every one it hands back: each case runs once with ``Celery.send_task`` patched with each
form, against kombu's in-memory broker, and the recorded segments (fields, tags, logs) and
the headers of the message the broker got are compared; the caller's results and exceptions
are the original's. Also: a native publish leaks nothing (objects, memory) over thousands
of sends."""

from __future__ import annotations

import gc
import logging
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from celery import Celery, signals
from celery.app import amqp

from reporter_proc import records as R
from swmp import _sink, instrument, tracing
from swmp.config import load
from swmp.instrument import _celery_message, _mq
from swmp.instrument import celery as instr
from swmp.instrument._patch import ORIGINAL, is_patched, original
from swmp.tracing.context import new_entry_span, new_exit_span
from swmp.tracing.limits import limits
from swmp.tracing.span import NATIVE

pytestmark = pytest.mark.skipif(
    not NATIVE or instr._CelerySend is None, reason="the native core is not built"
)

FORMS = ("native", "python")


def make_app(name: str = "", *, amqp_cls: Any = None) -> Celery:
    app = Celery(
        f"{name or 'n'}{uuid.uuid4().hex[:6]}",
        broker="memory://",
        set_as_current=False,
        **({"amqp": amqp_cls} if amqp_cls is not None else {}),
    )
    app.conf.update(task_default_queue=f"q-{uuid.uuid4().hex[:8]}", task_ignore_result=True)
    return app


class Harness:
    """The instrumentation installed with a MemorySink; :meth:`run` a case with one form."""

    def __init__(self) -> None:
        self.sink = _sink.MemorySink()
        self.cfg = load({}, agent_log_reporter_active=False, agent_trace_ignore_path="celery/n.ignored")
        _sink.set_sink(self.sink)
        tracing.configure(self.cfg)
        assert instrument.install_one("swmp.instrument.celery", self.cfg)[1] == "installed"
        self.installed = Celery.__dict__["send_task"]
        self.handed: list[Any] = []  # the native form's calls handed to the Python form
        self.orig = original(Celery, "send_task")

    def use(self, form: str, app: Celery | None = None) -> None:
        """``Celery.send_task`` patched with ``form``: a new wrapper whose state says ``app``
        (default: APP) sent last, as the Python form leaves it after a first send, so that
        the cases' sends are the native form's own (the first send through an app is always
        the Python form's). Calls the native form hands to the Python one are counted."""
        app = APP if app is None else app
        send_task, last = instr._py_send_task(self.orig)
        last[0] = (app, *instr.broker_of(app), _celery_message.builds_stock_messages(app))
        if form == "native":
            handed = self.handed = []

            def fallback(*args: Any, **kwargs: Any) -> Any:
                handed.append(args[1] if len(args) > 1 else None)
                return send_task(*args, **kwargs)

            wrapper: Any = instr._CelerySend(fallback, self.orig, last)
        else:
            wrapper = send_task
        setattr(wrapper, ORIGINAL, self.orig)
        Celery.send_task = wrapper

    def run(
        self, form: str, case: Callable[[], Any], app: Celery | None = None
    ) -> tuple[Any, list[Any], list[dict[str, Any]]]:
        """``(what the case returned or raised, segments, headers of each message sent)``."""
        self.use(form, app)
        self.sink.clear()
        published: list[dict[str, Any]] = []

        def on_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
            published.append(dict(headers or {}))

        signals.before_task_publish.connect(on_publish, weak=False)
        try:
            try:
                outcome: Any = ("returned", case())
            except Exception as e:  # what the caller gets
                outcome = ("raised", e)
        finally:
            signals.before_task_publish.disconnect(on_publish)
        segs = [orjson.loads(p) for t, p in list(self.sink.records) if t == R.SEGMENT]
        return outcome, segs, published

    def close(self) -> None:
        Celery.send_task = self.installed
        instrument.uninstall_all()
        _sink.set_sink(None)
        tracing.configure(load({}))


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    h = Harness()
    try:
        yield h
    finally:
        h.close()


@pytest.fixture(autouse=True)
def _settings() -> Iterator[None]:
    saved = instr.settings.params_length, limits.tag_value_max
    yield
    instr.settings.params_length, limits.tag_value_max = saved


def _span_shape(seg: list[Any], span: list[Any]) -> list[Any]:
    """A span's fields without times and ids (the ids' structure is checked by the links)."""
    logs = [
        {k: v for k, v in zip(data[::2], data[1::2], strict=True) if k != "stack"}
        for _, data in span[R.SPAN_LOGS] or []
    ]
    return [
        span[R.SPAN_ID],
        span[R.SPAN_PARENT_ID],
        span[R.SPAN_OPERATION],
        span[R.SPAN_PEER],
        span[R.SPAN_TYPE],
        span[R.SPAN_LAYER],
        span[R.SPAN_COMPONENT],
        span[R.SPAN_IS_ERROR],
        span[R.SPAN_TAGS],
        logs,
        span[R.SPAN_REFS],
    ]


def _sw8_fields(value: str, segs: list[Any]) -> list[Any]:
    """An ``sw8`` header with the trace and segment ids named by the segment they are of."""
    parts = value.split("-")
    names = {seg[R.SEG_TRACE_ID]: f"trace{i}" for i, seg in enumerate(segs)}
    names.update({seg[R.SEG_SEGMENT_ID]: f"segment{i}" for i, seg in enumerate(segs)})
    import base64

    decoded = [base64.b64decode(p).decode() if i in (1, 2, 4, 5, 6, 7) else p for i, p in enumerate(parts)]
    return [names.get(d, d) for d in decoded]


def _normalised(result: tuple[Any, list[Any], list[dict[str, Any]]]) -> Any:
    outcome, segs, published = result
    kind, value = outcome
    if kind == "raised":
        value = (type(value).__name__, str(value))
    else:  # AsyncResults: their ids are the tasks', new each run
        value = [type(v).__name__ for v in value] if isinstance(value, list) else type(value).__name__
    shapes = [[_span_shape(seg, s) for s in seg[R.SEG_SPANS]] for seg in segs]
    headers = [
        {
            k: (_sw8_fields(v, segs) if k == "sw8" else v)
            for k, v in h.items()
            if k in ("sw8", "sw8-correlation", "sw8-x", "mine", "tenant", "task")
        }
        for h in published
    ]
    return kind, value, shapes, headers


def both(harness: Harness, case: Callable[[], Any], app: Celery | None = None) -> Any:
    """The case under each form; asserts they agree and returns the native form's result."""
    got = {form: harness.run(form, case, app) for form in FORMS}
    native, python = (_normalised(got[f]) for f in FORMS)
    assert native == python
    return got["native"]


# -- the cases -----------------------------------------------------------------------------------
APP = make_app("main")


@APP.task(name="n.add")
def add(x: int, y: int) -> int:
    return x + y


OTHER = make_app("other")


class Name(str):
    """A task name that is a str subclass: the Python form's."""


def _in_request(fn: Callable[[], Any]) -> Callable[[], Any]:
    def case() -> Any:
        with new_entry_span("/orders"):
            return fn()

    return case


def _inside_exit(fn: Callable[[], Any]) -> Any:
    with new_exit_span("redis/GET", "cache:6379"):
        return fn()


CASES: dict[str, Callable[[], Any]] = {
    "delay in a request": _in_request(lambda: APP.tasks["n.add"].delay(2, 3)),
    "apply_async in a request": _in_request(lambda: APP.tasks["n.add"].apply_async((2, 3), countdown=None)),
    "send_task positional": _in_request(lambda: APP.send_task("n.add", (1, 2), {})),
    "send_task args keyword": _in_request(lambda: APP.send_task("n.add", args=(1, 2), kwargs={})),
    "send_task alone": lambda: APP.send_task("n.add", (1, 2)),
    "send_task twice alone": lambda: [APP.send_task("n.add", (1, 2)), APP.send_task("n.add", (3, 4))],
    "two apps alternating": _in_request(
        lambda: [
            APP.send_task("n.add", (1, 2)),
            OTHER.send_task("n.add", (1, 2)),
            APP.send_task("n.add", (1, 2)),
        ]
    ),
    "own headers": _in_request(lambda: APP.send_task("n.add", (1, 2), headers={"mine": "kept"})),
    "own headers, built at run time": _in_request(
        lambda: APP.send_task("n.add", (1, 2), **{"".join(["head", "ers"]): {"mine": "kept"}})
    ),
    "keyword built at run time": _in_request(
        lambda: APP.send_task("n.add", (1, 2), **{"".join(["count", "down"]): None})
    ),
    "empty headers": _in_request(lambda: APP.send_task("n.add", (1, 2), headers={})),
    "stale propagation headers": _in_request(
        lambda: APP.send_task("n.add", (1, 2), headers={"sw8": "1-stale", "sw8-x": "1", "tenant": "t1"})
    ),
    "name a str subclass": _in_request(lambda: APP.send_task(Name("n.add"), (1, 2))),
    "inside an exit span": _in_request(lambda: _inside_exit(lambda: APP.send_task("n.add", (1, 2)))),
    "ignored publish": lambda: APP.send_task("n.ignored", (1, 2)),
    "ignored publish with headers": lambda: APP.send_task("n.ignored", (1, 2), headers={"mine": "kept"}),
    "args twice": _in_request(lambda: APP.send_task("n.add", (1, 2), args=(3, 4))),
    "name twice": _in_request(lambda: APP.send_task("n.add", name="n.add")),
    "self as keyword": _in_request(lambda: Celery.send_task(APP, "n.add", self=APP)),
    "no name": _in_request(lambda: APP.send_task()),  # noqa: PLW0108 (looked up at the call: the form in use)
    "rejected by Celery before the message": _in_request(
        lambda: APP.send_task("n.add", (1, 2), countdown="soon")
    ),
}


# The cases the native form hands to the Python one (all their sends); the others are its own.
HANDED = {
    "two apps alternating": 2,  # OTHER's first send, then APP's after it
    "own headers": 1,
    "own headers, built at run time": 1,
    "empty headers": 1,
    "stale propagation headers": 1,
    "name a str subclass": 1,
    "ignored publish with headers": 1,
    "args twice": 1,
    "name twice": 1,
    "self as keyword": 1,
    "no name": 1,
}


@pytest.mark.parametrize("name", list(CASES))
def test_native_and_python_forms_agree(harness: Harness, name: str) -> None:
    (kind, _), segs, published = both(harness, CASES[name])
    assert len(harness.handed) == HANDED.get(name, 0)
    if name in ("args twice", "name twice", "self as keyword", "no name"):
        # the binding's TypeError, before any publish span
        assert kind == "raised" and not published
        assert [s[R.SPAN_OPERATION] for seg in segs for s in seg[R.SEG_SPANS]] == ["/orders"]
    elif name == "rejected by Celery before the message":
        assert kind == "raised"
    else:
        assert kind == "returned" and published


def test_parameters_tag(harness: Harness) -> None:
    instr.settings.params_length = 12
    _, segs, _ = both(harness, CASES["send_task positional"])
    assert any("celery.parameters" in (s[R.SPAN_TAGS] or []) for seg in segs for s in seg[R.SEG_SPANS])


@pytest.mark.parametrize("limit", [3, 19, 20, 4096])
def test_tag_limit(harness: Harness, limit: int) -> None:
    """A broker URL longer than the tag limit goes through ``Span.tag`` (clipped); one that
    fits (up to the limit itself) is the span's first tag list."""
    broker = "memory://localhost//"  # 20 characters
    limits.tag_value_max = limit
    _, segs, _ = both(harness, CASES["send_task alone"])
    (seg,) = segs
    assert seg[R.SEG_SPANS][0][R.SPAN_TAGS] == ["mq.broker", broker[:limit]]
    assert seg[R.SEG_SIZE_LIMITED] == (limit < len(broker))


def test_a_failure_adding_the_trace_is_logged_and_the_task_still_sent(harness: Harness, caplog: Any) -> None:
    """``limits.tag_value_max`` that is not a number: the tag fails inside the agent's
    ``except Exception`` in both forms; logged once (per form here), the message sent without
    ``sw8``, the span still recorded."""
    limits.tag_value_max = "x"  # type: ignore[assignment]
    for form in FORMS:
        _mq._warned.discard("celery-publish")
        with caplog.at_level(logging.WARNING, logger="swmp.instrument"):
            caplog.clear()
            (kind, _), segs, published = harness.run(form, CASES["send_task alone"])
        assert kind == "returned"
        assert "sw8" not in published[0]
        assert len(segs) == 1 and not segs[0][R.SEG_SPANS][0][R.SPAN_TAGS]
        (record,) = [r for r in caplog.records if "adding the trace" in r.getMessage()]
        assert record.exc_info is not None and record.exc_info[0] is TypeError  # the failure, as handled


class Refused(Exception):
    pass


def test_the_callers_exception_is_the_originals_and_the_span_has_it(harness: Harness) -> None:
    refused = Refused("broker says no")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise refused

    APP.amqp.send_task_message = refuse
    try:
        for form in FORMS:
            (kind, value), segs, _ = harness.run(form, CASES["send_task alone"])
            assert kind == "raised" and value is refused
            assert form == "python" or not harness.handed
            ((span,),) = [seg[R.SEG_SPANS] for seg in segs]
            assert span[R.SPAN_IS_ERROR]
            (log,) = span[R.SPAN_LOGS]
            fields = dict(zip(log[1][::2], log[1][1::2], strict=True))
            assert fields["error.kind"] == "Refused" and fields["message"] == "broker says no"
        both(harness, CASES["send_task alone"])
    finally:
        del APP.amqp.send_task_message
    assert _celery_message._get_armed() is None  # disarmed after the failed send


def test_a_database_broker_gives_a_peer_without_its_password(harness: Harness) -> None:
    """The SQLAlchemy transport keeps the whole database URL, password included, as the
    connection's hostname: the publish span's peer (the OAP's topology node) is its host
    and port in both forms, and no field of the segment has the password."""
    app = make_app("sqla")
    app.conf.broker_url = "sqla+postgresql://celery:s3cret@db.internal:5433/celery"
    sent: list[str] = []
    # No database here: the message stops before kombu (the connection is never opened).
    app.amqp.send_task_message = lambda producer, name, message, **options: sent.append(name)
    for form in FORMS:
        (kind, _), segs, _ = harness.run(form, _in_request(lambda: app.send_task("n.add", (1, 2))), app)
        assert kind == "returned"
        assert form == "python" or not harness.handed  # the native form's own send
        (seg,) = segs
        publish = seg[R.SEG_SPANS][0]
        assert publish[R.SPAN_OPERATION] == "celery/n.add"
        assert publish[R.SPAN_PEER] == "db.internal:5433"
        assert publish[R.SPAN_TAGS] == ["mq.broker", "sqla+postgresql://db.internal:5433/celery"]
        assert "s3cret" not in orjson.dumps(segs).decode()
    assert sent == ["n.add", "n.add"]


def test_an_app_whose_messages_skip_the_carrier(harness: Harness, caplog: Any) -> None:
    """Armed and not consumed: the first message goes without ``sw8``, the next ones get
    it as the option (the state the native form shares with the Python one)."""

    class PastTheCarrier(amqp.AMQP):
        def as_task_v2(self, *args: Any, **kwargs: Any) -> Any:
            token = _celery_message._armed.set(None)
            try:
                return super().as_task_v2(*args, **kwargs)
            finally:
                _celery_message._armed.reset(token)

    saved = _celery_message._builders
    _celery_message._builders = (*saved, PastTheCarrier.as_task_v2)
    try:
        tricky = make_app("trk", amqp_cls=PastTheCarrier)

        def three() -> Any:
            return [tricky.send_task("n.add", (1, 2)) for _ in range(3)]

        _, _, published = both(harness, three, tricky)
        handed = len(harness.handed)
    finally:
        _celery_message._builders = saved
    assert ["sw8" in h for h in published] == [False, True, True]
    assert handed == 2  # the first found the box not taken (natively); the next are the option's


def test_own_amqp_class_gets_the_option(harness: Harness) -> None:
    stock = original(amqp, "task_message")

    class OwnAMQP(amqp.AMQP):
        def as_task_v2(self, *args: Any, **kwargs: Any) -> Any:
            built = super().as_task_v2(*args, **kwargs)
            return stock(dict(built.headers), built.properties, built.body, built.sent_event)

    own = make_app("own", amqp_cls=OwnAMQP)
    _, _, published = both(harness, _in_request(lambda: own.send_task("n.add", (1, 2))), own)
    assert len(harness.handed) == 1
    assert published[0]["sw8"].startswith("1-")


def test_binds_like_the_function_it_replaces(harness: Harness) -> None:
    harness.use("native")
    wrapper = harness.installed
    assert type(wrapper) is instr._CelerySend
    assert is_patched(Celery, "send_task")
    assert getattr(wrapper, ORIGINAL) is harness.orig
    assert wrapper.__wrapped__ is harness.orig and wrapper.__name__ == "send_task"
    assert Celery.__dict__["send_task"].__get__(None, Celery) is Celery.__dict__["send_task"]
    bound = APP.send_task
    assert bound.__self__ is APP
    assert "CelerySend" in type(wrapper).__name__ and "send_task" in repr(wrapper)


def test_pure_python_mode_uses_the_python_form() -> None:
    import subprocess
    import sys

    code = (
        "from swmp.instrument import celery as c; "
        "w = c._wrap_send_task(lambda *a, **k: None); "
        "print(c._CelerySend is None, type(w).__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "SWMP_TRACE_PURE": "1"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["True", "function"]


def test_no_leak_over_thousands_of_sends(harness: Harness) -> None:
    """Rounds of native publishes (in a request, alone, raising, handed to Python): the live
    object count and traced memory do not grow from round to round."""
    harness.use("native")
    producer = APP.producer_pool.acquire(block=True)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise Refused("no")  # a new one each time (a re-raised one grows its traceback)

    def one_round(n: int) -> None:
        for i in range(n):
            with new_entry_span("/orders"):
                APP.send_task("n.add", (1, 2), producer=producer)
            APP.send_task("n.add", (1, 2), producer=producer)
            APP.send_task("n.ignored", (1, 2), producer=producer)
            APP.send_task("n.add", (1, 2), producer=producer, headers={"mine": "kept"})
            if i % 10 == 0:
                APP.amqp.send_task_message = refuse
                try:
                    APP.send_task("n.add", (1, 2), producer=producer)
                except Refused:
                    pass
                finally:
                    del APP.amqp.send_task_message
        harness.sink.clear()
        with APP.connection_for_write() as conn:
            conn.default_channel.queue_purge(APP.conf.task_default_queue)

    try:
        one_round(300)  # warm-up: caches, interned names, the first-send paths
        tracemalloc.start()
        counts, sizes = [], []
        for _ in range(5):
            one_round(200)
            gc.collect()
            counts.append(len(gc.get_objects()))
            sizes.append(tracemalloc.get_traced_memory()[0])
        tracemalloc.stop()
    finally:
        producer.release()
    assert max(counts) - min(counts) < 50, counts
    assert max(sizes[1:]) - min(sizes[1:]) < 64 * 1024, sizes
