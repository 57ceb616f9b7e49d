"""The message-queue benchmark's broker warm-up (``benchmarks/_broker_warmup.py``) moves real
messages through the session's brokers: a warm-up that silently did nothing would leave the
benchmark measuring against a cold JVM again (docs/performance.md, "A warm broker")."""

from __future__ import annotations

from benchmarks import _broker_warmup
from tests.brokers import RabbitMQBroker
from tests.realpeers import KafkaBroker


def test_kafka_warmup_moves_messages(kafka_broker: KafkaBroker) -> None:
    assert _broker_warmup.warm_kafka(kafka_broker.bootstrap, 0.5) >= 100


def test_amqp_warmup_moves_messages(rabbitmq: RabbitMQBroker) -> None:
    assert _broker_warmup.warm_amqp(rabbitmq.url, 0.5) >= 100
