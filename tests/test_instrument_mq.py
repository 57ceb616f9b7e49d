"""Message-queue instrumentation against a real Kafka broker and a real RabbitMQ: producer exit
spans with ``sw8`` in the message headers, consumer entry spans continuing the producer's
trace, errors, untraced sends, and swmp's own Kafka reporter left alone."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from reporter_proc import records as R
from swmp import _sink
from swmp.config import load
from swmp.propagation import decode_sw8
from swmp.tracing import Component, Kind
from swmp.tracing.constants import Layer
from swmp.tracing.context import active_span, new_entry_span, new_local_span
from tests.brokers import RabbitMQBroker
from tests.instrumented import instrumented
from tests.realpeers import KafkaBroker, unique_name

MQ_MODULES = ("kafka", "confluent_kafka", "aiokafka", "pika", "aiormq")


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    import aiokafka  # noqa: F401
    import aiormq  # noqa: F401
    import confluent_kafka  # noqa: F401
    import kafka  # noqa: F401
    import pika  # noqa: F401

    with instrumented() as (memory, status):
        assert {m: status[m] for m in MQ_MODULES} == dict.fromkeys(MQ_MODULES, "installed")
        yield memory


def segments(sink: _sink.MemorySink) -> list[list[Any]]:
    return [orjson.loads(p) for t, p in list(sink.records) if t == R.SEGMENT]


def spans_of(sink: _sink.MemorySink, kind: int, component: int) -> list[tuple[list[Any], list[Any]]]:
    return [
        (seg, s)
        for seg in segments(sink)
        for s in seg[R.SEG_SPANS]
        if s[R.SPAN_TYPE] == kind and s[R.SPAN_COMPONENT] == component
    ]


def tags(span: list[Any]) -> dict[str, str]:
    t = span[R.SPAN_TAGS]
    return dict(zip(t[::2], t[1::2], strict=True))


def one_exit(sink: _sink.MemorySink, component: int) -> tuple[list[Any], list[Any]]:
    found = spans_of(sink, Kind.EXIT, component)
    assert len(found) == 1, found
    return found[0]


def assert_continues(
    producer: tuple[list[Any], list[Any]], consumer: tuple[list[Any], list[Any]], sw8: Any
) -> None:
    """The consumer's entry span is the first span of its own segment, in the producer's
    trace, with a CrossProcess ref to the producer's exit span; the header named that span."""
    pseg, pspan = producer
    cseg, cspan = consumer
    assert cseg[R.SEG_SEGMENT_ID] != pseg[R.SEG_SEGMENT_ID]
    assert cseg[R.SEG_TRACE_ID] == pseg[R.SEG_TRACE_ID]
    assert cspan[R.SPAN_PARENT_ID] == -1
    ref = cspan[R.SPAN_REFS][0]
    assert ref[:4] == [R.REF_CROSS_PROCESS, pseg[R.SEG_TRACE_ID], pseg[R.SEG_SEGMENT_ID], pspan[R.SPAN_ID]]
    assert ref[7] == pspan[R.SPAN_PEER]  # the address the producer used
    carrier = decode_sw8(sw8.decode() if isinstance(sw8, bytes) else sw8)
    assert carrier is not None
    assert (carrier.trace_id, carrier.segment_id, carrier.span_id) == (
        pseg[R.SEG_TRACE_ID],
        pseg[R.SEG_SEGMENT_ID],
        pspan[R.SPAN_ID],
    )


def wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


# ------------------------------------------------------------------------------------ Kafka
def _produce(client: str, bootstrap: str, topic: str, headers: list[tuple[str, bytes]] | None) -> Any:
    """Send one record with ``client``; what the send call returned (after delivery)."""
    if client == "kafka-python":
        from kafka import KafkaProducer

        p = KafkaProducer(bootstrap_servers=bootstrap)
        try:
            fut = p.send(topic, b"payload", key=b"k1", headers=headers)
            return fut.get(timeout=30)
        finally:
            p.close(timeout=10)
    if client == "confluent-kafka":
        import confluent_kafka

        cp = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
        delivered: list[Any] = []
        kwargs: dict[str, Any] = {"key": b"k1", "on_delivery": lambda err, msg: delivered.append((err, msg))}
        if headers is not None:
            kwargs["headers"] = headers
        result = cp.produce(topic, b"payload", **kwargs)
        assert cp.flush(30) == 0
        assert len(delivered) == 1 and delivered[0][0] is None
        return result

    async def send() -> Any:
        from aiokafka import AIOKafkaProducer

        ap = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await ap.start()
        try:
            fut = await ap.send(topic, b"payload", key=b"k1", headers=headers)
            return await fut
        finally:
            await ap.stop()

    return asyncio.run(send())


