"""The native facts of a delivered RabbitMQ message (swmp/_native/deliver.c) are what the
Python forms read: pika's ``_consuming`` and ``_traced_callback``, aiormq's
``_message_facts``; for every shape of the client's objects the same span is current in the
callback, the same segments are recorded, the same errors come out. The real clients against
a real broker: test_instrument_mq.py and test_instrument_pika_adapters.py."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from swmp import _sink
from swmp.instrument import _mq, aiormq, pika
from swmp.tracing.context import new_entry_span, new_exit_span
from swmp.tracing.span import NATIVE, current_span, native_core
from tests.native_forms import PLACES, Text, consume_in, producer_sw8, recording, segments

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with recording() as memory:
        yield memory


class Raising:
    """An object whose every attribute in ``fail`` raises that exception when read."""

    def __init__(self, fail: dict[str, BaseException], **attrs: Any) -> None:
        self._fail = fail
        self.__dict__.update(attrs)

    def __getattr__(self, name: str) -> Any:
        if name in self._fail:
            e = self._fail[name]
            raise type(e)(*e.args)  # a new one each time: a raised exception keeps its traceback
        raise AttributeError(name)


SW8 = producer_sw8()
NS = SimpleNamespace


def _pika_channel(params: Any) -> Any:
    return NS(connection=NS(params=params))


def _pika_cases() -> dict[str, tuple[Any, Any, Any]]:
    """``{name: (channel, method, properties)}``, each channel with parameters of its own."""
    method, props = NS(exchange="ex", routing_key="q"), NS(headers={"sw8": SW8})

    def ch(host: Any = "mq", port: Any = 5672) -> Any:
        return _pika_channel(NS(host=host, port=port))

    return {
        "plain": (ch(), method, props),
        "no sw8": (ch(), method, NS(headers={})),
        "headers None": (ch(), method, NS(headers=None)),
        "no headers": (ch(), method, NS()),
        "exchange None": (ch(), NS(exchange=None, routing_key="q"), props),
        "exchange 0": (ch(), NS(exchange=0, routing_key="q"), props),
        "no routing key": (ch(), NS(exchange="ex"), props),
        "no names": (ch(), NS(), props),
        "names not str": (ch(), NS(exchange=Text("ex"), routing_key=b"q"), props),
        "host not str": (ch(Text("mq"), "5672"), method, props),
        "host int": (ch(10, 1), method, props),
        "no connection": (NS(), method, props),
        "no params": (NS(connection=NS()), method, props),
        "host fails": (_pika_channel(Raising({"host": ValueError("no host")}, port=1)), method, props),
        "host interrupted": (_pika_channel(Raising({"host": KeyboardInterrupt()}, port=1)), method, props),
        "headers fail": (ch(), method, Raising({"headers": OSError("gone")})),
        "exchange fails": (ch(), Raising({"exchange": KeyError("x")}, routing_key="q"), props),
    }


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("outcome", ["return", "error", "interrupt"])
@pytest.mark.parametrize("case", list(_pika_cases()))
def test_pika_consuming(sink: _sink.MemorySink, place: str, outcome: str, case: str) -> None:
    args = _pika_cases()[case]
    mine = consume_in(native_core.pika_consuming, args, outcome, sink, place)
    assert mine == consume_in(pika._py_consuming, args, outcome, sink, place)
    if case in {"plain", "pamqp"}:
        assert mine[0][0][0] == "RabbitMQ/Topic/ex/Queue/q/Consumer"
        assert mine[0][0][2][0:2] == ["mq.broker", "mq:5672"]


def test_pika_peer_is_remembered_for_its_parameters(sink: _sink.MemorySink) -> None:
    """The last parameters object's peer is kept (a connection keeps its parameters); other
    parameters are read again."""
    params = NS(host="mq", port=5672)
    method, props = NS(exchange="ex", routing_key="q"), NS(headers=None)
    with native_core.pika_consuming(_pika_channel(params), method, props):
        pass
    params.host = "moved"
    with native_core.pika_consuming(_pika_channel(params), method, props):
        pass
    with native_core.pika_consuming(_pika_channel(NS(host="other", port=1)), method, props):
        pass
    peers = [seg[3][0][9][1] for seg in segments(sink.records)]  # mq.broker's value
    assert peers == ["mq:5672", "mq:5672", "other:1"]


def _aiormq_channel(url: Any) -> Any:
    return NS(connection=NS(url=url))


def _message(delivery: Any = None, header: Any = None) -> Any:
    return NS(
        delivery=NS(exchange="ex", routing_key="q") if delivery is None else delivery,
        header=NS(properties=NS(headers={"sw8": SW8})) if header is None else header,
    )


def _pamqp_message(*, headers: Any = None, unset: str = "") -> Any:
    """A message made of pamqp's own frames as aiormq delivers them (their fields are
    __slots__, which the native form reads where they lie); ``unset``: a field deleted."""
    from pamqp import commands, header

    deliver = commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, exchange="ex", routing_key="q")
    props = commands.Basic.Properties(headers={"sw8": SW8} if headers is None else headers)
    for frame in (deliver, props):
        if hasattr(frame, unset):
            delattr(frame, unset)  # a slot never set: getattr raises AttributeError
    return NS(delivery=deliver, header=header.ContentHeader(0, 1, props))


def _aiormq_cases() -> dict[str, tuple[Any, Any]]:
    """``{name: (channel, message)}``, each channel with a URL of its own; the cases made
    of pamqp's frames come between others, so one call site sees both kinds in turn."""
    from yarl import URL

    def ch(url: str = "amqp://guest:guest@mq:5672/") -> Any:
        return _aiormq_channel(URL(url))

    return {
        "plain": (ch(), _message()),
        "pamqp": (ch(), _pamqp_message()),
        "no port": (ch("amqp://mq/"), _message()),
        "pamqp no sw8": (ch(), _pamqp_message(headers={"other": "x"})),
        "fake url": (_aiormq_channel(NS(host="h", port=0)), _message()),
        "fake url port": (_aiormq_channel(NS(host=Text("h"), port="9")), _message()),
        "no sw8": (ch(), _message(header=NS(properties=NS(headers={})))),
        "no properties": (ch(), _message(header=NS())),
        "properties None": (ch(), _message(header=NS(properties=None))),
        "no names": (ch(), _message(delivery=NS())),
        "exchange None": (ch(), _message(delivery=NS(exchange=None, routing_key="q"))),
        "pamqp exchange unset": (ch(), _pamqp_message(unset="exchange")),
        "pamqp headers unset": (ch(), _pamqp_message(unset="headers")),
        "names not str": (ch(), _message(delivery=NS(exchange=Text("e"), routing_key=1))),
        "no connection": (NS(), _message()),
        "url fails": (_aiormq_channel(Raising({"host": RuntimeError("no")})), _message()),
        "url interrupted": (_aiormq_channel(Raising({"host": KeyboardInterrupt()})), _message()),
        "no delivery": (ch(), NS(header=NS())),
        "no header": (ch(), NS(delivery=NS())),
        "headers fail": (ch(), _message(header=NS(properties=Raising({"headers": OSError("gone")})))),
    }


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("outcome", ["return", "error"])
@pytest.mark.parametrize("case", list(_aiormq_cases()))
def test_aiormq_consuming(sink: _sink.MemorySink, place: str, outcome: str, case: str) -> None:
    args = _aiormq_cases()[case]
    aiormq._last_peer = (None, "")  # the Python form's own memo, emptied for each case
    mine = consume_in(native_core.aiormq_consuming, args, outcome, sink, place)
    assert mine == consume_in(aiormq._py_message_consuming, args, outcome, sink, place)
    if case in {"plain", "pamqp"}:
        assert mine[0][0][0] == "RabbitMQ/Topic/ex/Queue/q/Consumer"
        assert mine[0][0][2][0:2] == ["mq.broker", "mq:5672"]


