"""The native producer steps (swmp/_native/mq.c: ``kafka_send_span``, ``amqp_send_span``,
``kafka_headers``, ``amqp_headers``) do what their Python forms in swmp/instrument/_mq.py do:
the same span (or none), the same new headers, the same segments, the same failures logged
and the same exceptions passed on, for every shape of names, headers and merge the
instrumentations may hand them; and they never modify the caller's headers. The real
clients against the real brokers: test_instrument_mq.py."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from swmp import _sink
from swmp.instrument import _mq
from swmp.tracing.context import new_entry_span, new_exit_span
from swmp.tracing.limits import limits
from swmp.tracing.span import NATIVE, Span, current_span, native_core
from tests.native_forms import PLACES, Text, recording, segments

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")

KAFKA = (native_core.kafka_send_span if NATIVE else None, _mq._py_kafka_send_span)
AMQP = (native_core.amqp_send_span if NATIVE else None, _mq._py_amqp_send_span)


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with recording() as memory:
        yield memory


def _normal(span: Any, headers: Any) -> Any:
    """The new headers with this span's own sw8 value replaced by a marker (its ids differ
    from run to run); any other sw8 value is left as it is, and would show."""
    if span is None:
        return headers
    own = span.inject()["sw8"]
    if isinstance(headers, list):
        return [(k, "<own>" if v in (own, own.encode()) else v) for k, v in headers]
    if isinstance(headers, dict):
        return {k: "<own>" if v == own else v for k, v in headers.items()}
    return headers


def _run(
    form: Callable[..., Any], args: tuple[Any, ...], sink: _sink.MemorySink, place: str, headers_at: int = 2
) -> Any:
    """``form(*args)`` made in ``place``, then the span (if any) entered and left as the
    instrumentations do around the send: (outcome with the span's shape and the new headers,
    segments). ``args[headers_at]``, the caller's headers, must come out unchanged."""
    before = copy.deepcopy(args[headers_at])

    def send() -> Any:
        span, headers = form(*args)
        shape = None if span is None else (span.op, span.peer, span.component, span.layer, list(span.tags))
        normal = _normal(span, headers)
        if span is not None:
            with span:
                pass
        return shape, normal

    try:
        if place == "none":
            outcome: Any = ("returned", send())
        else:
            with new_entry_span("/request"):
                if place == "exit":
                    with new_exit_span("outer", "db:1", 1, 1):
                        outcome = ("returned", send())
                else:
                    outcome = ("returned", send())
                assert current_span.get().op == "/request"  # type: ignore[union-attr]
    except (Exception, KeyboardInterrupt) as e:
        outcome = ("raised", type(e).__name__, str(e))
    records = segments(sink.records)
    sink.clear()
    assert args[headers_at] == before  # the caller's headers are never modified
    return outcome, records


def _both(forms: tuple[Any, Any], args: tuple[Any, ...], sink: _sink.MemorySink, place: str) -> Any:
    native, python = forms
    at = 2 if forms is KAFKA else 4
    mine = _run(native, args, sink, place, at)
    assert mine == _run(python, args, sink, place, at)
    return mine


KAFKA_HEADERS: list[Any] = [
    None,
    [],
    [("a", b"1")],
    [("sw8", b"old"), ("a", b"1"), ("sw8-x", b"x"), ("sw8-correlation", b"c")],
    [("a", b"1"), ("a", b"2")],
    [["a", b"1"]],  # items that are lists: the Python form's
    (("a", b"1"),),  # not a list: the Python form's
    [(Text("sw8"), b"old")],  # a name that is not an exact str
    [()],  # an item without a name: the Python form raises, logged, untraced
]


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("headers", KAFKA_HEADERS, ids=repr)
@pytest.mark.parametrize("topic", ["orders", Text("orders"), b"raw", 7, "t" * 40])
def test_kafka_send_span(sink: _sink.MemorySink, place: str, headers: Any, topic: Any) -> None:
    limits.tag_value_max = 32  # "t" * 40 is clipped: the Python form's
    outcome, _ = _both(KAFKA, (topic, "k1:9092;k2:9092", headers), sink, place)
    if place == "entry" and headers != [()]:
        assert outcome[0] == "returned" and outcome[1][0] is not None  # a span was made


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("brokers", ["k:9092", "", "b" * 40, Text("k:9092")])
def test_kafka_brokers(sink: _sink.MemorySink, place: str, brokers: Any) -> None:
    limits.tag_value_max = 32
    _both(KAFKA, ("orders", brokers, [("a", b"1")]), sink, place)


AMQP_HEADERS: list[Any] = [
    None,
    {},
    {"a": 1},
    {"sw8": "old", "a": 1, "sw8-x": "x", "b": [1, 2]},
    {1: "x", "a": 2},  # a key that is not a str: the Python form's
    {Text("sw8"): "old"},
]


def _table(span: Any, headers: Any) -> Any:
    """An attach like pika's / aiormq's: the message's new headers table."""
    return _mq.amqp_headers(span, headers)