def _consume(
    client: str, bootstrap: str, topic: str, group: str, batch: bool = False
) -> list[tuple[str, bytes]]:
    """Read the topic's one record, its headers. ``batch``: through the batch API (kafka-python
    ``poll``, confluent ``consume``, aiokafka ``getmany``), else one at a time (iteration,
    ``poll``, ``async for``)."""
    if client == "kafka-python":
        from kafka import KafkaConsumer

        c = KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            consumer_timeout_ms=30_000,
        )
        try:
            if batch:
                for _ in range(60):
                    for records in c.poll(timeout_ms=500).values():
                        return list(records[0].headers)
                raise AssertionError("no record")
            record = next(iter(c))  # iteration goes through poll() too
            return list(record.headers)
        finally:
            c.close()
    if client == "confluent-kafka":
        import confluent_kafka

        cc = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        try:
            cc.subscribe([topic])
            for _ in range(60):
                msgs = cc.consume(1, 0.5) if batch else [m for m in [cc.poll(0.5)] if m is not None]
                if msgs and msgs[0].error() is None:
                    return list(msgs[0].headers() or [])
            raise AssertionError("no message")
        finally:
            cc.close()

    async def read() -> list[tuple[str, bytes]]:
        from aiokafka import AIOKafkaConsumer

        ac = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await ac.start()
        try:
            if batch:
                for _ in range(60):
                    for records in (await ac.getmany(timeout_ms=500)).values():
                        return list(records[0].headers)
                raise AssertionError("no record")
            async for record in ac:  # __anext__ -> getone
                return list(record.headers)
            raise AssertionError("no record")
        finally:
            await ac.stop()

    return asyncio.run(read())


def test_kafka_python_iteration_gives_a_span_per_record_received(
    sink: _sink.MemorySink, kafka_broker: KafkaBroker
) -> None:
    """Iteration fetches a batch but hands it out a record at a time; a seek drops the rest of
    the batch, fetched again later. Each record the application receives gets one span."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic, group = unique_name("kp-iter"), unique_name("g")
    p = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    try:
        with new_entry_span("/send"):
            for i in range(4):
                p.send(topic, value=str(i).encode(), partition=0)
        p.flush(timeout=30)
    finally:
        p.close()
    sends = spans_of(sink, Kind.EXIT, Component.KAFKA_PRODUCER)
    assert len(sends) == 4
    c = KafkaConsumer(
        topic,
        bootstrap_servers=kafka_broker.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=30_000,
    )
    try:
        got = [next(c)]
        assert got[0].offset == 0
        c.seek(TopicPartition(topic, 0), 1)  # drops the rest of the fetched batch
        while len(got) < 4:
            got.append(next(c))
    finally:
        c.close()
    assert [r.value for r in got] == [b"0", b"1", b"2", b"3"]
    received = spans_of(sink, Kind.ENTRY, Component.KAFKA_CONSUMER)
    assert len(received) == 4, [s[R.SPAN_REFS][0][3] for _, s in received]
    assert sorted(s[R.SPAN_REFS][0][2:4] for _, s in received) == sorted(
        [seg[R.SEG_SEGMENT_ID], s[R.SPAN_ID]] for seg, s in sends
    )


KAFKA_CLIENTS = ("kafka-python", "confluent-kafka", "aiokafka")


@pytest.mark.e2e  # the real Kafka broker (tests/realpeers.py)
@pytest.mark.parametrize("client", KAFKA_CLIENTS)
def test_kafka_record_carries_the_trace_to_its_consumer(
    sink: _sink.MemorySink, kafka_broker: KafkaBroker, client: str
) -> None:
    topic, group = unique_name("topic"), unique_name("group")
    own = [("app-header", b"kept")]
    with new_entry_span("/orders"):
        result = _produce(client, kafka_broker.bootstrap, topic, own)
    assert own == [("app-header", b"kept")]  # the caller's list is not modified
    if client != "confluent-kafka":
        assert result.topic == topic  # the delivery metadata, as without the agent
    else:
        assert result is None

    producer = one_exit(sink, Component.KAFKA_PRODUCER)
    _pseg, pspan = producer
    assert pspan[R.SPAN_OPERATION] == f"Kafka/{topic}/Producer"
    assert pspan[R.SPAN_LAYER] == Layer.MQ
    assert pspan[R.SPAN_PEER] == kafka_broker.bootstrap
    assert tags(pspan) == {"mq.broker": kafka_broker.bootstrap, "mq.topic": topic}
    assert not pspan[R.SPAN_IS_ERROR]

    headers = _consume(client, kafka_broker.bootstrap, topic, group)
    assert headers[0] == ("app-header", b"kept")
    assert [k for k, _ in headers[1:]] == ["sw8"]
    wait_for(lambda: len(spans_of(sink, Kind.ENTRY, Component.KAFKA_CONSUMER)) == 1)
    consumer = spans_of(sink, Kind.ENTRY, Component.KAFKA_CONSUMER)[0]
    cspan = consumer[1]
    assert cspan[R.SPAN_OPERATION] == f"Kafka/{topic}/Consumer/{group}"
    assert cspan[R.SPAN_LAYER] == Layer.MQ
    assert tags(cspan) == {"mq.broker": kafka_broker.bootstrap, "mq.topic": topic}
    assert_continues(producer, consumer, dict(headers)["sw8"])


@pytest.mark.e2e  # the real Kafka broker (tests/realpeers.py)
@pytest.mark.parametrize("client", KAFKA_CLIENTS)
def test_kafka_send_outside_a_trace_is_untouched(
    sink: _sink.MemorySink, kafka_broker: KafkaBroker, client: str
) -> None:
    topic, group = unique_name("topic"), unique_name("group")
    _produce(client, kafka_broker.bootstrap, topic, None)
    assert spans_of(sink, Kind.EXIT, Component.KAFKA_PRODUCER) == []
    assert _consume(client, kafka_broker.bootstrap, topic, group, batch=True) == []  # no header added
    # The consumer still records the delivery: a new trace, no ref.
    wait_for(lambda: len(spans_of(sink, Kind.ENTRY, Component.KAFKA_CONSUMER)) == 1)
    _seg, cspan = spans_of(sink, Kind.ENTRY, Component.KAFKA_CONSUMER)[0]
    assert cspan[R.SPAN_REFS] == []


def test_confluent_produce_outside_a_trace_is_the_librarys_own(sink: _sink.MemorySink) -> None:
    """``Producer.produce`` and ``SerializingProducer.produce`` are gates: outside a trace the
    call goes to confluent-kafka's own method (with the native core, no Python frame of ours)."""
    import confluent_kafka

    from swmp.instrument._gate import is_native

    plain = confluent_kafka.Producer.__dict__["produce"]
    serializing = confluent_kafka.SerializingProducer.__dict__["produce"]
    assert plain.__wrapped__ is confluent_kafka.Producer.__mro__[1].produce  # the compiled type's
    assert serializing.__wrapped__ is serializing.__swmp_original__
    if is_native():
        from swmp import _spancore

        assert isinstance(plain, _spancore.Gate) and isinstance(serializing, _spancore.Gate)


