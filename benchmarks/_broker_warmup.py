"""Load a freshly started broker before the message-queue benchmarks measure against it.

Why: the Kafka broker is a JVM. Just started, its produce and fetch paths run interpreted
until the JIT has compiled them, and its compiler threads take CPU and cache from the
measured client. A client's per-message figures then move with the broker's age, not the
agent: ``mq_bench.py --pairs 3000 --only confluent-kafka`` against one broker gave +7.50 us
added per publish in its first run and +5.94, +5.52, +5.66 in the three runs after it
(plain round trip 55 -> 43 us), and the same client measured after kafka-python's rows in
one process had looked 2-3 us cheaper than alone for that reason (docs/performance.md,
"A warm broker"). A production broker has long been warm. RabbitMQ gets the same load:
its first connections and queues are set up before the timed ones.

The load is plain (no agent), in the benchmark's own shape: one message in flight at a
time (produce + flush, publish + get), read back, for ``seconds``.
"""

from __future__ import annotations

import time
import uuid

__all__ = ["warm_amqp", "warm_kafka"]

_PAYLOAD = b"w" * 100
_HEADERS = [("sw8", b"1-" + b"x" * 180)]  # the size of a real sw8: the header path warms too


def warm_kafka(bootstrap: str, seconds: float) -> int:
    """Produce and consume on a new topic for ``seconds``; the messages moved (0: no client)."""
    try:
        import confluent_kafka
    except ImportError:  # pragma: no cover - the benchmark's kafka clients are optional
        return 0
    topic = f"warm-{uuid.uuid4().hex[:8]}"
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    c = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    produced = moved = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for _ in range(100):
                p.produce(topic, _PAYLOAD, headers=_HEADERS)
                p.flush(10)
            produced += 100
            if not c.assignment():
                # The topic exists now (made by the first produce). Assigned, not subscribed:
                # a group join would take seconds of the warm-up.
                c.assign([confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)])
            while (m := c.poll(0.05)) is not None:
                moved += m.error() is None
        # The rest read back (the consumer's first fetch may come after a short warm-up).
        catch_up = time.monotonic() + 10
        while moved < produced and time.monotonic() < catch_up:
            m = c.poll(0.1)
            moved += m is not None and m.error() is None
    finally:
        c.close()
    return moved


def warm_amqp(url: str, seconds: float) -> int:
    """Publish and get on a new queue for ``seconds``; the messages moved (0: no client)."""
    try:
        import pika
    except ImportError:  # pragma: no cover
        return 0
    conn = pika.BlockingConnection(pika.URLParameters(url))
    moved = 0
    try:
        ch = conn.channel()
        q = f"warm-{uuid.uuid4().hex[:8]}"
        ch.queue_declare(q, auto_delete=True)
        props = pika.BasicProperties(headers={"sw8": "1-" + "x" * 180})
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _ in range(100):
                ch.basic_publish("", q, _PAYLOAD, props)
            for _ in range(100):
                method, _props, _body = ch.basic_get(q, auto_ack=True)
                moved += method is not None
    finally:
        conn.close()
    return moved
