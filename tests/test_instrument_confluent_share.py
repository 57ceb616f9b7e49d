"""confluent-kafka's share consumers (KIP-932 share groups) against a real Kafka 4 broker:
``ShareConsumer.poll`` and ``DeserializingShareConsumer.poll`` batches get one entry span per
record, continuing the producer's trace; the batch, its messages, explicit acknowledgement
and redelivery behave as without the agent."""

from __future__ import annotations

import time
from typing import Any

import pytest

from reporter_proc import records as R
from swmp import _sink
from swmp.tracing import Component, Kind
from swmp.tracing.constants import Layer
from swmp.tracing.context import new_entry_span
from tests.realpeers import KafkaBroker, unique_name
from tests.test_instrument_mq import assert_continues, sink, spans_of, tags, wait_for

pytestmark = pytest.mark.e2e  # the real Kafka 4 broker (tests/realpeers.py)

__all__ = ["sink"]  # the fixture, shared with the sync MQ tests


def _from_earliest(bootstrap: str, group: str) -> None:
    """A share group starts at the log's end by default: make ``group`` read what is there."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures fail once it is freed
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def _produce(bootstrap: str, topic: str, values: list[bytes], traced: int) -> list[Any]:
    """Send ``values``, the first ``traced`` each inside a trace of its own; their headers."""
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    sent: list[Any] = []
    for i, value in enumerate(values):
        headers = [("app", b"kept")]
        if i < traced:
            with new_entry_span(f"/send/{i}"):
                producer.produce(topic, value=value, headers=headers)
        else:
            producer.produce(topic, value=value, headers=headers)
        sent.append(headers)
    assert producer.flush(30) == 0
    return sent


def _poll_until(consumer: Any, count: int, keep: Any = None) -> list[list[Any]]:
    """Poll batches until ``count`` records (``keep(msg)`` decides what counts) arrived."""
    batches: list[list[Any]] = []
    deadline = time.monotonic() + 60
    while sum(len(b) for b in batches) < count:
        assert time.monotonic() < deadline, f"{sum(len(b) for b in batches)} of {count} records"
        got = consumer.poll(0.5)
        assert type(got).__name__ == "Messages"  # the library's own container, returned as is
        batch = [m for m in got if (keep or (lambda m: m.error() is None))(m)]
        if batch:
            batches.append(batch)
    return batches


def _entry_spans(sink: _sink.MemorySink, n: int) -> list[tuple[list[Any], list[Any]]]:
    wait_for(lambda: len(spans_of(sink, Kind.ENTRY, Component.KAFKA_CONSUMER)) >= n)
    found = spans_of(sink, Kind.ENTRY, Component.KAFKA_CONSUMER)
    assert len(found) == n, found
    return found


def test_share_consumer_records_continue_the_producers_trace(
    sink: _sink.MemorySink, kafka4_broker: KafkaBroker
) -> None:
    import confluent_kafka
    from confluent_kafka import cimpl

    bootstrap = kafka4_broker.bootstrap
    topic, group = unique_name("share-topic"), unique_name("share-group")
    _from_earliest(bootstrap, group)
    _produce(bootstrap, topic, [b"t0", b"t1", b"plain"], traced=2)
    producers = spans_of(sink, Kind.EXIT, Component.KAFKA_PRODUCER)
    assert len(producers) == 2

    consumer = confluent_kafka.ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    assert type(consumer) is not cimpl.ShareConsumer and isinstance(consumer, cimpl.ShareConsumer)
    try:
        consumer.subscribe([topic])
        msgs = [m for batch in _poll_until(consumer, 3) for m in batch]
    finally:
        consumer.close()

    by_value = {m.value(): m for m in msgs}
    assert sorted(by_value) == [b"plain", b"t0", b"t1"]
    assert by_value[b"plain"].headers() == [("app", b"kept")]  # nothing added outside a trace
    consumers = _entry_spans(sink, 3)
    for _seg, span in consumers:
        assert span[R.SPAN_OPERATION] == f"Kafka/{topic}/Consumer/{group}"
        assert span[R.SPAN_LAYER] == Layer.MQ
        assert tags(span) == {"mq.broker": bootstrap, "mq.topic": topic}
        assert not span[R.SPAN_IS_ERROR]
    # Producer i's record continues its trace: match them by the sw8 each record carried.
    for i, value in enumerate((b"t0", b"t1")):
        headers = dict(by_value[value].headers())
        assert headers["app"] == b"kept"
        pseg, pspan = producers[i]
        (consumer_span,) = [c for c in consumers if c[0][R.SEG_TRACE_ID] == pseg[R.SEG_TRACE_ID]]
        assert_continues((pseg, pspan), consumer_span, headers["sw8"])
    assert sum(1 for seg, _span in consumers if _span[R.SPAN_REFS] == []) == 1  # the untraced one


def test_deserializing_share_consumer_explicit_acks_and_redelivery(
    sink: _sink.MemorySink, kafka4_broker: KafkaBroker
) -> None:
    """Deserialized values, a record whose value fails to deserialize (kept in the batch with
    its error: it was delivered, so it has a span), and a record released for redelivery: a
    second delivery, a second span."""
    import confluent_kafka
    from confluent_kafka import AcknowledgeType, KafkaError
    from confluent_kafka.deserializing_share_consumer import DeserializingShareConsumer
    from confluent_kafka.serialization import StringSerializer

    bootstrap = kafka4_broker.bootstrap
    topic, group = unique_name("share-topic"), unique_name("share-group")
    _from_earliest(bootstrap, group)
    producer = confluent_kafka.SerializingProducer(
        {"bootstrap.servers": bootstrap, "value.serializer": StringSerializer()}
    )
    with new_entry_span("/send"):
        for value in ("good", "bad", "again"):
            producer.produce(topic, value=value)
    assert producer.flush(30) == 0
    assert len(spans_of(sink, Kind.EXIT, Component.KAFKA_PRODUCER)) == 3

    def deserialize(value: bytes, ctx: Any) -> str:
        if value == b"bad":
            raise ValueError("not for this consumer")
        return value.decode().upper()

    consumer = DeserializingShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
            "value.deserializer": deserialize,
        }
    )
    delivered = lambda m: m.error() is None or m.error().code() == KafkaError._VALUE_DESERIALIZATION  # noqa: E731
    released = False
    seen: list[tuple[Any, Any]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(seen) < 4:  # three records, one of them twice
            assert time.monotonic() < deadline, seen
            for m in [m for m in consumer.poll(0.5) if delivered(m)]:
                seen.append((m.value(), m.error() and m.error().code()))
                if m.value() == "AGAIN" and not released:
                    consumer.acknowledge(m, AcknowledgeType.RELEASE)  # back to the group
                    released = True
                else:
                    consumer.acknowledge(m)
            consumer.commit_sync(30)
    finally:
        consumer.close()

    bad = (b"bad", KafkaError._VALUE_DESERIALIZATION)  # raw bytes kept, the error set
    assert sorted(seen, key=repr) == sorted([("GOOD", None), bad, ("AGAIN", None), ("AGAIN", None)], key=repr)
    consumers = _entry_spans(sink, 4)
    assert {span[R.SPAN_OPERATION] for _seg, span in consumers} == {f"Kafka/{topic}/Consumer/{group}"}
    (trace,) = {seg[R.SEG_TRACE_ID] for seg, _span in spans_of(sink, Kind.EXIT, Component.KAFKA_PRODUCER)}
    assert all(seg[R.SEG_TRACE_ID] == trace for seg, _span in consumers)  # all in the sender's trace


def test_share_consumer_types_are_replaced_while_installed(sink: _sink.MemorySink) -> None:
    import confluent_kafka
    from confluent_kafka import cimpl

    from swmp import instrument
    from swmp.instrument._patch import is_patched

    assert confluent_kafka.ShareConsumer is not cimpl.ShareConsumer
    assert confluent_kafka.ShareConsumer.__qualname__ == "ShareConsumer"
    assert is_patched(confluent_kafka.DeserializingShareConsumer, "poll")
    instrument.uninstall_all()
    assert confluent_kafka.ShareConsumer is cimpl.ShareConsumer
    assert not is_patched(confluent_kafka.DeserializingShareConsumer, "poll")