@pytest.mark.e2e  # the real Kafka broker (tests/realpeers.py)
def test_kafka_send_errors_propagate_and_mark_the_span(
    sink: _sink.MemorySink, kafka_broker: KafkaBroker
) -> None:
    from aiokafka import AIOKafkaProducer
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    try:
        with new_entry_span("/fails"):
            with pytest.raises(ValueError, match="key or value"):
                p.send(unique_name("topic"))  # neither key nor value: the library refuses
            with pytest.raises(TypeError, match="list-type"):
                p.send(unique_name("topic"), b"v", headers=(("a", b"b"),))  # not a list: passed through
    finally:
        p.close(timeout=10)
    _seg, span = one_exit(sink, Component.KAFKA_PRODUCER)
    assert span[R.SPAN_IS_ERROR]
    assert any(
        dict(zip(log[1][::2], log[1][1::2], strict=True)).get("error.kind") == "ValueError"
        for log in span[R.SPAN_LOGS]
    )

    sink.clear()

    async def cancelled() -> None:
        ap = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
        await ap.start()
        try:
            with new_entry_span("/cancel"):
                # A topic the broker does not know yet: send() waits for metadata, and is cancelled.
                task = asyncio.ensure_future(ap.send(unique_name("topic"), b"v"))
                await asyncio.sleep(0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        finally:
            await ap.stop()

    asyncio.run(cancelled())
    _seg, span = one_exit(sink, Component.KAFKA_PRODUCER)
    # Cancelled, not failed: logged without the error flag (tests/test_cancelled_not_error.py).
    assert span[R.SPAN_IS_ERROR] is False
    assert "interrupted" in orjson.dumps(span[R.SPAN_LOGS]).decode()


@pytest.mark.e2e  # the real Kafka broker (tests/realpeers.py)
def test_swmp_reporter_kafka_sends_are_not_traced(sink: _sink.MemorySink, kafka_broker: KafkaBroker) -> None:
    """In thread mode swmp's own Kafka sender runs inside the application, with aiokafka
    instrumented: even from inside a trace its messages get no span and no header."""
    import dataclasses

    from reporter_proc.senders.kafka_sender import KafkaSender
    from reporter_proc.settings import ReporterSettings
    from tests.test_senders import SEGMENT

    namespace = unique_name("ns")
    settings = dataclasses.replace(
        ReporterSettings(
            protocol="kafka", kafka_bootstrap_servers=(kafka_broker.bootstrap,), send_timeout_s=20.0
        ),
        kafka_namespace=namespace,
    )
    sender = KafkaSender(settings)

    async def send() -> None:
        await sender.start()
        try:
            with new_entry_span("/inside-a-trace"):
                await sender.send_segments([SEGMENT])
        finally:
            await sender.close()

    asyncio.run(send())
    assert spans_of(sink, Kind.EXIT, Component.KAFKA_PRODUCER) == []
    assert _consume("aiokafka", kafka_broker.bootstrap, sender.topics["segment"], unique_name("g")) == []


def _deserializing_consumer(bootstrap: str, topic: str, group: str, value_deserializer: Any) -> Any:
    """A DeserializingConsumer[str, str] from the module the library defines it in."""
    from confluent_kafka.deserializing_consumer import DeserializingConsumer
    from confluent_kafka.serialization import StringDeserializer

    dc = DeserializingConsumer[str, str](
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "key.deserializer": StringDeserializer(),
            "value.deserializer": value_deserializer,
        }
    )
    dc.subscribe([topic])
    return dc


