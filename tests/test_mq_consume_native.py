"""The native ``amqp_consuming`` (swmp/_native/consume.c) makes what its Python form in
swmp/instrument/_mq.py makes around a RabbitMQ consumer callback: the same span current
while the callback runs, the same segments (the producer's trace continued or a new one),
the same outcome for the callback's return and exceptions, the context given back as it
was, for every shape of headers table and names the instrumentations may hand it. The real
clients against a real broker: test_instrument_mq.py and test_instrument_pika_adapters.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from swmp import _sink, tracing
from swmp.config import load
from swmp.instrument import _mq
from swmp.tracing.context import new_entry_span, new_exit_span
from swmp.tracing.limits import limits
from swmp.tracing.span import NATIVE, current_span, native_core
from tests.native_forms import PLACES, Text, consume_in, producer_sw8, recording, segments

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with recording() as memory:
        yield memory


class Table(dict[str, Any]):
    """A headers table that is a dict subclass: the Python form's."""


class Unreadable(dict[str, Any]):
    def get(self, key: str, default: Any = None) -> Any:
        raise OSError("table gone")


def _headers() -> list[Any]:
    sw8 = producer_sw8()
    return [
        None,
        {},
        {"other": 1},
        {"sw8": sw8},
        {"sw8": sw8.encode()},
        {"sw8": "1-bad"},
        {"sw8": sw8, "sw8-correlation": "a2V5:dmFs"},
        {"sw8": sw8, "sw8-x": "1"},
        {1: 2, "sw8": sw8},
        Table(sw8=sw8),
        Unreadable(sw8=sw8),
        [("sw8", sw8)],  # not a table
    ]


HEADERS = _headers()


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("outcome", ["return", "error", "interrupt"])
@pytest.mark.parametrize("headers", HEADERS, ids=lambda h: type(h).__name__ + repr(sorted(map(str, h or ()))))
def test_amqp_consuming(sink: _sink.MemorySink, place: str, outcome: str, headers: Any) -> None:
    args = ("orders-ex", "orders", headers, "mq:5672")
    _mq._warned.clear()
    mine = consume_in(native_core.amqp_consuming, args, outcome, sink, place)
    _mq._warned.clear()
    assert mine == consume_in(_mq._py_amqp_consuming, args, outcome, sink, place)
    seen = mine[0]
    assert len(seen) == 1
    if not isinstance(headers, Unreadable):  # the callback runs inside the message's span
        assert seen[0][0] == "RabbitMQ/Topic/orders-ex/Queue/orders/Consumer"


@pytest.mark.parametrize(
    ("exchange", "routing_key", "peer"),
    [
        ("", "q", "mq:5672"),
        (Text("ex"), "q", "mq:5672"),
        ("ex", None, "mq:5672"),
        ("e" * 40, "q", "p"),
        ("ex", "q", ""),
    ],
)
def test_names(sink: _sink.MemorySink, exchange: Any, routing_key: Any, peer: Any) -> None:
    limits.tag_value_max = 32  # "e" * 40 is clipped: the Python form's
    args = (exchange, routing_key, {"sw8": HEADERS[3]["sw8"]}, peer)
    for place in PLACES:
        assert consume_in(native_core.amqp_consuming, args, "return", sink, place) == consume_in(
            _mq._py_amqp_consuming, args, "return", sink, place
        )


def test_an_ignored_message_runs_its_callback_untraced(sink: _sink.MemorySink) -> None:
    tracing.configure(load({"SW_AGENT_TRACE_IGNORE_PATH": "RabbitMQ/**"}))
    args = ("ex", "q", None, "mq:5672")
    mine = consume_in(native_core.amqp_consuming, args, "return", sink, "entry")
    assert mine == consume_in(_mq._py_amqp_consuming, args, "return", sink, "entry")
    assert mine[0] == [None]  # no span current in the callback (the loop's is set aside)
    assert [s[2] for s in mine[3][0][3]] == ["/loop"]  # only the loop's own span


def test_a_failing_table_is_logged_once(sink: _sink.MemorySink, caplog: pytest.LogCaptureFixture) -> None:
    _mq._warned.clear()
    with caplog.at_level(logging.WARNING, logger="swmp.instrument"):
        consume_in(
            native_core.amqp_consuming, ("ex", "q", Unreadable(sw8="x"), "p:1"), "return", sink, "none"
        )
        consume_in(
            native_core.amqp_consuming, ("ex", "q", Unreadable(sw8="x"), "p:1"), "return", sink, "none"
        )
    assert [r.getMessage() for r in caplog.records] == ["swmp: tracing a consumed message failed"]
    assert "table gone" in caplog.text


def test_exit_twice_and_wrong_calls(sink: _sink.MemorySink) -> None:
    cm = native_core.amqp_consuming("ex", "q", None, "p:1")
    assert cm.__enter__() is cm
    assert cm.__exit__(None, None, None) is False
    assert cm.__exit__(None, None, None) is False  # nothing left to do
    assert current_span.get() is None
    with pytest.raises(TypeError):
        cm.__exit__(None)
    with pytest.raises(TypeError):
        native_core.amqp_consuming("ex", "q")  # the Python form's own error


def test_the_instrumentations_use_the_native_entry() -> None:
    assert _mq.amqp_consuming is native_core.amqp_consuming