def _call_wrapped(
    wrapped: Any, args: tuple[Any, ...], outcome: str, sink: _sink.MemorySink, place: str
) -> Any:
    """``wrapped(*args)`` made in ``place``: what the application's callback got and saw, what
    came out, the span current afterwards, the segments recorded."""
    got: list[Any] = []

    def on_message(*a: Any, **kw: Any) -> Any:
        cur = current_span.get()
        got.append((a, kw, None if cur is None else (cur.op, list(cur.tags))))
        if outcome == "error":
            raise ValueError("callback failed")
        if outcome == "interrupt":
            raise KeyboardInterrupt
        return "done"

    cb = wrapped(on_message)
    try:
        if place == "none":
            result: Any = ("returned", cb(*args))
        else:
            with new_entry_span("/loop"):
                if place == "exit":
                    with new_exit_span("outer", "db:1", 1, 1):
                        result = ("returned", cb(*args))
                else:
                    result = ("returned", cb(*args))
    except (Exception, KeyboardInterrupt) as e:
        result = ("raised", type(e).__name__, str(e))
    after = current_span.get()
    records = segments(sink.records)
    sink.clear()
    return got, result, after, records


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("outcome", ["return", "error", "interrupt"])
@pytest.mark.parametrize("case", ["plain", "no headers", "host fails", "headers fail"])
@pytest.mark.parametrize("blocking", [True, False])
@pytest.mark.parametrize("via_impl", [True, False])
def test_pika_callback(  # noqa: PLR0917
    sink: _sink.MemorySink, place: str, outcome: str, case: str, blocking: bool, via_impl: bool
) -> None:
    impl, method, props = _pika_cases()[case]
    channel = NS(_impl=impl) if blocking else impl  # a BlockingChannel, or the channel itself
    args = (channel, method, props, b"body")
    mine = _call_wrapped(lambda cb: native_core.pika_callback(cb, via_impl), args, outcome, sink, place)
    assert mine == _call_wrapped(
        lambda cb: pika._py_traced_callback(cb, via_impl), args, outcome, sink, place
    )
    if case == "plain" and (via_impl or not blocking):
        assert mine[0][0][0][0] is channel  # the caller's channel, not its implementation
        assert mine[0][0][2][0] == "RabbitMQ/Topic/ex/Queue/q/Consumer"