@pytest.mark.e2e  # the real Kafka broker (tests/realpeers.py)
def test_confluent_serializing_producer_and_deserializing_consumer(
    sink: _sink.MemorySink, kafka_broker: KafkaBroker
) -> None:
    """SerializingProducer / DeserializingConsumer (pure-Python subclasses of the compiled
    types) get the spans of Producer / Consumer, whichever name they are reached by."""
    import confluent_kafka
    from confluent_kafka.serialization import StringDeserializer, StringSerializer

    topic, group = unique_name("topic"), unique_name("group")
    strings = StringSerializer()

    def with_schema_header(value: Any, ctx: Any) -> Any:
        ctx.headers.append(("schema-id", b"7"))  # as Schema Registry serializers can do
        return strings(value, ctx)

    sp = confluent_kafka.SerializingProducer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "key.serializer": strings,
            "value.serializer": with_schema_header,
        }
    )
    delivered: list[Any] = []
    own = [("app-header", b"kept")]
    with new_entry_span("/orders"):
        result = sp.produce(
            topic, key="k1", value="payload", headers=own, on_delivery=lambda e, m: delivered.append(e)
        )
    assert result is None and own == [("app-header", b"kept")]
    assert sp.flush(30) == 0 and delivered == [None]

    producer = one_exit(sink, Component.KAFKA_PRODUCER)
    pspan = producer[1]
    assert pspan[R.SPAN_OPERATION] == f"Kafka/{topic}/Producer"
    assert pspan[R.SPAN_LAYER] == Layer.MQ
    assert pspan[R.SPAN_PEER] == kafka_broker.bootstrap
    assert tags(pspan) == {"mq.broker": kafka_broker.bootstrap, "mq.topic": topic}
    assert not pspan[R.SPAN_IS_ERROR]

    dc = _deserializing_consumer(kafka_broker.bootstrap, topic, group, StringDeserializer())
    try:
        msg = None
        for _ in range(60):
            msg = dc.poll(0.5)
            if msg is not None:
                break
        assert msg is not None
        assert (msg.key(), msg.value()) == ("k1", "payload")  # deserialized, as without the agent
        headers = list(msg.headers() or [])
    finally:
        dc.close()
    # sw8 added before serialization; what the serializer adds to the headers is sent too.
    assert [k for k, _ in headers] == ["app-header", "sw8", "schema-id"]
    assert headers[0] == ("app-header", b"kept") and headers[2] == ("schema-id", b"7")
    wait_for(lambda: len(spans_of(sink, Kind.ENTRY, Component.KAFKA_CONSUMER)) == 1)
    consumer = spans_of(sink, Kind.ENTRY, Component.KAFKA_CONSUMER)[0]
    cspan = consumer[1]
    assert cspan[R.SPAN_OPERATION] == f"Kafka/{topic}/Consumer/{group}"
    assert cspan[R.SPAN_LAYER] == Layer.MQ
    assert tags(cspan) == {"mq.broker": kafka_broker.bootstrap, "mq.topic": topic}
    assert_continues(producer, consumer, dict(headers)["sw8"])


@pytest.mark.e2e  # the real Kafka broker (tests/realpeers.py)
def test_confluent_deserializing_consumer_records_undeserializable_messages(
    sink: _sink.MemorySink, kafka_broker: KafkaBroker
) -> None:
    """A send outside a trace adds no span and no header; a serialization error inside one
    marks the exit span; a message whose value fails to deserialize still gets its entry
    span. The library's exceptions reach the caller."""
    from confluent_kafka.error import ValueDeserializationError, ValueSerializationError
    from confluent_kafka.serialization import StringSerializer
    from confluent_kafka.serializing_producer import SerializingProducer

    topic, group = unique_name("topic"), unique_name("group")
    sp = SerializingProducer(
        {"bootstrap.servers": kafka_broker.bootstrap, "value.serializer": StringSerializer()}
    )
    sp.produce(topic, value="payload")
    assert sp.flush(30) == 0
    assert spans_of(sink, Kind.EXIT, Component.KAFKA_PRODUCER) == []
    with new_entry_span("/bad"), pytest.raises(ValueSerializationError):
        sp.produce(topic, value=12)  # not a str
    _seg, span = one_exit(sink, Component.KAFKA_PRODUCER)
    assert span[R.SPAN_IS_ERROR]
    sink.clear()

    def fails(value: Any, ctx: Any) -> Any:
        raise ValueError("not for this consumer")

    dc = _deserializing_consumer(kafka_broker.bootstrap, topic, group, fails)
    try:
        with pytest.raises(ValueDeserializationError) as raised:
            for _ in range(60):
                dc.poll(0.5)
    finally:
        dc.close()
    assert raised.value.kafka_message.headers() is None  # no header added
    wait_for(lambda: len(spans_of(sink, Kind.ENTRY, Component.KAFKA_CONSUMER)) == 1)
    _seg, cspan = spans_of(sink, Kind.ENTRY, Component.KAFKA_CONSUMER)[0]
    assert cspan[R.SPAN_OPERATION] == f"Kafka/{topic}/Consumer/{group}"
    assert cspan[R.SPAN_REFS] == []


