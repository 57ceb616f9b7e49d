"""confluent-kafka: an exit span per ``Producer.produce`` / ``SerializingProducer.produce``
inside a trace (``sw8`` in the message headers) and an entry span per message returned by
``Consumer.poll`` / ``consume``, ``DeserializingConsumer.poll``, and the share consumers'
``ShareConsumer.poll`` / ``DeserializingShareConsumer.poll`` (KIP-932 share groups, Kafka 4.x
brokers; confluent-kafka 2.14+).

``Producer``, ``Consumer`` and ``ShareConsumer`` are compiled types whose methods cannot be
replaced, so the module's ``confluent_kafka.Producer`` / ``Consumer`` / ``ShareConsumer``
names are replaced by subclasses that add the spans (what ``from confluent_kafka import
Producer`` returns once the library is imported under the agent). Instances are still
instances of the original types. Not covered there: references taken before the agent started.

``SerializingProducer`` and ``DeserializingConsumer`` are Python classes deriving from the
compiled types directly (not from the subclasses above), so their own ``__init__`` (to keep
``bootstrap.servers`` / ``group.id``), ``produce`` and ``poll`` are patched in place: every
name they are reached by (``confluent_kafka``, ``confluent_kafka.serializing_producer`` /
``deserializing_consumer``, references taken earlier) and every application subclass is
traced. Their names are not replaced: the library's methods call
``super(SerializingProducer, self)`` through the module's global name. ``produce`` gets the
traced headers before serialization, so the span covers serialization and the hand-over (a
serialization error marks it as an error) and serializers see the new list / dict (one that
writes the schema id into the headers writes it there: it reaches the message, the caller's
object stays unmodified). ``poll`` records the message it returns, and also one that fails to
deserialize (the ``Key``/``ValueDeserializationError``'s ``kafka_message``) before the
exception propagates; ``DeserializingConsumer.consume`` is the library's
``NotImplementedError``. ``DeserializingShareConsumer`` (a Python class deriving from the
compiled ``ShareConsumer``) is patched in place the same way; its ``poll`` marks a record that
fails to deserialize with an error instead of raising, and that record, delivered all the
same, gets its entry span too (a broker error in the batch gets none).

A share consumer's ``poll`` returns a batch, like ``Consumer.consume``: one entry span per
record, each recorded when the batch returns (``Kafka/<topic>/Consumer/<share group id>``); the
application's handling of the records runs after them, outside any span. Acknowledgements
(``acknowledge``, ``commit_sync``/``commit_async``) are not traced; a record the broker
redelivers (released, or its lock expired) is a new delivery and gets a span of its own.

Span shapes are those of the kafka-python instrumentation: ``Kafka/<topic>/Producer`` and
``Kafka/<topic>/Consumer/<group.id>``, components 40/41, ``mq.broker`` = the configured
``bootstrap.servers``. (The SkyWalking Python agent also puts the message key into the
operation names and an ``mq.queue`` tag; keys are usually unique, which would make one
endpoint per message in the OAP, so swmp leaves them out.) The producer span covers
``produce`` (the hand-over to librdkafka's queue); delivery reports arrive later through
``poll``/``flush`` callbacks, unchanged. Calls that pass ``headers`` positionally (and, to
``Producer.produce``, ``timestamp``) are sent untraced.

The asyncio clients (``confluent_kafka.aio``, confluent-kafka 2.13+) are traced by
``swmp.instrument._confluent_aio``: they run the sync ``Producer`` / ``Consumer`` above in a
thread pool, so their spans are made on the event loop instead (see there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument import _confluent_aio, _hook, _mq
from swmp.instrument._confluent_aio import record as _record
from swmp.instrument._gate import gated
from swmp.instrument._patch import Target, patch_all, restore_all

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "confluent_kafka"
PEER_NAMES = ("sw_confluent_kafka",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "confluent-kafka"
SUPPORTED = ("1.5", "3")
TRIGGER = "confluent_kafka"

_originals: dict[str, Any] = {}
_targets: list[Target] = []
_PRODUCER_BEFORE_HEADERS = 4  # Producer.produce: value, key, partition, on_delivery (after topic)
_SERIALIZING_BEFORE_HEADERS = 5  # SerializingProducer.produce: key, value, partition, on_delivery, timestamp


def _conf(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> str:
    v = kwargs.get(name)
    if v is None and args and isinstance(args[0], dict):
        v = args[0].get(name)
    if v is None:
        return ""
    return v if isinstance(v, str) else ";".join(map(str, v))


def _remember(client: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Keep the client's ``bootstrap.servers`` and ``group.id`` for its spans."""
    try:
        client._swmp_brokers = _conf(args, kwargs, "bootstrap.servers")
        client._swmp_group = _conf(args, kwargs, "group.id")
    except Exception:
        _mq.warn_once("confluent.conf", "swmp: reading a confluent-kafka configuration failed")


def _with_headers(span: Any, headers: Any) -> Any:
    if isinstance(headers, dict):
        return _mq.amqp_headers(span, headers)
    if headers is not None and not isinstance(headers, list):
        return headers  # confluent-kafka takes a list or a dict: its own error, as without us
    return _mq.kafka_headers(span, headers)


def _record_batch(client: Any, msgs: Any) -> Any:
    """Record every message of a returned batch; the batch itself, untouched."""
    for m in msgs:
        _record(client, m)
    return msgs


