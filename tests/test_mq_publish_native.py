"""The native ``AmqpPublish`` (swmp/_native/publish.c) runs aiormq's ``basic_publish`` as the
Python wrapper of swmp/instrument/aiormq.py does: the same call reaches the channel (the
properties with the trace's headers, the other keywords as given, in the span), the same
result or exception reaches the caller, the same segments are recorded. Each case runs
through the wrapper the instrumentation installs (native) and the one it installs without
the native core (Python), on a channel shaped like aiormq's that records what it is given,
with pamqp's own properties. The real client against a real RabbitMQ: test_instrument_mq.py."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from swmp import _sink
from swmp.instrument import aiormq as instr
from swmp.instrument._props_copy import attach_step
from swmp.tracing.context import new_entry_span
from swmp.tracing.limits import limits
from swmp.tracing.span import NATIVE, current_span, native_core
from tests.native_forms import acall_in, compare_forms, recording, segments

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")
Basic = pytest.importorskip("pamqp.commands").Basic


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with recording() as memory:
        yield memory


class Channel:
    """aiormq's shape: ``basic_publish(body, *, exchange, routing_key, properties, ...)`` and
    the connection's URL (the peer)."""

    def __init__(self) -> None:
        from yarl import URL

        self.connection = SimpleNamespace(url=URL("amqp://guest:guest@mq.local:5672/"))
        self.calls: list[Any] = []

    async def basic_publish(
        self,
        body: bytes,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: Any = None,
        mandatory: bool = False,
        timeout: Any = None,
    ) -> Any:
        span = current_span.get()
        headers = None if properties is None else dict(properties.headers or {})
        has_sw8 = headers is not None and "sw8" in headers
        if headers is not None:
            headers.pop("sw8", None)  # its ids differ from run to run; its presence is compared
        props = (
            None
            if properties is None
            else (properties.content_type, properties.delivery_mode, headers, has_sw8)
        )
        self.calls.append((body, exchange, routing_key, props, mandatory, timeout, span and span.op))
        await asyncio.sleep(0)
        if body == b"FAIL":
            raise ConnectionError("channel closed")
        return "confirmed"


def _forms(orig: Any = Channel.basic_publish) -> tuple[Any, Any]:
    with_headers = attach_step(functools.partial(Basic.Properties, delivery_mode=1))
    native = instr.publish(orig, with_headers)
    saved, instr._AmqpPublish = instr._AmqpPublish, None
    try:
        python = instr.publish(orig, with_headers)
    finally:
        instr._AmqpPublish = saved
    return native, python


def _props(**kw: Any) -> Any:
    return Basic.Properties(content_type="text/plain", **kw)


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((b"m",), {}),
    ((b"m",), {"exchange": "ex", "routing_key": "q"}),
    ((b"m",), {"routing_key": "q", "properties": _props(headers={"a": "1", "sw8": "old"})}),
    ((b"m",), {"properties": _props(), "routing_key": "q", "mandatory": True}),
    ((b"m",), {"routing_key": "q", "properties": None, "timeout": 5}),
    ((b"m", "positional"), {}),  # the channel refuses it, in both forms
    ((), {"body": b"m", "exchange": "ex", "routing_key": "q", "properties": _props()}),  # aio-pika's
    ((), {"routing_key": "q", "body": b"m", "mandatory": True}),
    ((b"m",), {"body": b"twice"}),  # refused as the call is made, in both forms
    ((), {"routing_key": "q"}),  # no body: the same
    ((b"FAIL",), {"routing_key": "q"}),
    ((b"m",), {"routing_key": 5}),  # not a str: the Python steps of amqp_send_span
    ((b"m",), {"routing_key": "q" * 3000}),  # over the tag limit: the same
]


@pytest.mark.parametrize("tag_limit", [2048, 4])
def test_native_publish_matches_the_python_form(sink: _sink.MemorySink, tag_limit: int) -> None:
    limits.tag_value_max = tag_limit
    native, python = _forms()
    compare_forms(native, python, Channel, CALLS, sink, acall_in)


