"""confluent-kafka's asyncio clients (``confluent_kafka.aio``) against the real KRaft Kafka
broker: ``AIOProducer`` / ``AsyncSerializingProducer`` exit spans made in the calling
coroutine with ``sw8`` on the record, ``AIOConsumer`` / ``AsyncDeserializingConsumer`` entry
spans (``poll`` and ``consume`` batches) continuing the producer's trace, one span each."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest

from reporter_proc import records as R
from swmp import _sink
from swmp.tracing import Component, Kind
from swmp.tracing.constants import Layer
from swmp.tracing.context import new_entry_span
from tests.realpeers import KafkaBroker, unique_name
from tests.test_instrument_mq import _consume, assert_continues, one_exit, sink, spans_of, tags, wait_for

pytestmark = pytest.mark.e2e  # the real Kafka broker (tests/realpeers.py)

__all__ = ["sink"]  # the fixture, shared with the sync MQ tests


def _run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(main(), 120))


def _consumer_conf(bootstrap: str, group: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }


async def _aio_read(consumer: Any, topic: str, count: int, batch: bool) -> list[Any]:
    """``count`` messages through ``consume`` batches or ``poll``."""
    await consumer.subscribe([topic])
    got: list[Any] = []
    for _ in range(120):
        if batch:
            got += [m for m in await consumer.consume(count - len(got), 0.5) if m.error() is None]
        else:
            m = await consumer.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m)
        if len(got) >= count:
            return got
    raise AssertionError(f"{len(got)} of {count} messages")


def _check_producer(sink: _sink.MemorySink, bootstrap: str, topic: str, n: int = 1) -> list[Any]:
    found = spans_of(sink, Kind.EXIT, Component.KAFKA_PRODUCER)
    assert len(found) == n, found
    for _seg, span in found:
        assert span[R.SPAN_OPERATION] == f"Kafka/{topic}/Producer"
        assert span[R.SPAN_LAYER] == Layer.MQ
        assert span[R.SPAN_PEER] == bootstrap
        assert tags(span) == {"mq.broker": bootstrap, "mq.topic": topic}
        assert not span[R.SPAN_IS_ERROR]
    return found


def _check_consumers(sink: _sink.MemorySink, bootstrap: str, topic: str, group: str, n: int) -> list[Any]:
    wait_for(lambda: len(spans_of(sink, Kind.ENTRY, Component.KAFKA_CONSUMER)) >= n)
    found = spans_of(sink, Kind.ENTRY, Component.KAFKA_CONSUMER)
    assert len(found) == n, found  # one per message: the wrapped sync Consumer adds none
    for _seg, span in found:
        assert span[R.SPAN_OPERATION] == f"Kafka/{topic}/Consumer/{group}"
        assert tags(span) == {"mq.broker": bootstrap, "mq.topic": topic}
    return found


@pytest.mark.parametrize("batch", [False, True], ids=["poll", "consume"])
def test_aio_producer_record_carries_the_trace_to_the_aio_consumer(
    sink: _sink.MemorySink, kafka_broker: KafkaBroker, batch: bool
) -> None:
    """Two traced produces (one buffered batch, sent at flush) and one untraced between them:
    each traced record has sw8, each consumed one an entry span continuing its producer."""
    from confluent_kafka.aio import AIOConsumer, AIOProducer

    bootstrap, topic, group = kafka_broker.bootstrap, unique_name("topic"), unique_name("group")

    async def main() -> list[Any]:
        producer = AIOProducer({"bootstrap.servers": bootstrap}, buffer_timeout=0)
        try:
            with new_entry_span("/orders"):
                first = await producer.produce(topic, b"one", b"k1")
            second = await producer.produce(topic, b"two", b"k2")  # outside the trace
            with new_entry_span("/orders"):
                third = await producer.produce(topic, value=b"three", key=b"k3")
            assert [f.done() for f in (first, second, third)] == [False] * 3  # buffered
            await producer.flush()
            delivered = [await f for f in (first, second, third)]
        finally:
            await producer.close()
        # The delivered messages, as without the agent (in order, one partition).
        assert [m.value() for m in delivered] == [b"one", b"two", b"three"]
        assert [m.error() for m in delivered] == [None] * 3
        consumer = AIOConsumer(_consumer_conf(bootstrap, group))
        try:
            return await _aio_read(consumer, topic, 3, batch)
        finally:
            await consumer.close()

    msgs = _run(main)
    assert [m.value() for m in msgs] == [b"one", b"two", b"three"]
    headers = [m.headers() for m in msgs]
    assert headers[1] is None  # the untraced one
    assert [k for k, _ in headers[0]] == ["sw8"] and [k for k, _ in headers[2]] == ["sw8"]
    producers = _check_producer(sink, bootstrap, topic, 2)
    consumers = _check_consumers(sink, bootstrap, topic, group, 3)
    by_value = {m.value(): c for m, c in zip(msgs, consumers, strict=True)}
    assert_continues(producers[0], by_value[b"one"], dict(headers[0])["sw8"])
    assert_continues(producers[1], by_value[b"three"], dict(headers[2])["sw8"])
    assert by_value[b"two"][1][R.SPAN_REFS] == []  # a new trace
    # A plain (sync) consumer reads the same headers back.
    assert _consume("confluent-kafka", bootstrap, topic, unique_name("group"))[0][0] == "sw8"


def test_aio_producer_batch_flushed_inside_produce(sink: _sink.MemorySink, kafka_broker: KafkaBroker) -> None:
    """batch_size=1: produce hands the batch to librdkafka (in the pool) before returning;
    one exit span (made in the coroutine, none from the pool thread) and sw8 on the record."""
    from confluent_kafka.aio import AIOProducer

    bootstrap, topic = kafka_broker.bootstrap, unique_name("topic")

    async def main() -> Any:
        producer = AIOProducer({"bootstrap.servers": bootstrap}, batch_size=1, buffer_timeout=0)
        try:
            with new_entry_span("/orders"):
                fut = await producer.produce(topic, b"payload", b"k1", partition=0)
            await producer.flush()  # delivery reports are served by flush/poll
            return await fut
        finally:
            await producer.close()

    delivered = _run(main)
    assert (delivered.value(), delivered.partition(), delivered.error()) == (b"payload", 0, None)
    (producer,) = _check_producer(sink, bootstrap, topic)
    headers = _consume("confluent-kafka", bootstrap, topic, unique_name("group"), batch=True)
    assert [k for k, _ in headers] == ["sw8"]
    assert_continues(producer, spans_of(sink, Kind.ENTRY, Component.KAFKA_CONSUMER)[0], headers[0][1])


@pytest.mark.parametrize("batch", [False, True], ids=["poll", "consume"])
def test_async_serializing_producer_and_deserializing_consumer(
    sink: _sink.MemorySink, kafka_broker: KafkaBroker, batch: bool
) -> None:
    from confluent_kafka.aio import AsyncDeserializingConsumer, AsyncSerializingProducer
    from confluent_kafka.serialization import StringDeserializer, StringSerializer

    bootstrap, topic, group = kafka_broker.bootstrap, unique_name("topic"), unique_name("group")

    async def main() -> list[Any]:
        strings = StringSerializer()
        producer = await AsyncSerializingProducer(
            {"bootstrap.servers": bootstrap, "key.serializer": strings, "value.serializer": strings},
            buffer_timeout=0,
        )
        try:
            with new_entry_span("/orders"):
                fut = await producer.produce(topic, key="k1", value="payload")
            await producer.flush()
            assert (await fut).value() == b"payload"
        finally:
            await producer.close()
        conf = _consumer_conf(bootstrap, group)
        conf.update({"key.deserializer": StringDeserializer(), "value.deserializer": StringDeserializer()})
        consumer = await AsyncDeserializingConsumer(conf)
        try:
            return await _aio_read(consumer, topic, 1, batch)
        finally:
            await consumer.close()

    (msg,) = _run(main)
    assert (msg.key(), msg.value()) == ("k1", "payload")  # deserialized, as without the agent
    assert [k for k, _ in msg.headers()] == ["sw8"]
    (producer,) = _check_producer(sink, bootstrap, topic)
    (consumer,) = _check_consumers(sink, bootstrap, topic, group, 1)
    assert_continues(producer, consumer, dict(msg.headers())["sw8"])


def test_aio_produce_outside_a_trace_and_errors(sink: _sink.MemorySink, kafka_broker: KafkaBroker) -> None:
    """Outside a trace: no span, no header. Inside one: a serializer's exception and the
    library's refusal of headers reach the caller unchanged; the serializer's marks the span
    (the headers call is left to the library, untraced); a cancelled produce marks its span and
    the cancellation propagates."""
    from confluent_kafka.aio import AIOProducer, AsyncDeserializingConsumer, AsyncSerializingProducer
    from confluent_kafka.error import ValueDeserializationError, ValueSerializationError
    from confluent_kafka.serialization import StringSerializer

    bootstrap, topic, group = kafka_broker.bootstrap, unique_name("topic"), unique_name("group")

    def fails(value: Any, ctx: Any) -> Any:
        raise ValueError("not for this consumer")

    async def main() -> Any:
        producer = await AsyncSerializingProducer(
            {"bootstrap.servers": bootstrap, "value.serializer": StringSerializer()}, buffer_timeout=0
        )
        try:
            fut = await producer.produce(topic, value="payload")  # no trace
            await producer.flush()
            await fut
            assert spans_of(sink, Kind.EXIT, Component.KAFKA_PRODUCER) == []
            with new_entry_span("/bad"):
                with pytest.raises(ValueSerializationError):
                    await producer.produce(topic, value=12)  # not a str
                with pytest.raises(NotImplementedError, match="Headers are not supported"):
                    await producer.produce(topic, value="x", headers=[("a", b"b")])
        finally:
            await producer.close()
        (_seg, span) = one_exit(sink, Component.KAFKA_PRODUCER)
        assert span[R.SPAN_IS_ERROR]
        sink.clear()

        # batch_size=1: produce awaits the hand-over in the pool, and is cancelled there.
        aio = AIOProducer({"bootstrap.servers": bootstrap}, batch_size=1, buffer_timeout=0)
        try:
            with new_entry_span("/cancel"):
                task = asyncio.ensure_future(aio.produce(unique_name("topic"), b"v"))
                await asyncio.sleep(0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        finally:
            await aio.close()
        (_seg, span) = one_exit(sink, Component.KAFKA_PRODUCER)
        # Cancelled, not failed: logged without the error flag (tests/test_cancelled_not_error.py).
        assert span[R.SPAN_IS_ERROR] is False
        assert "interrupted" in orjson.dumps(span[R.SPAN_LOGS]).decode()
        sink.clear()

        conf = _consumer_conf(bootstrap, group)
        conf["value.deserializer"] = fails
        consumer = await AsyncDeserializingConsumer(conf)
        try:
            with pytest.raises(ValueDeserializationError) as raised:
                await _aio_read(consumer, topic, 1, False)
        finally:
            await consumer.close()
        return raised.value.kafka_message

    undeserializable = _run(main)
    assert undeserializable.headers() is None  # sent outside a trace: no header added
    ((_cseg, cspan),) = _check_consumers(sink, bootstrap, topic, group, 1)
    assert cspan[R.SPAN_REFS] == []  # recorded before deserialization failed; a new trace


def test_aio_message_failures_reach_the_future_as_without_the_agent(
    sink: _sink.MemorySink, kafka_broker: KafkaBroker
) -> None:
    """A message librdkafka refuses (larger than ``message.max.bytes``) or the broker refuses
    (an invalid topic name): the traced one (sent on its own with its headers) fails on its
    future exactly as the untraced one in the same batch (sent by ``produce_batch``), and the
    rest of the batch is delivered."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.aio import AIOProducer

    bootstrap, topic = kafka_broker.bootstrap, unique_name("topic")

    async def main() -> list[Any]:
        producer = AIOProducer({"bootstrap.servers": bootstrap, "message.max.bytes": 1000}, buffer_timeout=0)
        try:
            with new_entry_span("/big"):
                futs = [await producer.produce(topic, b"x" * 2000)]
            futs.append(await producer.produce(topic, b"y" * 2000))
            with new_entry_span("/small"):
                futs.append(await producer.produce(topic, b"small"))
            with new_entry_span("/bad-topic"):
                futs.append(await producer.produce("bad topic!", b"v"))
            futs.append(await producer.produce("bad topic!", b"v"))
            await producer.flush()
            return await asyncio.gather(*futs, return_exceptions=True)
        finally:
            await producer.close()

    big_traced, big_plain, small, bad_traced, bad_plain = _run(main)
    for failed in (big_traced, big_plain):
        assert isinstance(failed, KafkaException)
        assert failed.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    for failed in (bad_traced, bad_plain):
        assert isinstance(failed, KafkaException)
        assert failed.args[0].code() == KafkaError.TOPIC_EXCEPTION
    assert small.value() == b"small" and small.error() is None
    # The produce calls themselves succeeded; delivery failures arrive later, on the futures.
    spans = spans_of(sink, Kind.EXIT, Component.KAFKA_PRODUCER)
    assert [s[R.SPAN_IS_ERROR] for _seg, s in spans] == [False] * 3
    headers = _consume("confluent-kafka", bootstrap, topic, unique_name("group"))
    assert [k for k, _ in headers] == ["sw8"]