def _types(base_producer: Any, base_consumer: Any) -> tuple[type, type]:
    class Producer(base_producer):  # type: ignore[misc]
        __doc__ = base_producer.__doc__
        _swmp_batch_headers = True  # produce_batch sends the aio clients' traced headers

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            _remember(self, args, kwargs)

        # Outside a trace a produce goes straight to librdkafka's (a gate: no frame of ours).
        produce = gated(base_producer.produce, _make_produce(base_producer.produce, _PRODUCER_BEFORE_HEADERS))

        def produce_batch(self, topic: Any, messages: Any, *args: Any, **kwargs: Any) -> Any:
            if _confluent_aio.carries_traced(messages):
                return _confluent_aio.produce_batch(self, topic, messages, args, kwargs, base=base_producer)
            return super().produce_batch(topic, messages, *args, **kwargs)

    class Consumer(base_consumer):  # type: ignore[misc]
        __doc__ = base_consumer.__doc__
        _swmp_aio = False  # True: wrapped by an AIOConsumer, which records on the event loop

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            _remember(self, args, kwargs)

        def poll(self, *args: Any, **kwargs: Any) -> Any:
            msg = super().poll(*args, **kwargs)
            if not self._swmp_aio:
                _record(self, msg)
            return msg

        def consume(self, *args: Any, **kwargs: Any) -> Any:
            msgs = super().consume(*args, **kwargs)
            return msgs if self._swmp_aio else _record_batch(self, msgs)

    for cls, base in ((Producer, base_producer), (Consumer, base_consumer)):
        cls.__module__ = base.__module__
        cls.__qualname__ = base.__qualname__
    return Producer, Consumer


def _share_type(base: Any) -> type:
    class ShareConsumer(base):  # type: ignore[misc]
        __doc__ = base.__doc__

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            _remember(self, args, kwargs)

        def poll(self, *args: Any, **kwargs: Any) -> Any:
            return _record_batch(self, super().poll(*args, **kwargs))

    ShareConsumer.__module__ = base.__module__
    ShareConsumer.__qualname__ = base.__qualname__
    return ShareConsumer


# -- SerializingProducer / DeserializingConsumer: Python classes, patched in place ----------
def _make_init(orig: Any) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        _remember(self, args, kwargs)

    return __init__


def _make_produce(orig: Any, limit: int) -> Any:
    """The traced form of ``orig`` (a ``produce`` taking the client first), called by its
    gate while a trace is current: ``orig(self, topic, *args, **kwargs)`` inside an exit span
    with ``sw8`` in its headers, unless the headers are passed positionally (more than
    ``limit`` arguments after the topic)."""

    def produce(self: Any, topic: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) > limit:
            return orig(self, topic, *args, **kwargs)
        brokers = getattr(self, "_swmp_brokers", "")
        headers = kwargs.get("headers")
        # A header list (or none) is merged by kafka_send_span itself: no frame of ours.
        merge = None if headers is None or headers.__class__ is list else _with_headers
        span, traced = _mq.kafka_send_span(topic, brokers, headers, merge)
        if span is None:
            return orig(self, topic, *args, **kwargs)
        kwargs["headers"] = traced  # a dict of this call's own: the caller's is not touched
        with span:
            return orig(self, topic, *args, **kwargs)

    return produce


def _gated_serializing_produce(orig: Any) -> Any:
    return gated(orig, _make_produce(orig, _SERIALIZING_BEFORE_HEADERS))


def _make_poll(orig: Any) -> Any:
    def poll(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            msg = orig(self, *args, **kwargs)
        except Exception as e:
            # A message that failed to deserialize was still delivered (ConsumeError's
            # message is an error and is skipped).
            _record(self, getattr(e, "kafka_message", None))
            raise
        _record(self, msg)
        return msg

    return poll


def _make_share_poll(orig: Any) -> Any:
    def poll(self: Any, *args: Any, **kwargs: Any) -> Any:
        msgs = orig(self, *args, **kwargs)
        for m in msgs:
            _confluent_aio.record_delivered(self, m)
        return msgs

    return poll


def install(config: Config) -> None:
    import confluent_kafka  # noqa: PLC0415

    if _originals:
        return
    sp, dc = confluent_kafka.SerializingProducer, confluent_kafka.DeserializingConsumer
    targets: list[Target] = [
        (sp, "__init__", _make_init),
        (sp, "produce", _gated_serializing_produce),
        (dc, "__init__", _make_init),
        (dc, "poll", _make_poll),
    ]
    dsc = getattr(confluent_kafka, "DeserializingShareConsumer", None)  # 2.14+
    if dsc is not None:
        targets += [(dsc, "__init__", _make_init), (dsc, "poll", _make_share_poll)]
    patch_all(targets)
    _targets[:] = targets
    producer, consumer = _types(confluent_kafka.Producer, confluent_kafka.Consumer)
    _originals["Producer"] = confluent_kafka.Producer
    _originals["Consumer"] = confluent_kafka.Consumer
    confluent_kafka.Producer = producer  # type: ignore[misc,assignment]
    confluent_kafka.Consumer = consumer  # type: ignore[misc,assignment]
    share = getattr(confluent_kafka, "ShareConsumer", None)
    if share is not None:
        _originals["ShareConsumer"] = share
        confluent_kafka.ShareConsumer = _share_type(share)  # type: ignore[misc,assignment]
    _hook.defer("confluent_kafka.aio", _confluent_aio.install, key="confluent_kafka.aio")


def uninstall() -> None:
    import confluent_kafka  # noqa: PLC0415

    for name, cls in _originals.items():
        setattr(confluent_kafka, name, cls)
    _originals.clear()
    restore_all(_targets)
    _targets.clear()
    _confluent_aio.uninstall()