def _kafka_headers() -> list[Any]:
    sw8 = HEADERS[3]["sw8"]
    return [
        None,
        [],
        [("other", b"1")],
        [("sw8", sw8.encode())],
        [("sw8", sw8)],
        [("sw8", b"old"), ("sw8", sw8.encode())],  # the last one wins
        [("sw8", None)],
        [("sw8", "é".encode())],  # not ASCII
        [("sw8", b"1-bad")],
        [("sw8", sw8.encode()), ("sw8-correlation", b"a2V5:dmFs")],
        [("sw8", sw8.encode()), ("sw8-x", b"1")],
        (("sw8", sw8.encode()),),  # aiokafka's tuple
        [["sw8", sw8.encode()]],  # items that are lists: the Python form's
        [("sw8",)],  # too short: the Python form raises, logged
        [(Text("sw8"), sw8.encode())],
    ]


def _delivery(form: Any, args: tuple[Any, ...], sink: _sink.MemorySink, place: str) -> Any:
    try:
        if place == "none":
            result: Any = ("returned", form(*args))
            after = current_span.get()
        else:
            with new_entry_span("/loop"):
                if place == "exit":
                    with new_exit_span("outer", "db:1", 1, 1):
                        result = ("returned", form(*args))
                        after = current_span.get()
                else:
                    result = ("returned", form(*args))
                    after = current_span.get()
    except Exception as e:
        result = ("raised", type(e).__name__)
        after = None
    records = segments(sink.records)
    sink.clear()
    return result, None if after is None else after.op, records


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("headers", _kafka_headers(), ids=repr)
def test_kafka_consumed(sink: _sink.MemorySink, place: str, headers: Any) -> None:
    args = ("orders", "group-1", headers, "k1:9092;k2:9092")
    _mq._warned.clear()
    mine = _delivery(native_core.kafka_consumed, args, sink, place)
    _mq._warned.clear()
    assert mine == _delivery(_mq._py_kafka_consumed, args, sink, place)
    if headers != [("sw8",)]:  # the record's own segment, its span named after topic and group
        assert any(s[2] == "Kafka/orders/Consumer/group-1" for seg in mine[2] for s in seg[3])


@pytest.mark.parametrize(
    ("topic", "group", "brokers"),
    [
        ("t", "", "k:1"),
        (Text("t"), "g", "k:1"),
        ("t" * 40, "g", "k:1"),
        ("t", "g", "b" * 40),
        ("t", None, "k:1"),
    ],
)
def test_kafka_names(sink: _sink.MemorySink, topic: Any, group: Any, brokers: Any) -> None:
    limits.tag_value_max = 32
    args = (topic, group, [("sw8", HEADERS[3]["sw8"].encode())], brokers)
    for place in PLACES:
        assert _delivery(native_core.kafka_consumed, args, sink, place) == _delivery(
            _mq._py_kafka_consumed, args, sink, place
        )


def test_the_kafka_consumers_use_the_native_delivery() -> None:
    assert _mq.kafka_consumed is native_core.kafka_consumed


class Meddler:
    """A table key that collides with ``sw8-correlation`` and, when compared, takes ``sw8``
    out of the table: the value found before must stay alive while it is decoded."""

    def __init__(self, table: dict[Any, Any]) -> None:
        self.table = table

    def __hash__(self) -> int:
        return hash("sw8-correlation")

    def __eq__(self, other: object) -> bool:
        self.table.pop("sw8", None)
        return False


def test_a_table_changed_while_it_is_read(sink: _sink.MemorySink) -> None:
    results = []
    for form in (native_core.amqp_consuming, _mq._py_amqp_consuming):
        table: dict[Any, Any] = {"sw8": "".join(HEADERS[3]["sw8"])}  # a value of its own
        table[Meddler(table)] = 1
        results.append(consume_in(form, ("ex", "q", table, "p:1"), "return", sink, "none"))
    assert results[0] == results[1]
    assert results[0][3][0][3][0][0:2] == [0, -1]  # the message's own entry span, recorded


def test_the_names_follow_the_message_from_one_delivery_to_the_next(sink: _sink.MemorySink) -> None:
    """consume.c remembers the last operation name it built (swmp_join_memo): a change of any
    part, or the same text in another str object, must still name the span as the Python
    form does."""
    sw8 = HEADERS[3]["sw8"]
    names = [
        ("ex", "q"),
        ("ex", "q"),
        ("ex", "r"),
        ("other", "r"),
        ("".join(["oth", "er"]), "".join("r")),
        ("ex", "q"),
    ]
    for exchange, key in names:
        args = (exchange, key, {"sw8": sw8}, "mq:5672")
        mine = consume_in(native_core.amqp_consuming, args, "return", sink, "entry")
        assert mine == consume_in(_mq._py_amqp_consuming, args, "return", sink, "entry")
        assert mine[0][0][0] == f"RabbitMQ/Topic/{exchange}/Queue/{key}/Consumer"
    for topic, group in [
        ("t", "g"),
        ("t", "g"),
        ("t", "h"),
        ("u", "h"),
        ("".join(["u"]), "".join(["h"])),
        ("t", ""),
    ]:
        args = (topic, group, [("sw8", sw8.encode())], "k:1")
        mine = _delivery(native_core.kafka_consumed, args, sink, "entry")
        assert mine == _delivery(_mq._py_kafka_consumed, args, sink, "entry")
        assert any(s[2] == f"Kafka/{topic}/Consumer/{group}" for seg in mine[2] for s in seg[3])
