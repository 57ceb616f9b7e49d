"""aiokafka: an exit span per ``AIOKafkaProducer.send`` inside a trace (``sw8`` in the record
headers; ``send_and_wait`` goes through ``send``) and an entry span per record returned by
``AIOKafkaConsumer.getone`` (also behind ``async for``) and ``getmany``.

Span shapes are those of the kafka-python instrumentation (``swmp.instrument.kafka``). The
producer span covers the ``send`` coroutine (metadata wait, serialization, the hand-over to
the accumulator); the broker's acknowledgement arrives later on the returned future. A
cancelled ``send`` marks its span as an error and the cancellation propagates unchanged.
The span is opened when the send is awaited, in the awaiting task; with the native core the
send returns an awaitable of the agent's that does so without a coroutine of ours
(swmp/_native/kafka_send.c; the Python ``send`` in :func:`traced_send` is the reference and
the fallback).

swmp's own Kafka reporter uses aiokafka too, in the application's process when the reporter
runs as a thread: its producers carry ``INTERNAL_MARK`` and are never traced or modified
(and they send outside any trace anyway).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument import _mq
from swmp.instrument._gate import gated, named_like
from swmp.instrument._patch import patch, restore

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "aiokafka"
PEER_NAMES: tuple[str, ...] = ()  # the SkyWalking Python agent has no aiokafka plugin
PACKAGE = "aiokafka"
SUPPORTED = ("0.8", "1")
TRIGGER = "aiokafka"

# Attribute set (True) on producers that belong to the agent itself (reporter_proc's Kafka
# sender). reporter_proc cannot import swmp, so the name is spelled there too.
INTERNAL_MARK = "_swmp_internal"


def _brokers(client: Any) -> str:
    servers = getattr(client, "_bootstrap_servers", "") or ""
    try:
        return servers if isinstance(servers, str) else ";".join(servers)
    except TypeError:
        return str(servers)


# The send without a coroutine of ours (swmp/_native/kafka_send.c); None without the native
# core (or with SWMP_TRACE_PURE=1).
_KafkaSend: Any = getattr(_mq.native_consuming, "KafkaSend", None)


def traced_send(orig: Any) -> Any:
    """The wrapper of ``AIOKafkaProducer.send``: an exit span per send inside a trace, the
    record given the trace's headers; outside a trace the original itself (its own
    coroutine)."""

    async def send(  # noqa: PLR0917 (the library's own signature)
        self: Any,
        topic: Any,
        value: Any = None,
        key: Any = None,
        partition: Any = None,
        timestamp_ms: Any = None,
        headers: Any = None,
    ) -> Any:
        if getattr(self, INTERNAL_MARK, False):  # not __dict__: it would de-optimise the instance
            return await orig(self, topic, value, key, partition, timestamp_ms, headers)
        if headers is not None and headers.__class__ is not list:
            # aiokafka's record builder takes an exact list: a tuple (or a list subclass) is
            # its TypeError, which a merged plain list would have turned into a sent record.
            return await orig(self, topic, value, key, partition, timestamp_ms, headers)
        span, traced = _mq.kafka_send_span(topic, _brokers(self.client), headers)
        if span is None:
            return await orig(self, topic, value, key, partition, timestamp_ms, headers)
        with span:
            return await orig(self, topic, value, key, partition, timestamp_ms, traced)

    # With the native core the same steps in C, the span opened when the send is awaited.
    named_like(send, orig)  # the fallback's binding errors name aiokafka's send (see there)
    native = send if _KafkaSend is None else _KafkaSend(orig, send, INTERNAL_MARK)
    return gated(orig, native)


def install(config: Config) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: PLC0415

    def _record(consumer: Any, r: Any) -> None:
        _mq.kafka_consumed(r.topic, consumer._group_id or "", r.headers, _brokers(consumer._client))

    def make_getone(orig: Any) -> Any:
        async def getone(self: Any, *partitions: Any) -> Any:
            record = await orig(self, *partitions)
            try:
                _record(self, record)
            except Exception:
                _mq.warn_once("aiokafka.getone", "swmp: tracing an aiokafka record failed")
            return record

        return getone

    def make_getmany(orig: Any) -> Any:
        async def getmany(self: Any, *partitions: Any, **kwargs: Any) -> Any:
            batch = await orig(self, *partitions, **kwargs)
            if batch:
                try:
                    for records in batch.values():
                        for r in records:
                            _record(self, r)
                except Exception:
                    _mq.warn_once("aiokafka.getmany", "swmp: tracing aiokafka records failed")
            return batch

        return getmany

    patch(AIOKafkaProducer, "send", traced_send)
    patch(AIOKafkaConsumer, "getone", make_getone)
    patch(AIOKafkaConsumer, "getmany", make_getmany)


def uninstall() -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: PLC0415

    restore(AIOKafkaProducer, "send")
    restore(AIOKafkaConsumer, "getone")
    restore(AIOKafkaConsumer, "getmany")