# ------------------------------------------------------------------------------------ RabbitMQ
def _declare(url: str) -> str:
    import pika

    queue = unique_name("q")
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_declare(queue)
    finally:
        conn.close()
    return queue


def _peer(broker: RabbitMQBroker) -> str:
    return f"{broker.host}:{broker.port}"


def test_pika_blocking_publish_and_consume_callback(sink: _sink.MemorySink, rabbitmq: RabbitMQBroker) -> None:
    import pika

    queue = _declare(rabbitmq.url)
    props = pika.BasicProperties(headers={"app": "kept"}, content_type="text/plain")
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq.url))
    try:
        ch = conn.channel()
        with new_entry_span("/orders"):
            assert ch.basic_publish("", queue, b"m1", props) is None
        assert props.headers == {"app": "kept"}  # the caller's properties are not modified
        producer = one_exit(sink, Component.RABBITMQ_PRODUCER)
        _pseg, pspan = producer
        assert pspan[R.SPAN_OPERATION] == f"RabbitMQ/Topic//Queue/{queue}/Producer"
        assert pspan[R.SPAN_LAYER] == Layer.MQ
        assert pspan[R.SPAN_PEER] == _peer(rabbitmq)
        assert tags(pspan) == {"mq.broker": _peer(rabbitmq), "mq.topic": "", "mq.queue": queue}

        seen: dict[str, Any] = {}

        def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
            span = active_span()
            seen.update(body=body, headers=dict(properties.headers), content_type=properties.content_type)
            seen["op"] = span.op if span is not None else None
            with new_local_span("handle"):  # work done by the callback is inside the message's trace
                pass
            channel.basic_ack(method.delivery_tag)
            channel.stop_consuming()

        ch.basic_consume(queue, on_message)
        ch.start_consuming()
    finally:
        conn.close()

    assert seen["body"] == b"m1" and seen["content_type"] == "text/plain"
    assert seen["headers"]["app"] == "kept"
    assert seen["op"] == f"RabbitMQ/Topic//Queue/{queue}/Consumer"
    consumer = spans_of(sink, Kind.ENTRY, Component.RABBITMQ_CONSUMER)
    assert len(consumer) == 1
    cseg, cspan = consumer[0]
    assert tags(cspan) == {"mq.broker": _peer(rabbitmq), "mq.topic": "", "mq.queue": queue}
    assert [s[R.SPAN_OPERATION] for s in cseg[R.SEG_SPANS]] == ["handle", cspan[R.SPAN_OPERATION]]
    assert_continues(producer, consumer[0], seen["headers"]["sw8"])


def test_pika_blocking_generator_get_and_errors(sink: _sink.MemorySink, rabbitmq: RabbitMQBroker) -> None:
    import pika

    queue = _declare(rabbitmq.url)
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq.url))
    try:
        ch = conn.channel()
        with new_entry_span("/three"):
            for body in (b"a", b"b"):
                ch.basic_publish("", queue, body)
        _method, props, body = ch.basic_get(queue, auto_ack=True)
        assert body == b"a" and "sw8" in props.headers
        got = []
        for method, _props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=10):
            assert method is not None
            got.append(body)
            if len(got) == 1:
                break
        ch.cancel()
        assert got == [b"b"]
        with new_entry_span("/three"):
            ch.basic_publish("", queue, b"c")

        def fails(channel: Any, method: Any, properties: Any, body: bytes) -> None:
            raise RuntimeError("handler failed")

        ch.basic_consume(queue, fails, auto_ack=True)
        with pytest.raises(RuntimeError, match="handler failed"):
            ch.start_consuming()
    finally:
        conn.close()
    producers = spans_of(sink, Kind.EXIT, Component.RABBITMQ_PRODUCER)
    consumers = spans_of(sink, Kind.ENTRY, Component.RABBITMQ_CONSUMER)
    assert len(producers) == 3 and len(consumers) == 3
    assert [seg[R.SEG_TRACE_ID] for seg, _ in consumers] == [seg[R.SEG_TRACE_ID] for seg, _ in producers]
    assert [s[R.SPAN_IS_ERROR] for _seg, s in consumers] == [False, False, True]