def test_the_native_publish_is_lazy_and_carries_the_trace(sink: _sink.MemorySink) -> None:
    native, _ = _forms()
    channel = Channel()
    props = _props(headers={"x": "y"})

    async def main() -> Any:
        with new_entry_span("/request"):
            call = native(channel, b"m", routing_key="orders", properties=props)
            assert type(call).__name__ == "Within" and asyncio.iscoroutine(call)
            assert channel.calls == []  # nothing published before it is awaited
            task = asyncio.get_running_loop().create_task(native(channel, b"n", routing_key="orders"))
            by_keyword = native(channel, body=b"k", routing_key="orders")  # aio-pika's call
            assert type(by_keyword).__name__ == "Within"
            return await call, await task, await by_keyword

    assert asyncio.run(main()) == ("confirmed", "confirmed", "confirmed")
    op = "RabbitMQ/Topic//Queue/orders/Producer"
    assert channel.calls[0] == (b"m", "", "orders", ("text/plain", None, {"x": "y"}, True), False, None, op)
    assert channel.calls[1][3] == (None, 1, {}, True)  # aiormq's default properties, with sw8
    assert props.headers == {"x": "y"}  # the caller's properties are left as they were
    (segment,) = segments(sink.records)
    assert [s[2] for s in segment[3]] == [op, op, op, "/request"]


class IdChannel(Channel):
    """aiormq's ``basic_publish`` as it treats the properties (6.0 to 7.2.4): a message
    without a ``message_id`` gets one of its own, written on the properties it was given,
    before its first wait; then the publish waits (``b"FAIL"``: fails, ``b"HANG"``: until
    cancelled)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[Any] = []

    async def basic_publish(self, body: bytes, *, properties: Any = None, **kwargs: Any) -> Any:
        properties = properties or Basic.Properties(delivery_mode=1)
        if not properties.message_id:
            properties.message_id = f"id{len(self.ids)}"
        self.ids.append(properties.message_id)
        if body == b"HANG":
            await asyncio.Event().wait()
        return await super().basic_publish(body, properties=properties, **kwargs)


@pytest.mark.parametrize("form", ["native", "python"])
@pytest.mark.parametrize("body", [b"m", b"FAIL", b"HANG"])
def test_the_callers_properties_get_the_message_id_aiormq_writes(
    sink: _sink.MemorySink, form: str, body: bytes
) -> None:
    """Without the agent aiormq writes the id on the caller's properties; in a trace it
    writes it on the copy the message goes with, and the caller's properties get it when the
    publish is over: returned, failed or cancelled. An id the caller set stays; properties
    only the call holds (aio-pika's, built for each publish) are handled as well."""
    publish = dict(zip(("native", "python"), _forms(IdChannel.basic_publish), strict=True))[form]
    channel = IdChannel()
    fresh, own = _props(headers={"x": "y"}), _props(message_id="mine")
    headers = fresh.headers

    async def one(make: Any) -> None:
        task = asyncio.get_running_loop().create_task(
            publish(channel, body, routing_key="q", properties=make())
        )
        if body == b"HANG":
            await asyncio.sleep(0)  # the publish runs up to its wait
            task.cancel()
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            await task

    async def main() -> None:
        with new_entry_span("/ids"):
            await one(lambda: fresh)
            await one(lambda: own)
            await one(_props)  # held by the call alone, as aio-pika's are

    asyncio.run(main())
    assert channel.ids == ["id0", "mine", "id2"]
    assert fresh.message_id == "id0" and own.message_id == "mine"
    assert fresh.headers is headers and headers == {"x": "y"}
    (segment,) = segments(sink.records)
    assert [s[2] for s in segment[3]][-1] == "/ids" and len(segment[3]) == 4


def test_constructor_refuses_wrong_arguments() -> None:
    f = Channel.basic_publish
    with pytest.raises(TypeError):
        native_core.AmqpPublish(f, f, f)
    with pytest.raises(TypeError):
        native_core.AmqpPublish(f, f, f, 1)
