"""kafka-python: an exit span per ``KafkaProducer.send`` inside a trace (``sw8`` in the record
headers) and an entry span per record returned by ``KafkaConsumer.poll`` or iteration.

Producer: operation ``Kafka/<topic>/Producer``, component kafka-producer (40), layer MQ,
peer and ``mq.broker`` the bootstrap servers joined by ``;``, ``mq.topic``. The span covers
``send`` (serialization and the hand-over to the accumulator), not the broker's
acknowledgement, which arrives later on the returned future.

Consumer: ``poll`` returns a batch (topic-partition -> records); each record of the batch
gets its own entry span and segment (operation ``Kafka/<topic>/Consumer/<group id>``,
component kafka-consumer (41)), continuing the trace of the producer that sent it. The
spans record the delivery and are finished when ``poll`` returns (see ``_mq``).

Iteration (``for record in consumer``) fetches through ``poll(update_offsets=False)`` too, but
hands the batch out one record at a time, and drops the rest of it on a seek, a pause or a
lost assignment: those records are fetched again later. So that path records a span per record
as ``__next__`` returns it, and its inner ``poll`` records none: one span per record the
application receives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument import _mq
from swmp.instrument._gate import gated
from swmp.instrument._patch import patch, restore

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "kafka"
PEER_NAMES = ("sw_kafka",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "kafka-python"
SUPPORTED = ("2.0", "4")
TRIGGER = "kafka"

_HEADERS_SINCE = (0, 11)  # record headers need message format v2


def _brokers(client: Any) -> str:
    try:
        servers = client.config.get("bootstrap_servers") or ""
        return servers if isinstance(servers, str) else ";".join(servers)
    except Exception:
        return ""


def _headers_supported(producer: Any) -> bool:
    try:
        api = producer.config.get("api_version")
        return api is None or tuple(api) >= _HEADERS_SINCE
    except Exception:
        return False


def checksums_in_python() -> bool:
    """Whether this kafka-python checksums record batches in pure Python: it uses the
    ``crc32c`` package when it is installed (``kafka.record.util.crc32c_c``), else its own
    Python CRC32C, ~0.11 us a byte (docs/instrumentation.md)."""
    try:
        from kafka.record import util  # noqa: PLC0415
    except Exception:
        return False
    return getattr(util, "crc32c_c", True) is None


def install(config: Config) -> None:
    from kafka import KafkaConsumer, KafkaProducer  # noqa: PLC0415

    if checksums_in_python():
        # Said once, at install: the cost of the header is the client's, and one package away.
        _mq.log.info(
            "swmp: kafka-python checksums records in pure Python (the crc32c package is not "
            "installed): the ~155-byte sw8 header swmp adds to each record costs ~20-40 us to "
            "produce and to consume; `pip install crc32c` makes it ~1 us"
        )

    def make_send(orig: Any) -> Any:
        def send(  # noqa: PLR0917 (the library's own signature)
            self: Any,
            topic: Any,
            value: Any = None,
            key: Any = None,
            headers: Any = None,
            partition: Any = None,
            timestamp_ms: Any = None,
        ) -> Any:
            if not (headers is None or isinstance(headers, list)):
                return orig(self, topic, value, key, headers, partition, timestamp_ms)
            if not _headers_supported(self):
                return orig(self, topic, value, key, headers, partition, timestamp_ms)
            span, traced = _mq.kafka_send_span(topic, _brokers(self), headers)
            if span is None:
                return orig(self, topic, value, key, headers, partition, timestamp_ms)
            with span:
                return orig(self, topic, value, key, traced, partition, timestamp_ms)

        return gated(orig, send)  # outside a trace: the original itself

    def make_poll(orig: Any) -> Any:
        def poll(self: Any, *args: Any, **kwargs: Any) -> Any:
            batch = orig(self, *args, **kwargs)
            if batch and _updates_offsets(args, kwargs):
                try:
                    brokers = _brokers(self)
                    group = self.config.get("group_id") or ""
                    for records in batch.values():
                        for r in records:
                            _mq.kafka_consumed(r.topic, group, r.headers, brokers)
                except Exception:
                    _mq.warn_once("kafka.poll", "swmp: tracing kafka-python records failed")
            return batch

        return poll

    def make_next(orig: Any) -> Any:
        def __next__(self: Any) -> Any:
            record = orig(self)
            try:
                group = self.config.get("group_id") or ""
                _mq.kafka_consumed(record.topic, group, record.headers, _brokers(self))
            except Exception:
                _mq.warn_once("kafka.next", "swmp: tracing a kafka-python record failed")
            return record

        return __next__

    patch(KafkaProducer, "send", make_send)
    patch(KafkaConsumer, "poll", make_poll)
    patch(KafkaConsumer, "__next__", make_next)


def _updates_offsets(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``poll(timeout_ms, max_records, update_offsets)``: False only from the iterator."""
    if "update_offsets" in kwargs:
        return bool(kwargs["update_offsets"])
    return bool(args[2]) if len(args) > 2 else True


def uninstall() -> None:
    from kafka import KafkaConsumer, KafkaProducer  # noqa: PLC0415

    restore(KafkaProducer, "send")
    restore(KafkaConsumer, "poll")
    restore(KafkaConsumer, "__next__")