def test_pika_select_connection(sink: _sink.MemorySink, rabbitmq: RabbitMQBroker) -> None:
    import pika

    queue = _declare(rabbitmq.url)
    seen: dict[str, Any] = {}
    conn: Any = None

    def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
        span = active_span()
        seen["op"] = span.op if span is not None else None
        seen["sw8"] = properties.headers.get("sw8")
        channel.basic_ack(method.delivery_tag)
        conn.close()

    def on_channel(channel: Any) -> None:
        with new_entry_span("/select"):
            channel.basic_publish("", queue, b"x")
        channel.basic_consume(queue, on_message)

    conn = pika.SelectConnection(
        pika.URLParameters(rabbitmq.url),
        on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_close_callback=lambda c, reason: c.ioloop.stop(),
    )
    timer = threading.Timer(30, lambda: conn.ioloop.add_callback_threadsafe(conn.ioloop.stop))
    timer.start()
    try:
        conn.ioloop.start()
    finally:
        timer.cancel()
    assert seen["op"] == f"RabbitMQ/Topic//Queue/{queue}/Consumer"
    producer = one_exit(sink, Component.RABBITMQ_PRODUCER)
    consumer = spans_of(sink, Kind.ENTRY, Component.RABBITMQ_CONSUMER)
    assert len(consumer) == 1
    assert_continues(producer, consumer[0], seen["sw8"])


def test_aio_pika_publish_consume_and_get(sink: _sink.MemorySink, rabbitmq: RabbitMQBroker) -> None:
    import aio_pika

    queue_name = unique_name("q")
    seen: dict[str, Any] = {}

    async def main() -> None:
        conn = await aio_pika.connect_robust(rabbitmq.url)
        async with conn:
            ch = await conn.channel()
            queue = await ch.declare_queue(queue_name, auto_delete=True)
            with new_entry_span("/aio"):
                msg = aio_pika.Message(b"one", headers={"app": "kept"})
                await ch.default_exchange.publish(msg, routing_key=queue_name)
                await ch.default_exchange.publish(aio_pika.Message(b"two"), routing_key=queue_name)
            assert msg.headers == {"app": "kept"}
            got = await queue.get(timeout=10)
            await got.ack()
            seen["get_sw8"] = got.headers["sw8"]
            done = asyncio.get_running_loop().create_future()

            async def on_message(message: Any) -> None:
                async with message.process():
                    span = active_span()
                    seen["op"] = span.op if span is not None else None
                    seen["sw8"] = message.headers["sw8"]
                    with new_local_span("handle"):
                        await asyncio.sleep(0)
                done.set_result(True)

            await queue.consume(on_message)
            await asyncio.wait_for(done, 20)

    asyncio.run(main())
    assert seen["op"] == f"RabbitMQ/Topic//Queue/{queue_name}/Consumer"
    producers = spans_of(sink, Kind.EXIT, Component.RABBITMQ_PRODUCER)
    assert len(producers) == 2
    _pseg, pspan = producers[0]
    assert pspan[R.SPAN_OPERATION] == f"RabbitMQ/Topic//Queue/{queue_name}/Producer"
    assert tags(pspan) == {"mq.broker": _peer(rabbitmq), "mq.topic": "", "mq.queue": queue_name}
    wait_for(lambda: len(spans_of(sink, Kind.ENTRY, Component.RABBITMQ_CONSUMER)) == 2)
    consumers = spans_of(sink, Kind.ENTRY, Component.RABBITMQ_CONSUMER)
    by_sw8 = {seen["get_sw8"]: producers[0], seen["sw8"]: producers[1]}
    for cseg, cspan in consumers:
        ref = cspan[R.SPAN_REFS][0]
        sw8 = next(h for h, (_pseg, pspan) in by_sw8.items() if pspan[R.SPAN_ID] == ref[3])
        assert_continues(by_sw8[sw8], (cseg, cspan), sw8)
    callback_seg = next(seg for seg, _ in consumers if len(seg[R.SEG_SPANS]) == 2)
    assert callback_seg[R.SEG_SPANS][0][R.SPAN_OPERATION] == "handle"


def test_aiormq_plain_function_callback(sink: _sink.MemorySink, rabbitmq: RabbitMQBroker) -> None:
    """aiormq takes a plain function as a consumer callback (not a coroutine function): it
    is called for each message, inside the message's entry span, as without the agent."""
    import aiormq

    queue_name = unique_name("q")
    seen: list[Any] = []

    async def main() -> None:
        conn = await aiormq.connect(rabbitmq.url)
        try:
            ch = await conn.channel()
            await ch.queue_declare(queue_name, auto_delete=True)
            done = asyncio.get_running_loop().create_future()

            def on_message(message: Any) -> None:  # plain: returns None, nothing to await
                span = active_span()
                seen.append((message.body, span.op if span is not None else None))
                if not done.done():
                    done.set_result(True)

            with new_entry_span("/plain"):
                await ch.basic_publish(b"m", routing_key=queue_name)
            await ch.basic_consume(queue_name, on_message, no_ack=True)
            await asyncio.wait_for(done, 20)
        finally:
            await conn.close()

    asyncio.run(main())
    assert seen == [(b"m", f"RabbitMQ/Topic//Queue/{queue_name}/Consumer")]
    wait_for(lambda: len(spans_of(sink, Kind.ENTRY, Component.RABBITMQ_CONSUMER)) == 1)
    ((_seg, span),) = spans_of(sink, Kind.ENTRY, Component.RABBITMQ_CONSUMER)
    assert span[R.SPAN_IS_ERROR] is False


