"""Kafka transport (``aiokafka``): the OAP's Kafka fetcher reads the same protobuf messages.

Topics and keys are the ones the OAP expects (protocol notes): segments keyed by segment id,
``register-<instance>`` for instance properties, ``<instance>`` for pings and meters (one
``MeterDataCollection`` per report period), logs by their segment id (none when the log has
no trace). With a namespace every topic is ``<namespace>-<topic>``. There is no profiling
over Kafka.

The producer is created in :meth:`KafkaSender.start`. A broker that is down at start-up is
not an error: the producer is (re)started lazily by the next send, which raises
:class:`SendError` until the broker answers, so the loop retries as for any outage.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors

from reporter_proc import encode
from reporter_proc.records import LOG_SEGMENT_ID, METER_INSTANCE, SEG_SEGMENT_ID
from reporter_proc.senders._common import encode_all, first_line
from reporter_proc.senders.base import FatalSendError, Record, Sender, SendError, TooLargeError
from reporter_proc.settings import ReporterSettings

log = logging.getLogger("swmp.reporter.kafka")


# Kafka errors that a retry cannot fix.
_FATAL = (kafka_errors.MessageSizeTooLargeError, kafka_errors.TopicAuthorizationFailedError,
          kafka_errors.ClusterAuthorizationFailedError, kafka_errors.InvalidTopicError,
          kafka_errors.UnsupportedVersionError)

# Producer arguments the sender owns; SW_KAFKA_REPORTER_CONFIG_* cannot override them.
_RESERVED = frozenset({"self", "loop", "bootstrap_servers", "key_serializer", "value_serializer",
                       "compression_type"})


def _convert(value: str) -> Any:
    """Environment strings to the types AIOKafkaProducer expects ("1" -> 1, "true" -> True)."""
    low = value.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def producer_kwargs(settings: ReporterSettings) -> dict[str, Any]:
    """AIOKafkaProducer keyword arguments from settings.kafka_extra (SW_KAFKA_REPORTER_CONFIG_*).

    Keys are matched case-insensitively, with Java-style dots or dashes read as underscores
    (``linger.ms`` -> ``linger_ms``); unknown keys are logged and ignored rather than
    crashing the reporter.
    """
    accepted = set(inspect.signature(AIOKafkaProducer.__init__).parameters) - _RESERVED
    out: dict[str, Any] = {}
    for raw_key, raw_value in settings.kafka_extra.items():
        key = raw_key.strip().lower().replace(".", "_").replace("-", "_")
        if key in accepted:
            out[key] = _convert(raw_value) if isinstance(raw_value, str) else raw_value
        else:
            log.warning("ignoring Kafka producer setting %r: AIOKafkaProducer has no %r", raw_key, key)
    return out


def topic_names(settings: ReporterSettings) -> dict[str, str]:
    """kind -> topic, with the ``<namespace>-`` prefix when a namespace is set."""
    # SW_KAFKA_NAMESPACE only: the agent namespace (SW_AGENT_NAMESPACE) names services, not topics.
    namespace = settings.kafka_namespace
    prefix = f"{namespace}-" if namespace else ""
    return {"segment": prefix + settings.kafka_topic_segment, "log": prefix + settings.kafka_topic_log,
            "meter": prefix + settings.kafka_topic_meter,
            "management": prefix + settings.kafka_topic_management}


class KafkaSender(Sender):
    name = "kafka"
    supports = frozenset({"segment", "log", "meter", "management"})

    def __init__(self, settings: ReporterSettings) -> None:
        servers = [s.strip() for s in settings.kafka_bootstrap_servers if s.strip()]
        if not servers:
            raise ValueError("no Kafka bootstrap server configured")
        self._servers = servers
        self.address = ",".join(servers)
        self.topics = topic_names(settings)
        self._timeout = settings.send_timeout_s
        self._kwargs = producer_kwargs(settings)
        self._compression = settings.kafka_compression or None
        self._producer: AIOKafkaProducer | None = None
        self._starting: asyncio.Lock | None = None

    def _new_producer(self) -> AIOKafkaProducer:
        # A configuration the producer rejects (a codec whose library is missing, a bad
        # "acks") must not stop the reporter: fall back step by step, and say so once.
        attempts = [(self._compression, self._kwargs)]
        if self._compression:
            attempts.append((None, self._kwargs))
        if self._kwargs:
            attempts.append((None, {}))
        last: Exception | None = None
        for compression, extra in attempts:
            kwargs = {"request_timeout_ms": max(1000, int(self._timeout * 1000)), **extra}
            try:
                producer = AIOKafkaProducer(bootstrap_servers=self._servers, compression_type=compression,
                                            **kwargs)
            except Exception as exc:
                log.error("Kafka producer rejected compression=%r settings=%r: %s", compression, extra, exc)
                last = exc
                continue
            self._compression, self._kwargs = compression, extra
            # The agent's aiokafka instrumentation leaves producers with this mark alone:
            # in thread mode this producer runs inside the traced application.
            producer._swmp_internal = True
            return producer
        raise SendError(f"cannot create a Kafka producer: {last}")

    async def start(self) -> None:
        self._starting = asyncio.Lock()
        try:
            await self._ensure_producer()
        except SendError as exc:
            log.warning("Kafka not reachable yet (%s); will retry on the next send", exc)

    async def _ensure_producer(self) -> AIOKafkaProducer:
        if self._producer is not None:
            return self._producer
        if self._starting is None:
            raise SendError("Kafka sender not started")
        async with self._starting:
            if self._producer is None:
                producer = self._new_producer()
                try:
                    await asyncio.wait_for(producer.start(), self._timeout)
                except asyncio.CancelledError:
                    await _stop_quietly(producer)
                    raise
                except Exception as exc:
                    await _stop_quietly(producer)
                    raise SendError(f"Kafka {self.address}: {type(exc).__name__} {first_line(exc)}") from exc
                self._producer = producer
        return self._producer

    async def _produce(self, topic: str, items: Sequence[tuple[bytes | None, bytes]]) -> None:
        if not items:
            return
        producer = await self._ensure_producer()
        try:
            # send() only queues (batched by the producer); the futures resolve on the broker's ack.
            futures = [await producer.send(topic, value, key=key) for key, value in items]
            await asyncio.wait_for(asyncio.gather(*futures), self._timeout)
        except asyncio.CancelledError:
            raise
        except kafka_errors.MessageSizeTooLargeError as exc:
            raise TooLargeError(f"Kafka topic {topic}: {type(exc).__name__} {first_line(exc)}") from exc
        except _FATAL as exc:
            raise FatalSendError(f"Kafka topic {topic}: {type(exc).__name__} {first_line(exc)}") from exc
        except (kafka_errors.KafkaError, asyncio.TimeoutError, OSError) as exc:
            raise SendError(f"Kafka topic {topic}: {type(exc).__name__} {first_line(exc)}") from exc

    async def send_segments(self, records: list[Record]) -> None:
        values = encode_all(encode.segment, records)
        keys = [_key(rec[SEG_SEGMENT_ID]) for rec in records]
        await self._produce(self.topics["segment"], list(zip(keys, values, strict=True)))

    async def send_logs(self, records: list[Record]) -> None:
        values = encode_all(encode.log, records)
        keys = [_key(rec[LOG_SEGMENT_ID]) for rec in records]
        await self._produce(self.topics["log"], list(zip(keys, values, strict=True)))

    async def send_meters(self, records: list[Record]) -> None:
        values = encode_all(encode.meter_collection, records)
        keys = [_key(rec[METER_INSTANCE]) for rec in records]
        await self._produce(self.topics["meter"], list(zip(keys, values, strict=True)))

    async def report_properties(self, service: str, instance: str, properties: list[tuple[str, str]],
                                layer: str = "") -> None:
        value = encode.instance_properties(service, instance, properties, layer)
        await self._produce(self.topics["management"], [(f"register-{instance}".encode(), value)])

    async def keep_alive(self, service: str, instance: str, layer: str = "") -> None:
        value = encode.instance_ping(service, instance, layer)
        await self._produce(self.topics["management"], [(_key(instance), value)])

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()  # flushes what is still queued


def _key(value: object) -> bytes | None:
    return value.encode() if isinstance(value, str) and value else None


async def _stop_quietly(producer: AIOKafkaProducer) -> None:
    try:
        await producer.stop()
    except Exception as exc:
        log.debug("stopping a producer that never started: %r", exc)
