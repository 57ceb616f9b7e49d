"""Kafka sender: topics, keys and values against a real Apache Kafka broker."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from typing import Any

import pytest

from reporter_proc.senders.base import SendError, UnsupportedError
from reporter_proc.senders.kafka_sender import KafkaSender, producer_kwargs, topic_names
from reporter_proc.settings import ReporterSettings
from tests import pbref
from tests.collector import free_port
from tests.realpeers import KafkaBroker
from tests.test_senders import FINISH, LOG, METER, SEGMENT, SNAPSHOT, run


def _settings(bootstrap: str, **over: Any) -> ReporterSettings:
    base = ReporterSettings(protocol="kafka", kafka_bootstrap_servers=(bootstrap,), send_timeout_s=20.0)
    return dataclasses.replace(base, **over)


async def _consume(bootstrap: str, topics: list[str], want: int) -> list[Any]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    got: list[Any] = []
    try:
        while len(got) < want:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                got.extend(records)
    finally:
        await consumer.stop()
    return got


@pytest.mark.e2e
def test_records_reach_topics_with_keys(kafka_broker: KafkaBroker) -> None:
    # kafka_broker: the session fixture of tests/realpeers.py (a real broker on loopback)
    bootstrap = kafka_broker.bootstrap
    from reporter_proc.protocol.generated import (
        logging_pb2,
        management_pb2,
        meter_pb2,
        tracing_pb2,
    )

    namespace = f"swmp{uuid.uuid4().hex[:8]}"
    settings = _settings(bootstrap, kafka_namespace=namespace, kafka_extra={"linger.ms": "5", "acks": "all"})
    sender = KafkaSender(settings)
    topics = sender.topics
    assert topics == {
        "segment": f"{namespace}-skywalking-segments",
        "log": f"{namespace}-skywalking-logs",
        "meter": f"{namespace}-skywalking-meters",
        "management": f"{namespace}-skywalking-managements",
    }
    seg2 = [SEGMENT[0], "seg-2", *SEGMENT[2:]]
    untraced_log = [*LOG[:6], "", "", -1, [], ""]

    async def body() -> list[Any]:
        await sender.start()
        try:
            await sender.send_segments([SEGMENT, seg2])
            await sender.send_logs([LOG, untraced_log])
            await sender.send_meters([METER])
            await sender.report_properties("svc", "svc-0@host", [("language", "python")])
            await sender.keep_alive("svc", "svc-0@host")
            for call in (sender.send_snapshots([SNAPSHOT]), sender.report_finish(FINISH)):
                with pytest.raises(UnsupportedError):
                    await call
        finally:
            await sender.close()
        return await _consume(bootstrap, list(topics.values()), 7)

    got = run(body(), timeout=120)
    by_topic: dict[str, list[Any]] = {}
    for rec in got:
        by_topic.setdefault(rec.topic, []).append(rec)

    segs = by_topic[topics["segment"]]
    assert [r.key for r in segs] == [b"seg-1", b"seg-2"]
    assert [tracing_pb2.SegmentObject.FromString(r.value) for r in segs] == [
        pbref.segment(SEGMENT),
        pbref.segment(seg2),
    ]
    logs = by_topic[topics["log"]]
    assert [r.key for r in logs] == [b"seg-1", None]
    decoded_logs = [logging_pb2.LogData.FromString(r.value) for r in logs]
    assert decoded_logs == [pbref.log(LOG), pbref.log(untraced_log)]
    meters = by_topic[topics["meter"]]
    assert [r.key for r in meters] == [b"svc-0@host"]  # one collection per report period
    assert meter_pb2.MeterDataCollection.FromString(meters[0].value) == pbref.meter_collection(METER)
    mgmt = by_topic[topics["management"]]
    assert [r.key for r in mgmt] == [b"register-svc-0@host", b"svc-0@host"]
    assert management_pb2.InstanceProperties.FromString(mgmt[0].value) == pbref.instance_properties(
        "svc", "svc-0@host", [("language", "python")]
    )
    ping = management_pb2.InstancePingPkg.FromString(mgmt[1].value)
    assert ping == pbref.instance_ping("svc", "svc-0@host")


def test_broker_down_is_retryable_not_fatal_at_start() -> None:
    sender = KafkaSender(_settings(f"127.0.0.1:{free_port()}", send_timeout_s=1.0))

    async def body() -> None:
        await sender.start()  # logs, does not raise: the broker may come up later
        try:
            with pytest.raises(SendError):
                await sender.send_segments([SEGMENT])
        finally:
            await sender.close()

    run(body())


def test_topics_without_namespace_and_producer_settings() -> None:
    settings = ReporterSettings(
        kafka_extra={
            "ACKS": "all",
            "linger.ms": "20",
            "max-request-size": "2097152",
            "enable_idempotence": "false",
            "no_such_option": "1",
            "bootstrap_servers": "10.0.0.1:9092",
        }
    )
    assert topic_names(settings)["segment"] == "skywalking-segments"
    assert topic_names(settings)["management"] == "skywalking-managements"
    assert producer_kwargs(settings) == {
        "acks": "all",
        "linger_ms": 20,
        "max_request_size": 2097152,
        "enable_idempotence": False,
    }


def test_rejected_producer_settings_fall_back_to_defaults() -> None:
    sender = KafkaSender(ReporterSettings(kafka_extra={"acks": "2", "linger_ms": "5"}))

    async def body() -> None:
        producer = sender._new_producer()  # "acks=2" is refused by aiokafka: logged, then defaults
        assert sender._kwargs == {}
        await producer.stop()

    asyncio.run(body())


def test_missing_codec_falls_back_to_uncompressed(monkeypatch: pytest.MonkeyPatch) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.record.default_records import DefaultRecordBatch

    # Make the codec look absent, whatever this machine has installed.
    codecs = dict(AIOKafkaProducer._COMPRESSORS)
    codecs["zstd"] = (lambda: False, DefaultRecordBatch.CODEC_ZSTD)
    monkeypatch.setattr(AIOKafkaProducer, "_COMPRESSORS", codecs)
    sender = KafkaSender(ReporterSettings(kafka_compression="zstd"))

    async def body() -> None:
        producer = sender._new_producer()  # logs the missing codec once
        assert sender._compression is None
        await producer.stop()

    asyncio.run(body())


@pytest.mark.parametrize("codec", ["none", "None", " NONE ", ""])
def test_compression_none_is_no_codec_without_an_error(codec: str, caplog: pytest.LogCaptureFixture) -> None:
    """Kafka's own spelling of "no compression" makes a producer without a codec at the
    first attempt: no refusal logged, no fallback taken."""
    sender = KafkaSender(ReporterSettings(kafka_compression=codec))

    async def body() -> None:
        with caplog.at_level(logging.WARNING, logger="swmp.reporter.kafka"):
            producer = sender._new_producer()
        assert producer._compression_type is None
        assert sender._compression is None
        await producer.stop()

    asyncio.run(body())
    assert not [r.getMessage() for r in caplog.records], caplog.text


@pytest.mark.parametrize(
    ("env", "kw"),
    [
        ({"SW_KAFKA_REPORTER_CONFIG_compression.type": "gzip"}, None),
        ({"SW_KAFKA_REPORTER_CONFIG_COMPRESSION-TYPE": "GZIP"}, None),
        ({}, {"COMPRESSION_TYPE": "gzip", "Linger.MS": "5"}),
        ({}, {"compression.type": " Gzip "}),
    ],
)
def test_compression_type_is_found_in_any_spelling(
    env: dict[str, str], kw: dict[str, str] | None, caplog: pytest.LogCaptureFixture
) -> None:
    """The config splits compression_type out with the sender's key normalisation: it turns
    compression on instead of landing among the extra options (refused with a warning)."""
    from swmp import config

    cfg = config.load(env, **({"kafka_reporter_config": kw} if kw is not None else {}))
    settings = dataclasses.replace(cfg.to_reporter_settings(), protocol="kafka")
    assert settings.kafka_compression == "gzip"
    with caplog.at_level(logging.WARNING, logger="swmp.reporter.kafka"):
        sender = KafkaSender(settings)

        async def body() -> None:
            producer = sender._new_producer()
            assert sender._compression == "gzip"
            await producer.stop()

        asyncio.run(body())
    assert not [r.getMessage() for r in caplog.records], caplog.text
    assert sender._kwargs == ({"linger_ms": 5} if kw and "Linger.MS" in kw else {})