@pytest.mark.parametrize("form", ["native", "python"])
def test_aiormq_publish_gives_the_callers_properties_their_message_id(
    sink: _sink.MemorySink, rabbitmq: RabbitMQBroker, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiormq writes the message_id it makes for a message without one on the properties it is
    given: the caller's object without the agent. In a trace the message goes with a copy
    (the trace's headers added); the caller's properties still end with that message's id,
    their headers dict untouched, and an id of the caller's is kept, as outside a trace."""
    import aiormq
    from pamqp.commands import Basic

    from swmp.instrument import aiormq as instr

    if form == "python":  # the wrapper installed without the native core
        instr.uninstall()
        monkeypatch.setattr(instr, "_AmqpPublish", None)
        instr.install(load({}, agent_log_reporter_active=False))
    queue_name = unique_name("q")
    headers = {"app": "kept"}
    fresh = Basic.Properties(content_type="text/plain", headers=headers)
    own = Basic.Properties(message_id="mine")
    untraced = Basic.Properties()
    received: list[Any] = []

    async def main() -> None:
        conn = await aiormq.connect(rabbitmq.url)
        try:
            ch = await conn.channel()
            await ch.queue_declare(queue_name, auto_delete=True)
            with new_entry_span("/ids"):
                await ch.basic_publish(b"fresh", routing_key=queue_name, properties=fresh)
                await ch.basic_publish(b"own", routing_key=queue_name, properties=own)
            await ch.basic_publish(b"untraced", routing_key=queue_name, properties=untraced)
            for _ in range(3):
                got = await ch.basic_get(queue_name, no_ack=True)
                received.append((got.body, got.header.properties.message_id, got.header.properties.headers))
        finally:
            await conn.close()

    asyncio.run(main())
    ids = {body: message_id for body, message_id, _ in received}
    assert fresh.message_id and fresh.message_id == ids[b"fresh"]  # the id that message went with
    assert own.message_id == ids[b"own"] == "mine"
    assert untraced.message_id and untraced.message_id == ids[b"untraced"]  # aiormq's own doing
    assert fresh.headers is headers and headers == {"app": "kept"}
    assert "sw8" in received[0][2] and received[0][2]["app"] == "kept"
    if form == "python":
        instr.uninstall()
        monkeypatch.undo()
        instr.install(load({}, agent_log_reporter_active=False))


def test_confluent_headers_it_refuses_are_refused_in_a_trace(sink: _sink.MemorySink) -> None:
    """confluent-kafka takes a list or a dict of headers; anything else it refuses with its
    own TypeError, inside a trace as outside one (no broker needed: the check comes first)."""
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": "127.0.0.1:9", "socket.timeout.ms": 100})
    for headers in ((("a", b"1"),), "ab"):
        with pytest.raises(TypeError) as outside:
            producer.produce("t", b"v", headers=headers)
        with new_entry_span("/t"), pytest.raises(TypeError) as inside:
            producer.produce("t", b"v", headers=headers)
        assert str(inside.value) == str(outside.value)


def test_amqp_publish_outside_a_trace_adds_nothing(sink: _sink.MemorySink, rabbitmq: RabbitMQBroker) -> None:
    import pika

    queue = _declare(rabbitmq.url)
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq.url))
    try:
        ch = conn.channel()
        ch.basic_publish("", queue, b"plain")
        _method, props, body = ch.basic_get(queue, auto_ack=True)
    finally:
        conn.close()
    assert body == b"plain" and props.headers is None
    assert spans_of(sink, Kind.EXIT, Component.RABBITMQ_PRODUCER) == []


# ------------------------------------------------------------------------------------ shared parts
def test_consumed_message_gets_its_own_segment_whatever_is_current(sink: _sink.MemorySink) -> None:
    from swmp.instrument import _mq

    with new_entry_span("/request") as outer:
        with new_local_span("poll-loop") as loop_span:
            producer = _mq.exit_span("Kafka/t/Producer", "b:1", Component.KAFKA_PRODUCER)
            assert producer is not None
            headers = _mq.kafka_headers(producer, None)
            producer.finish()
            _mq.kafka_consumed("t", "g", headers, "b:1")
            assert active_span() is loop_span  # the application's context is given back
        _mq.kafka_consumed("t", "g", [("sw8", b"garbage")], "b")
    entries = spans_of(sink, Kind.ENTRY, Component.KAFKA_CONSUMER)
    assert len(entries) == 2
    (seg1, span1), (seg2, span2) = entries
    assert span1[R.SPAN_PARENT_ID] == span2[R.SPAN_PARENT_ID] == -1  # first span of its own segment
    outer_seg = next(seg for seg in segments(sink) if seg[R.SEG_SPANS][-1][R.SPAN_OPERATION] == "/request")
    assert seg1[R.SEG_TRACE_ID] == outer_seg[R.SEG_TRACE_ID]  # continues the sw8 it carried
    assert seg2[R.SEG_TRACE_ID] != outer_seg[R.SEG_TRACE_ID] and span2[R.SPAN_REFS] == []  # bad header
    assert outer.end and active_span() is None