def test_pika_callback_other_calls_go_to_the_callback_untraced(sink: _sink.MemorySink) -> None:
    impl, method, props = _pika_cases()["plain"]
    got, result, _, records = _call_wrapped(native_core.pika_callback, (impl, method), "return", sink, "none")
    assert got == [((impl, method), {}, None)] and result == ("returned", "done") and records == []
    cb = native_core.pika_callback(lambda *a, **kw: (a, kw))
    assert cb(impl, method, props, body=b"x") == ((impl, method, props), {"body": b"x"})
    assert sink.records == []


def test_pika_callback_is_marked_and_keeps_the_callback() -> None:
    def on_message(*a: Any) -> None:
        pass

    cb = native_core.pika_callback(on_message)
    assert getattr(cb, pika._MARK) is True and cb.callback is on_message and callable(cb)
    assert native_core.pika_callback(on_message, False).callback is on_message
    with pytest.raises(TypeError):
        native_core.pika_callback(1)
    with pytest.raises(TypeError):
        native_core.pika_callback(on_message, True, 1)
    with pytest.raises(TypeError):
        native_core.pika_consuming(1, 2)
    with pytest.raises(TypeError):
        native_core.aiormq_consuming(1)


def test_the_instrumentations_use_the_native_steps() -> None:
    assert _mq.native_consuming is native_core
    assert pika._consuming is native_core.pika_consuming
    assert pika._traced_callback is native_core.pika_callback
    assert aiormq._message_consuming is native_core.aiormq_consuming
    assert pika._peer is native_core.pika_peer and aiormq._peer is native_core.aiormq_peer


@pytest.mark.parametrize("case", list(_pika_cases()))
def test_pika_peer(case: str) -> None:
    channel = _pika_cases()[case][0]
    outcomes = []
    for form in (native_core.pika_peer, pika._py_peer):
        try:
            outcomes.append(("returned", form(channel)))
        except (Exception, KeyboardInterrupt) as e:
            outcomes.append(("raised", type(e).__name__))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("case", list(_aiormq_cases()))
def test_aiormq_peer(case: str) -> None:
    channel = _aiormq_cases()[case][0]
    outcomes = []
    for form in (native_core.aiormq_peer, aiormq._py_peer):
        aiormq._last_peer = (None, "")
        try:
            outcomes.append(("returned", form(channel)))
        except (Exception, KeyboardInterrupt) as e:
            outcomes.append(("raised", type(e).__name__))
    assert outcomes[0] == outcomes[1]
