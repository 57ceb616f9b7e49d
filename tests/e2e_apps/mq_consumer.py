"""A consumer process for the message-queue end-to-end tests (run under ``swmp run``).

    python -m tests.e2e_apps.mq_consumer kafka BOOTSTRAP TOPIC GROUP COUNT
    python -m tests.e2e_apps.mq_consumer rabbitmq URL QUEUE COUNT

Reads COUNT messages (kafka-python iteration; pika ``basic_consume`` callback), prints
``consumed COUNT`` and exits; the agent flushes its segments at exit.
"""

from __future__ import annotations

import sys
from typing import Any


def kafka(bootstrap: str, topic: str, group: str, count: int) -> int:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=60_000,
    )
    n = 0
    try:
        for _record in consumer:
            n += 1
            if n == count:
                break
    finally:
        consumer.close()
    return n


def rabbitmq(url: str, queue: str, count: int) -> int:
    import pika

    got = 0
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()

        def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
            nonlocal got
            got += 1
            channel.basic_ack(method.delivery_tag)
            if got == count:
                channel.stop_consuming()

        ch.basic_consume(queue, on_message)
        conn.call_later(60, ch.stop_consuming)  # never hang a test run
        ch.start_consuming()
    finally:
        conn.close()
    return got


def main(argv: list[str]) -> int:
    kind = argv[0]
    n = (
        kafka(argv[1], argv[2], argv[3], int(argv[4]))
        if kind == "kafka"
        else rabbitmq(argv[1], argv[2], int(argv[3]))
    )
    print(f"consumed {n}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