def test_consuming_marks_errors_and_restores_the_context(sink: _sink.MemorySink) -> None:
    from swmp.instrument import _mq

    with new_entry_span("/outer") as outer:
        with (
            pytest.raises(KeyError),
            _mq.amqp_consuming("", "q", {}, "b"),
        ):
            span = active_span()
            assert span is not None and span.op == "RabbitMQ/Topic//Queue/q/Consumer"
            raise KeyError("boom")
        assert active_span() is outer
    [(_seg, span)] = spans_of(sink, Kind.ENTRY, Component.RABBITMQ_CONSUMER)
    assert span[R.SPAN_IS_ERROR]


def test_headers_are_new_objects_with_one_sw8() -> None:
    from swmp.instrument import _mq

    with new_entry_span("/h"):
        span = _mq.exit_span("Kafka/t/Producer", "b:1", Component.KAFKA_PRODUCER)
        assert span is not None
        given = [("a", b"1"), ("sw8", b"stale")]
        out = _mq.kafka_headers(span, given)
        table = {"x": "y", "sw8": "stale"}
        amqp = _mq.amqp_headers(span, table)
        span.finish()
    assert given == [("a", b"1"), ("sw8", b"stale")] and table == {"x": "y", "sw8": "stale"}
    assert [k for k, _ in out] == ["a", "sw8"] and out[1][1] != b"stale"
    assert amqp["x"] == "y" and amqp["sw8"] == out[1][1].decode()


def test_mq_instrumentations_install_on_first_import_and_honour_disable() -> None:
    """At agent start nothing is imported; each library is patched when the application
    imports it; ``SW_AGENT_DISABLE_PLUGINS`` with the peer agent's names leaves it alone."""
    from tests.test_instrument_lazy import run_child

    body = """
    libs = ("kafka", "confluent_kafka", "aiokafka", "pika", "aiormq")
    status = instrument.install_all(configure())
    before = {n: status[n] for n in libs}
    imported_at_start = loaded(libs)
    import confluent_kafka, kafka, pika, aiokafka, aiormq
    from pika.channel import Channel
    after = {n: instrument.statuses()[n] for n in libs}
    patched = [
        is_patched(kafka.KafkaProducer, "send"),
        is_patched(Channel, "basic_publish"),
        is_patched(aiokafka.AIOKafkaProducer, "send"),
        is_patched(aiormq.Channel, "basic_publish"),
        confluent_kafka.Producer is confluent_kafka.cimpl.Producer,
        is_patched(confluent_kafka.SerializingProducer, "produce"),
        is_patched(confluent_kafka.DeserializingConsumer, "poll"),
    ]
    report(before=before, imported_at_start=imported_at_start, after=after, patched=patched)
    """
    found, _ = run_child(body)
    libs = ("kafka", "confluent_kafka", "aiokafka", "pika", "aiormq")
    assert found["imported_at_start"] == []
    assert found["before"] == dict.fromkeys(libs, "deferred")
    assert found["after"] == dict.fromkeys(libs, "installed")
    assert found["patched"][:4] == [True, True, True, True]
    assert found["patched"][4] is False  # confluent_kafka.Producer is swmp's subclass now
    assert found["patched"][5:] == [True, True]

    found, _ = run_child(
        body, env={"SW_AGENT_DISABLE_PLUGINS": "sw_kafka,sw_confluent_kafka,aiokafka,sw_rabbitmq,sw_aiormq"}
    )
    assert found["before"] == dict.fromkeys(libs, "disabled")
    assert found["patched"][:4] == [False, False, False, False] and found["patched"][4] is True
    assert found["patched"][5:] == [False, False]


def test_kafka_python_without_native_crc32c_says_so_once_at_install(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The sw8 header costs kafka-python ~0.11 us a byte to checksum without the crc32c
    package: the operator is told where that cost comes from, and told nothing when the
    package is there."""
    from kafka.record import util

    from swmp.instrument import kafka as kafka_instrumentation

    for native, expected in ((None, 1), (lambda data, crc=0: 0, 0)):
        monkeypatch.setattr(util, "crc32c_c", native)
        caplog.clear()
        with caplog.at_level("INFO", logger="swmp.instrument"):
            kafka_instrumentation.install(load({}, agent_log_reporter_active=False))
            kafka_instrumentation.uninstall()
        said = [r for r in caplog.records if "pip install crc32c" in r.getMessage()]
        assert len(said) == expected
        assert kafka_instrumentation.checksums_in_python() is (native is None)