def _py_table(span: Any, headers: Any) -> Any:
    return _mq._py_amqp_headers(span, headers)


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("headers", AMQP_HEADERS, ids=repr)
@pytest.mark.parametrize(
    ("exchange", "routing_key"),
    [("", "jobs"), ("ex", "rk"), (Text("ex"), "rk"), ("ex", None), ("e" * 40, "rk")],
)
def test_amqp_send_span(
    sink: _sink.MemorySink, place: str, headers: Any, exchange: Any, routing_key: Any
) -> None:
    limits.tag_value_max = 32
    facts = (exchange, routing_key, "mq:5672")
    native = _run(native_core.amqp_send_span, (*facts, _table, headers), sink, place, 4)
    python = _run(_mq._py_amqp_send_span, (*facts, _py_table, headers), sink, place, 4)
    assert native == python


@pytest.mark.parametrize("place", ["entry", "none"])
def test_a_merge_of_the_callers_is_called_with_the_span(sink: _sink.MemorySink, place: str) -> None:
    seen: list[Any] = []

    def merge(span: Any, headers: Any) -> Any:
        seen.append((type(span), headers))
        return ("merged", headers)

    _both(KAFKA, ("orders", "k:9092", {"mine": 1}, merge), sink, place)
    # Outside a trace too (a new trace: the instrumentations' gates call these steps only
    # inside one, but the steps themselves do what new_exit_span does).
    assert seen == [(Span, {"mine": 1})] * 2


def test_a_failing_step_is_logged_once_and_the_message_goes_untraced(
    sink: _sink.MemorySink, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(span: Any, headers: Any) -> Any:
        raise ValueError("no headers today")

    for form in (native_core.kafka_send_span, _mq._py_kafka_send_span):
        _mq._warned.discard("produce:40")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="swmp.instrument"):
            outcome, records = _run(form, ("orders", "k:9092", None, broken), sink, "entry")
        assert outcome == ("returned", (None, None))
        # The span made before the failure is finished: the request's segment holds it.
        assert [s[2] for s in records[0][3]] == ["Kafka/orders/Producer", "/request"]
        assert [r.getMessage() for r in caplog.records] == ["swmp: tracing a message send failed"]
        assert "no headers today" in caplog.text  # with the exception


def test_an_interrupt_in_a_step_is_raised_as_the_python_form_raises_it(sink: _sink.MemorySink) -> None:
    def interrupted(span: Any, headers: Any) -> Any:
        raise KeyboardInterrupt

    _both(KAFKA, ("orders", "k:9092", None, interrupted), sink, "entry")
    _both(AMQP, ("ex", "rk", "mq:5672", interrupted, None), sink, "entry")


@pytest.mark.parametrize("headers", KAFKA_HEADERS[:-1], ids=repr)
def test_kafka_headers_alone(sink: _sink.MemorySink, headers: Any) -> None:
    with new_entry_span("/request"), new_exit_span("Kafka/t/Producer", "k:9092", 40, 4) as span:
        assert _normal(span, native_core.kafka_headers(span, headers)) == _normal(
            span, _mq._py_kafka_headers(span, headers)
        )


@pytest.mark.parametrize("headers", AMQP_HEADERS, ids=repr)
def test_amqp_headers_alone(sink: _sink.MemorySink, headers: Any) -> None:
    with new_entry_span("/request"), new_exit_span("RabbitMQ/x", "mq:5672", 52, 4) as span:
        mine = native_core.amqp_headers(span, headers)
        assert mine == _mq._py_amqp_headers(span, headers)
        assert mine is not headers


def test_wrong_calls_go_to_the_python_forms(sink: _sink.MemorySink) -> None:
    with pytest.raises(TypeError):
        native_core.kafka_send_span("orders")  # the Python form's own error
    with pytest.raises(TypeError):
        native_core.kafka_headers(None)
    with new_entry_span("/request"):
        span, headers = native_core.kafka_send_span(topic="orders", brokers="k:9092", headers=None)
        assert span is not None and [k for k, _ in headers] == ["sw8"]
        span.finish()


def test_the_instrumentations_use_the_native_steps() -> None:
    assert _mq.kafka_send_span is native_core.kafka_send_span
    assert _mq.amqp_send_span is native_core.amqp_send_span
    assert _mq.amqp_headers is native_core.amqp_headers


def test_the_operation_name_follows_the_names_from_one_send_to_the_next(sink: _sink.MemorySink) -> None:
    """mq.c remembers the last operation name it built per step (swmp_join_memo): a change of
    any part, or the same text in another str object, must still name the span right."""
    sends = [
        ("orders", "new", "orders"),
        ("orders", "new", "orders"),
        ("orders", "paid", "orders"),
        ("billing", "paid", "billing"),
        ("".join(["bill", "ing"]), "".join(["pa", "id"]), "billing"),  # equal text, new objects
        ("orders", "new", "orders"),
    ]
    seen = []
    with new_entry_span("/request"):
        for exchange, key, topic in sends:
            span, _ = native_core.amqp_send_span(exchange, key, "mq:5672", _mq.amqp_headers, {})
            seen.append(span.op)
            span.finish()
            span, _ = native_core.kafka_send_span(topic, "kafka:9092", [])
            seen.append(span.op)
            span.finish()
    assert seen == [
        name
        for exchange, key, topic in sends
        for name in (f"RabbitMQ/Topic/{exchange}/Queue/{key}/Producer", f"Kafka/{topic}/Producer")
    ]
