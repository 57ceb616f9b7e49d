"""Cost of the message-queue instrumentation per message, on the real clients and brokers.

For each client (kafka-python, confluent-kafka, confluent-kafka's asyncio ``AIOProducer`` /
``AIOConsumer`` as ``confluent-aio``, aiokafka, pika with a blocking connection, aio-pika over
aiormq) two operations are timed, instrumented and not, in one run:

* ``publish``: N sends, each inside its own entry span (the application's request), so the
  instrumented run adds the exit span, the ``sw8`` headers and the larger segment. Only the
  send calls are timed; delivery (flush, confirms) is waited for untimed afterwards.
  ``confluent-aio`` times the ``produce`` calls and the ``flush`` that hands the buffered
  batch to librdkafka (where the instrumented run produces its traced messages one by one).
* ``consume``: reading N messages that carry ``sw8`` headers (Kafka: seek back to the
  start of a topic and poll; RabbitMQ: a ``basic_consume`` callback over a prefilled
  queue). The instrumented run adds one entry span and segment per message.

Times are the process's CPU time (all its threads, the clients' I/O threads too; the
brokers' CPU is not included), not wall-clock time: other work on a shared machine does not
count. Finished segments go into a real shared-memory ring (an ipc Arena in a temp dir, drained
between rounds, untimed), as in the agent. Rounds alternate plain / instrumented so that
drift hits both alike; the table shows the median per-message time of each and the median
of the per-round differences ("added"). The brokers are the ones of the tests: a Kafka
broker (``tests/realpeers.py``) and RabbitMQ (``tests/brokers.py``), started here unless
given, and loaded for 30 s (``--broker-warmup``) before anything is measured: a just-started
JVM broker makes every client's figures larger (``benchmarks/_broker_warmup.py``).

Per call (``--pairs N``, instead of the rounds; ``--steps``): ``benchmarks/mq_percall.py``, which
says what is compared and with which clocks.

    python benchmarks/mq_bench.py [--rounds N] [--messages N] [--kafka HOST:PORT]
                                  [--amqp URL] [--broker-warmup S] [--only CLIENT|in-process]
                                  [--json PATH] [--pairs N [--warmup N] [--steps]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import inspect
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _broker_warmup
from benchmarks._ring import Ring, ring_size_for
from swmp import instrument, tracing
from swmp.config import load
from swmp.tracing.context import new_entry_span

PAYLOAD = b"x" * 100
WARM_S = 30.0  # seconds of plain load on a broker started here before measuring (_broker_warmup)
MODULES = {
    "kafka-python": "swmp.instrument.kafka",
    "confluent-kafka": "swmp.instrument.confluent_kafka",
    "confluent-aio": "swmp.instrument.confluent_kafka",
    "aiokafka": "swmp.instrument.aiokafka",
    "pika": "swmp.instrument.pika",
    "aio-pika": "swmp.instrument.aiormq",
}


def set_instrumented(client: str, on: bool, config: Any) -> None:
    import importlib

    mod = importlib.import_module(MODULES[client])
    if on:
        instrument.install_one(MODULES[client], config)
    else:
        mod.uninstall()


def timed(fn: Callable[[], None]) -> float:
    t0 = time.process_time_ns()
    fn()
    return float(time.process_time_ns() - t0)


# -- one harness per client: publish(n) and consume(n) closures, built per mode -------------------
class Kafka:
    """kafka-python."""

    def __init__(self, bootstrap: str, n: int) -> None:
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition

        self.n = n
        self.topic_pub = f"bench-{uuid.uuid4().hex[:8]}"
        self.topic_con = f"bench-{uuid.uuid4().hex[:8]}"
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, fetch_max_wait_ms=10
        )
        self.tp = TopicPartition(self.topic_con, 0)

    def prefill(self) -> None:  # runs instrumented: the messages carry sw8
        for _ in range(self.n):
            with new_entry_span("/prefill"):
                self.producer.send(self.topic_con, PAYLOAD)
        self.producer.flush()
        self.consumer.assign([self.tp])

    def publish(self) -> float:
        send, topic = self.producer.send, self.topic_pub

        def run() -> None:
            for _ in range(self.n):
                with new_entry_span("/publish"):
                    send(topic, PAYLOAD)

        t = timed(run)
        self.producer.flush()
        return t

    def consume(self) -> float:
        self.consumer.seek(self.tp, 0)

        def run() -> None:
            got = 0
            while got < self.n:
                for records in self.consumer.poll(timeout_ms=1000, max_records=500).values():
                    got += len(records)

        return timed(run)

    def close(self) -> None:
        self.producer.close(timeout=10)
        self.consumer.close()


class Confluent:
    """confluent-kafka. Its classes are swapped at install, so each mode has its own objects."""

    def __init__(self, bootstrap: str, n: int) -> None:
        self.n = n
        self.bootstrap = bootstrap
        self.topic_pub = f"bench-{uuid.uuid4().hex[:8]}"
        self.topic_con = f"bench-{uuid.uuid4().hex[:8]}"
        self.objects: dict[bool, tuple[Any, Any]] = {}

    def make(self, instrumented: bool) -> None:
        import confluent_kafka

        p = confluent_kafka.Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        c = confluent_kafka.Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": uuid.uuid4().hex,
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        self.objects[instrumented] = (p, c)

    def prefill(self) -> None:
        p = self.objects[True][0]
        for _ in range(self.n):
            with new_entry_span("/prefill"):
                p.produce(self.topic_con, PAYLOAD)
        p.flush(30)

    def publish(self, instrumented: bool) -> float:
        p = self.objects[instrumented][0]
        produce, topic = p.produce, self.topic_pub

        def run() -> None:
            for _ in range(self.n):
                with new_entry_span("/publish"):
                    produce(topic, PAYLOAD)

        t = timed(run)
        p.flush(30)
        return t

    def consume(self, instrumented: bool) -> float:
        from confluent_kafka import TopicPartition

        c = self.objects[instrumented][1]
        c.assign([TopicPartition(self.topic_con, 0, 0)])

        def run() -> None:
            got = 0
            while got < self.n:
                got += sum(1 for m in c.consume(min(500, self.n - got), 1.0) if m.error() is None)

        return timed(run)

    def close(self) -> None:
        for p, c in self.objects.values():
            p.flush(10)
            c.close()


class ConfluentAio:
    """confluent-kafka's asyncio clients; like ``Confluent``, one pair of objects per mode."""

    def __init__(self, bootstrap: str, n: int) -> None:
        self.n = n
        self.bootstrap = bootstrap
        self.loop = asyncio.new_event_loop()
        self.topic_pub = f"bench-{uuid.uuid4().hex[:8]}"
        self.topic_con = f"bench-{uuid.uuid4().hex[:8]}"
        self.objects: dict[bool, tuple[Any, Any]] = {}

    def make(self, instrumented: bool) -> None:
        from confluent_kafka.aio import AIOConsumer, AIOProducer

        async def make() -> tuple[Any, Any]:
            p = AIOProducer({"bootstrap.servers": self.bootstrap, "linger.ms": 5}, buffer_timeout=0)
            conf = {
                "bootstrap.servers": self.bootstrap,
                "group.id": uuid.uuid4().hex,
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
            return p, AIOConsumer(conf)

        self.objects[instrumented] = self.loop.run_until_complete(make())

    def prefill(self) -> None:
        p = self.objects[True][0]

        async def fill() -> None:
            for _ in range(self.n):
                with new_entry_span("/prefill"):
                    await p.produce(self.topic_con, PAYLOAD)
            await p.flush(30)

        self.loop.run_until_complete(fill())

    def publish(self, instrumented: bool) -> float:
        p = self.objects[instrumented][0]
        produce, topic = p.produce, self.topic_pub

        async def run() -> None:
            for _ in range(self.n):
                with new_entry_span("/publish"):
                    await produce(topic, PAYLOAD)
            await p.flush(0)  # the hand-over of the buffer, not the delivery

        t = timed(lambda: self.loop.run_until_complete(run()))
        self.loop.run_until_complete(p.flush(30))
        return t

    def consume(self, instrumented: bool) -> float:
        from confluent_kafka import TopicPartition

        c = self.objects[instrumented][1]
        self.loop.run_until_complete(c.assign([TopicPartition(self.topic_con, 0, 0)]))

        async def run() -> None:
            got = 0
            while got < self.n:
                msgs = await c.consume(min(500, self.n - got), 1.0)
                got += sum(1 for m in msgs if m.error() is None)

        return timed(lambda: self.loop.run_until_complete(run()))

    def close(self) -> None:
        async def stop() -> None:
            for p, c in self.objects.values():
                await p.close()
                await c.close()

        self.loop.run_until_complete(stop())
        self.loop.close()


class AioKafka:
    def __init__(self, bootstrap: str, n: int) -> None:
        self.n = n
        self.bootstrap = bootstrap
        self.loop = asyncio.new_event_loop()
        self.topic_pub = f"bench-{uuid.uuid4().hex[:8]}"
        self.topic_con = f"bench-{uuid.uuid4().hex[:8]}"

        async def start() -> tuple[Any, Any]:
            from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

            p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
            c = AIOKafkaConsumer(
                bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, fetch_max_wait_ms=10
            )
            await p.start()
            await c.start()
            return p, c

        self.producer, self.consumer = self.loop.run_until_complete(start())

    def prefill(self) -> None:
        from aiokafka import TopicPartition

        async def fill() -> None:
            futs = []
            for _ in range(self.n):
                with new_entry_span("/prefill"):
                    futs.append(await self.producer.send(self.topic_con, PAYLOAD))
            await asyncio.gather(*futs)

        async def assign() -> None:
            self.consumer.assign([self.tp])

        self.loop.run_until_complete(fill())
        self.tp = TopicPartition(self.topic_con, 0)
        self.loop.run_until_complete(assign())

    def publish(self) -> float:
        futs: list[Any] = []

        async def run() -> None:
            send, topic = self.producer.send, self.topic_pub
            for _ in range(self.n):
                with new_entry_span("/publish"):
                    futs.append(await send(topic, PAYLOAD))

        t = timed(lambda: self.loop.run_until_complete(run()))
        self.loop.run_until_complete(asyncio.gather(*futs))
        return t

    def consume(self) -> float:
        async def run() -> None:
            self.consumer.seek(self.tp, 0)
            got = 0
            while got < self.n:
                batch = await self.consumer.getmany(timeout_ms=1000, max_records=500)
                got += sum(len(r) for r in batch.values())

        return timed(lambda: self.loop.run_until_complete(run()))

    def close(self) -> None:
        async def stop() -> None:
            await self.producer.stop()
            await self.consumer.stop()

        self.loop.run_until_complete(stop())
        self.loop.close()


class Pika:
    """pika, BlockingConnection."""

    def __init__(self, url: str, n: int) -> None:
        import pika

        self.n = n
        self.conn = pika.BlockingConnection(pika.URLParameters(url))
        self.ch = self.conn.channel()
        self.q_pub = f"bench-{uuid.uuid4().hex[:8]}"
        self.q_con = f"bench-{uuid.uuid4().hex[:8]}"
        self.ch.queue_declare(self.q_pub)
        self.ch.queue_declare(self.q_con)
        self.ch.basic_qos(prefetch_count=1000)

    def prefill(self) -> None:
        pass  # each consume round publishes its own messages (instrumented, untimed)

    def publish(self) -> float:
        publish, q = self.ch.basic_publish, self.q_pub

        def run() -> None:
            for _ in range(self.n):
                with new_entry_span("/publish"):
                    publish("", q, PAYLOAD)

        t = timed(run)
        self.ch.queue_purge(q)
        return t

    def fill_for_consume(self) -> None:
        for _ in range(self.n):
            with new_entry_span("/prefill"):
                self.ch.basic_publish("", self.q_con, PAYLOAD)

    def consume(self) -> float:
        got = 0

        def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
            nonlocal got
            got += 1
            if got == self.n:
                ch.stop_consuming()

        def run() -> None:
            tag = self.ch.basic_consume(self.q_con, on_message, auto_ack=True)
            self.ch.start_consuming()
            self.ch.basic_cancel(tag)

        return timed(run)

    def close(self) -> None:
        self.ch.queue_delete(self.q_pub)
        self.ch.queue_delete(self.q_con)
        self.conn.close()


class AioPika:
    """aio-pika (publishes and consumes through aiormq), publisher confirms off."""

    def __init__(self, url: str, n: int) -> None:
        import aio_pika

        self.n = n
        self.loop = asyncio.new_event_loop()
        self.q_pub = f"bench-{uuid.uuid4().hex[:8]}"
        self.q_con = f"bench-{uuid.uuid4().hex[:8]}"

        async def start() -> None:
            self.conn = await aio_pika.connect(url)
            self.ch = await self.conn.channel(publisher_confirms=False)
            await self.ch.set_qos(prefetch_count=1000)
            self.pub_queue = await self.ch.declare_queue(self.q_pub)
            self.con_queue = await self.ch.declare_queue(self.q_con)

        self.loop.run_until_complete(start())

    def prefill(self) -> None:
        pass

    def publish(self) -> float:
        import aio_pika

        async def run() -> None:
            publish = self.ch.default_exchange.publish
            for _ in range(self.n):
                with new_entry_span("/publish"):
                    await publish(aio_pika.Message(PAYLOAD), routing_key=self.q_pub)

        t = timed(lambda: self.loop.run_until_complete(run()))
        self.loop.run_until_complete(self.pub_queue.purge())
        return t

    def fill_for_consume(self) -> None:
        import aio_pika

        async def fill() -> None:
            for _ in range(self.n):
                with new_entry_span("/prefill"):
                    await self.ch.default_exchange.publish(aio_pika.Message(PAYLOAD), routing_key=self.q_con)

        self.loop.run_until_complete(fill())

    def consume(self) -> float:
        async def run() -> None:
            done = asyncio.get_running_loop().create_future()
            got = 0

            async def on_message(message: Any) -> None:
                nonlocal got
                got += 1
                if got == self.n and not done.done():
                    done.set_result(None)

            tag = await self.con_queue.consume(on_message, no_ack=True)
            await done
            await self.con_queue.cancel(tag)

        return timed(lambda: self.loop.run_until_complete(run()))

    def close(self) -> None:
        async def stop() -> None:
            await self.pub_queue.delete()
            await self.con_queue.delete()
            await self.conn.close()

        self.loop.run_until_complete(stop())
        self.loop.close()


# -- the instrumentation's own work, without a client or a network ---------------------------------
def in_process_cases() -> dict[str, tuple[Callable[[], None], Callable[[], None]]]:
    """The wrappers' own work per message, as ``(base, traced)`` functions (one call = one
    message; ``benchmarks/mq_cachegrind.py`` counts their instructions):

    * ``producer``: inside an entry span, what the Kafka instrumentations call for a send
      (``_mq.kafka_send_span``: the MQ exit span with its tags and the ``sw8`` header list)
      and the larger segment, against the entry span alone;
    * ``producer-amqp``: the same for a RabbitMQ publish through aiormq (``_mq.amqp_send_span``
      with the copy of the caller's pamqp properties and the new headers table);
    * ``consumer``: one Kafka record's entry span, from decoding its ``sw8`` header to the
      segment written into the ring (``_mq.kafka_consumed``), against nothing;
    * ``consumer-no-sw8``: the same for a record without ``sw8`` (a new trace);
    * ``consumer-callback``: a RabbitMQ message's entry span current around its callback
      (``_mq.amqp_consuming``, its AMQP headers table carrying ``sw8``), against the callback;
    * ``consumer-pika``: the same through the callback the pika instrumentation makes of a
      BlockingChannel consumer's (the message's facts read from pika's objects first);
    * ``consumer-aiormq``: a delivery as aiormq runs it (``awaitable()`` of the registered
      callback called with a ``DeliveredMessage`` of pamqp's frames, the result run as a task
      on a running loop) through the callback the aiormq instrumentation registers, against
      the callback alone;
    * ``producer-aiormq``: inside an entry span, an aiormq ``basic_publish`` through the
      instrumentation's wrapper (the span, the properties' copy with the headers, the call),
      the channel's own method doing nothing, against the entry span and that method alone;
    * ``producer-aiokafka``: the same for an aiokafka ``AIOKafkaProducer.send`` through the
      instrumentation's wrapper (the span, the brokers string, the headers, the call).
    """
    from swmp.instrument import _mq
    from swmp.tracing.constants import Component

    broker, topic, group = "127.0.0.1:9092", "orders", "g"

    def entry_only() -> None:
        with new_entry_span("/publish"):
            pass

    def entry_and_exit() -> None:
        with new_entry_span("/publish"):
            span, _headers = _mq.kafka_send_span(topic, broker, None)
            assert span is not None
            with span:
                pass

    # aiormq's attach: a copy of the caller's pamqp properties with the new headers table
    # (the copy lived in _mq before 2026-11-27 and in _props_copy after it).
    try:
        from pamqp.commands import Basic
    except ImportError:  # pragma: no cover - aio-pika not installed
        Basic = None
    copy_props: Any = (
        getattr(_mq, "shallow_copy", None)
        or importlib.import_module("swmp.instrument._props_copy").shallow_copy
    )
    props = Basic.Properties(delivery_mode=2, content_type="application/json") if Basic else None

    def py_with_headers(span: Any, properties: Any) -> Any:
        new = copy_props(properties)
        new.headers = _mq.amqp_headers(span, new.headers)
        return new

    # Since 2026-11-28 the instrumentations' attach step (native with the native core).
    attach_step = getattr(importlib.import_module("swmp.instrument._props_copy"), "attach_step", None)
    with_headers: Any = py_with_headers
    if attach_step is not None and Basic is not None:
        with_headers = attach_step(functools.partial(Basic.Properties, delivery_mode=1))

    def entry_and_amqp_exit() -> None:
        with new_entry_span("/publish"):
            span, _props = _mq.amqp_send_span("", topic, broker, with_headers, props)
            assert span is not None
            with span:
                pass

    with new_entry_span("/publish"):
        span = _mq.exit_span(f"Kafka/{topic}/Producer", broker, Component.KAFKA_PRODUCER)
        assert span is not None
        headers = _mq.kafka_headers(span, None)
        span.finish()
    plain_headers = [("trace", b"no")]
    amqp = {k: v.decode() for k, v in headers}
    # amqp_consuming took a lookup function before it took the headers table (2026-11-26):
    # kept so that the benchmark compares both versions.
    # (since 2026-11-27 amqp_consuming is native, its Python form _py_amqp_consuming)
    python_form = getattr(_mq, "_py_amqp_consuming", _mq.amqp_consuming)
    table: Any = amqp if "headers" in inspect.signature(python_form).parameters else amqp.get

    def consumed() -> None:
        _mq.kafka_consumed(topic, group, headers, broker)

    def consumed_no_sw8() -> None:
        _mq.kafka_consumed(topic, group, plain_headers, broker)

    def callback() -> None:
        pass

    def consuming() -> None:
        with _mq.amqp_consuming("", "orders", table, broker):
            callback()

    def nothing() -> None:
        pass

    cases = {
        "producer": (entry_only, entry_and_exit),
        "producer-amqp": (entry_only, entry_and_amqp_exit),
        "consumer": (nothing, consumed),
        "consumer-no-sw8": (nothing, consumed_no_sw8),
        "consumer-callback": (callback, consuming),
    }
    pika_pair = _pika_callback_case(amqp)
    if pika_pair is not None:
        cases["consumer-pika"] = pika_pair
    aiormq_pair = _aiormq_callback_case(amqp)
    if aiormq_pair is not None:
        cases["consumer-aiormq"] = aiormq_pair
    publish_pair = _aiormq_publish_case(with_headers, props)
    if publish_pair is not None:
        cases["producer-aiormq"] = publish_pair
    cases["producer-aiokafka"] = _aiokafka_send_case()
    return cases


def _aiokafka_send_case() -> tuple[Callable[[], None], Callable[[], None]]:
    """One send through the aiokafka instrumentation's wrapper, awaited inside an entry span
    on a running loop, against the producer's method alone in the same span."""
    from swmp.instrument import _mq
    from swmp.instrument import aiokafka as instr

    class Producer:
        client = types.SimpleNamespace(_bootstrap_servers="127.0.0.1:9092")

        async def send(  # noqa: PLR0917 (aiokafka's signature)
            self,
            topic: Any,
            value: Any = None,
            key: Any = None,
            partition: Any = None,
            timestamp_ms: Any = None,
            headers: Any = None,
        ) -> None:
            pass

    def inline(orig: Any) -> Any:
        # Before 2026-11-30 the wrapper was made inside install(), as this (a Python coroutine).
        async def send(  # noqa: PLR0917
            self: Any,
            topic: Any,
            value: Any = None,
            key: Any = None,
            partition: Any = None,
            timestamp_ms: Any = None,
            headers: Any = None,
        ) -> Any:
            if getattr(self, instr.INTERNAL_MARK, False):
                return await orig(self, topic, value, key, partition, timestamp_ms, headers)
            span, traced = _mq.kafka_send_span(topic, instr._brokers(self.client), headers)
            if span is None:
                return await orig(self, topic, value, key, partition, timestamp_ms, headers)
            with span:
                return await orig(self, topic, value, key, partition, timestamp_ms, traced)

        return send

    make: Any = getattr(instr, "traced_send", inline)
    producer, orig = Producer(), Producer.send
    wrapped = make(orig)
    loop = asyncio.new_event_loop()

    async def send(fn: Any) -> None:
        with new_entry_span("/publish"):
            await fn(producer, "orders", b"x")

    def plain() -> None:
        loop.run_until_complete(send(orig))

    def traced() -> None:
        loop.run_until_complete(send(wrapped))

    return plain, traced


def _aiormq_publish_case(
    with_headers: Any, props: Any
) -> tuple[Callable[[], None], Callable[[], None]] | None:
    """One publish through the aiormq instrumentation's wrapper, awaited inside an entry span
    on a running loop, against the channel's method alone in the same span."""
    try:
        from yarl import URL
    except ImportError:  # pragma: no cover - aio-pika not installed
        return None
    from swmp.instrument import _mq
    from swmp.instrument import aiormq as instr

    class Channel:
        connection = types.SimpleNamespace(url=URL("amqp://guest:guest@127.0.0.1:5672/"))

        async def basic_publish(self, body: bytes, **kwargs: Any) -> None:
            pass

    def inline(orig: Any, attach: Any) -> Any:
        # Before 2026-11-29 the wrapper was made inside install(), as this.
        async def basic_publish(self: Any, body: Any, *args: Any, **kwargs: Any) -> Any:
            span, traced = _mq.amqp_send_span(
                kwargs.get("exchange", ""),
                kwargs.get("routing_key", ""),
                instr._peer(self),
                attach,
                kwargs.get("properties"),
            )
            if span is None:
                return await orig(self, body, *args, **kwargs)
            with span:
                return await orig(self, body, *args, **{**kwargs, "properties": traced})

        return basic_publish

    make: Any = getattr(instr, "publish", inline)
    channel, orig = Channel(), Channel.basic_publish
    wrapped = make(orig, with_headers)
    loop = asyncio.new_event_loop()

    async def publish(fn: Any) -> None:
        with new_entry_span("/publish"):
            await fn(channel, b"x", routing_key="orders", properties=props)

    def plain() -> None:
        loop.run_until_complete(publish(orig))

    def traced() -> None:
        loop.run_until_complete(publish(wrapped))

    return plain, traced


def _aiormq_callback_case(table: dict[str, Any]) -> tuple[Callable[[], None], Callable[[], None]] | None:
    """One delivery as aiormq dispatches it (``Channel._on_deliver_frame``: the registered
    ``awaitable(callback)`` called with the message, made a task, run to its end), the
    callback registered through the aiormq instrumentation's wrapper or as it is."""
    try:
        from aiormq.abc import DeliveredMessage
        from aiormq.tools import awaitable
        from pamqp import commands, header
        from yarl import URL
    except ImportError:  # pragma: no cover - aio-pika not installed
        return None
    from swmp.instrument import aiormq as instr

    ns = types.SimpleNamespace
    channel = ns(connection=ns(url=URL("amqp://guest:guest@127.0.0.1:5672/")))
    # The message as aiormq delivers it: pamqp's frames (whose fields are slots) in aiormq's
    # DeliveredMessage (before 2026-12-01: SimpleNamespaces of the same fields).
    deliver = commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, exchange="", routing_key="orders")
    props = commands.Basic.Properties(headers=table)
    message = DeliveredMessage(deliver, header.ContentHeader(0, 5, props), b"hello", channel)  # type: ignore[arg-type]

    async def on_message(m: Any) -> None:
        pass

    def inline(channel: Any, callback: Any) -> Any:
        # Before 2026-11-29 the wrapper was made inside basic_consume's patch, as this.
        async def wrapped(message: Any) -> Any:
            try:
                consuming = instr._message_consuming(channel, message)
            except Exception:
                return await callback(message)
            with consuming:
                return await callback(message)

        return wrapped

    wrap: Any = getattr(instr, "_on_message", inline)
    loop = asyncio.new_event_loop()
    plain_consumer, traced_consumer = awaitable(on_message), awaitable(wrap(channel, on_message))

    def plain() -> None:
        loop.run_until_complete(loop.create_task(plain_consumer(message)))

    def traced() -> None:
        loop.run_until_complete(loop.create_task(traced_consumer(message)))

    return plain, traced


def _pika_callback_case(table: dict[str, Any]) -> tuple[Callable[[], None], Callable[[], None]] | None:
    """A BlockingChannel consumer's callback as the pika instrumentation wraps it, called as
    pika dispatches a message (pika's own method, properties and connection parameters),
    against the callback alone: the message's facts read from pika's objects, then its span."""
    try:
        import pika
    except ImportError:  # pragma: no cover - pika not installed
        return None
    from swmp.instrument import pika as instr

    impl = types.SimpleNamespace(
        connection=types.SimpleNamespace(params=pika.ConnectionParameters(host="127.0.0.1", port=5672))
    )
    channel = types.SimpleNamespace(_impl=impl)
    method = pika.spec.Basic.Deliver(consumer_tag="c", delivery_tag=1, exchange="", routing_key="orders")
    props = pika.BasicProperties(headers=table)

    def on_message(ch: Any, m: Any, p: Any, body: bytes) -> None:
        pass

    # Before 2026-11-28 _traced_callback also took the function giving a channel's
    # implementation: kept so that the benchmark compares both versions.
    wrap: Any = instr._traced_callback
    two_args = getattr(getattr(wrap, "__code__", None), "co_argcount", 1) == 2
    wrapped = wrap(on_message, instr._impl) if two_args else wrap(on_message)

    def plain() -> None:
        on_message(channel, method, props, b"x")

    def traced() -> None:
        wrapped(channel, method, props, b"x")

    return plain, traced


def in_process(ring: Ring, calls: int, rounds: int) -> dict[str, Any]:
    """What the wrappers add per message, measured alone (min over rounds, us per call):
    the cases of :func:`in_process_cases`."""

    def best(fn: Callable[[], None]) -> float:
        times = []
        for _ in range(rounds):
            ring.warm()
            t0 = time.process_time_ns()
            for _ in range(calls):
                fn()
            times.append((time.process_time_ns() - t0) / calls / 1000)
            ring.drain()
        return min(times)

    out: dict[str, Any] = {}
    for name, (base_fn, traced_fn) in in_process_cases().items():
        base, traced = best(base_fn), best(traced_fn)
        out[name] = {"plain_us": base, "instrumented_us": traced, "added_us": traced - base}
    return out


# -- the run -------------------------------------------------------------------------------------
@contextlib.contextmanager
def brokers(
    kafka: str | None, amqp: str | None, need_kafka: bool, need_amqp: bool, warm_s: float | None = None
) -> Iterator[tuple[str, str]]:
    """The brokers to measure against: the given ones, else started here. Each is loaded
    for ``warm_s`` seconds first (default: brokers started here only; see _broker_warmup)."""
    stops: list[Callable[[], None]] = []

    def warm(name: str, load: Callable[[str, float], int], address: str, started: bool) -> None:
        seconds = (WARM_S if started else 0.0) if warm_s is None else warm_s
        if seconds > 0:
            moved = load(address, seconds)
            print(f"{name} warmed up: {moved} messages in {seconds:g} s", file=sys.stderr)

    try:
        if need_kafka:
            started = not kafka
            if not kafka:
                from tests.realpeers import start_kafka

                run_dir = Path(tempfile.mkdtemp(prefix="swmp-mqbench-kafka-"))
                broker = start_kafka(run_dir, secured=False)
                stops.append(broker.stop)
                kafka = broker.bootstrap
            warm("kafka broker", _broker_warmup.warm_kafka, kafka, started)
        if need_amqp:
            started = not amqp
            if not amqp:
                from tests.brokers import start_rabbitmq

                d = start_rabbitmq()
                stops.append(d.stop)
                amqp = f"amqp://guest:guest@127.0.0.1:{d.port}/"
            warm("rabbitmq", _broker_warmup.warm_amqp, amqp, started)
        yield kafka or "", amqp or ""
    finally:
        for stop in reversed(stops):
            stop()


def make_harness(client: str, kafka: str, amqp: str, n: int) -> Any:
    if client == "kafka-python":
        return Kafka(kafka, n)
    if client == "confluent-kafka":
        return Confluent(kafka, n)
    if client == "confluent-aio":
        return ConfluentAio(kafka, n)
    if client == "aiokafka":
        return AioKafka(kafka, n)
    return Pika(amqp, n) if client == "pika" else AioPika(amqp, n)


def bench_client(client: str, harness: Any, rounds: int, config: Any, ring: Ring) -> dict[str, Any]:
    n = harness.n
    two_objects = isinstance(harness, (Confluent, ConfluentAio))
    if two_objects:
        for mode in (False, True):
            set_instrumented(client, mode, config)
            harness.make(mode)
    set_instrumented(client, True, config)
    harness.prefill()
    times: dict[str, dict[bool, list[float]]] = {op: {False: [], True: []} for op in ("publish", "consume")}
    for r in range(rounds + 1):  # round 0 warms up both modes and is not counted
        for mode in (False, True) if r % 2 else (True, False):
            set_instrumented(client, mode, config)
            ring.warm()  # resident, as a busy worker's ring is (benchmarks/_ring.py)
            pub = harness.publish(mode) if two_objects else harness.publish()
            if hasattr(harness, "fill_for_consume"):
                set_instrumented(client, True, config)
                harness.fill_for_consume()
                set_instrumented(client, mode, config)
            ring.warm()
            con = harness.consume(mode) if two_objects else harness.consume()
            ring.drain()
            if r:
                times["publish"][mode].append(pub / n)
                times["consume"][mode].append(con / n)
    set_instrumented(client, False, config)
    out: dict[str, Any] = {}
    for op, by_mode in times.items():
        deltas = [i - p for p, i in zip(by_mode[False], by_mode[True], strict=True)]
        out[op] = {
            "plain_us": statistics.median(by_mode[False]) / 1000,
            "instrumented_us": statistics.median(by_mode[True]) / 1000,
            "added_us": statistics.median(deltas) / 1000,
            "rounds": len(deltas),
            "messages": n,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--messages", type=int, default=2000, help="messages per operation and round")
    ap.add_argument("--kafka", help="bootstrap server of a running broker (default: start one)")
    ap.add_argument("--amqp", help="amqp:// URL of a running RabbitMQ (default: start one)")
    ap.add_argument(
        "--broker-warmup",
        type=float,
        metavar="S",
        help=f"seconds of plain load on each broker before measuring (default: {WARM_S:g} for "
        "brokers started here, 0 for given ones; a just-started JVM broker makes every figure larger)",
    )
    ap.add_argument(
        "--only",
        choices=[*sorted(MODULES), "in-process"],
        action="append",
        help="benchmark only these clients ('in-process': the wrappers alone, no broker)",
    )
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="per-call mode: this many plain/instrumented pairs per client and operation, "
        "each message timed (instead of the rounds)",
    )
    ap.add_argument("--warmup", type=int, default=200, help="per-call mode: untimed pairs first")
    ap.add_argument(
        "--steps",
        action="store_true",
        help="per-call mode: where a traced publish's added CPU goes (header bytes, span work, glue)",
    )
    args = ap.parse_args()
    from benchmarks import mq_percall as pc  # it imports this module: here, not at the top

    # A TERM (timeout, kill of the job) unwinds like an exception: the brokers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    clients = [c for c in args.only or list(MODULES) if c != "in-process"]
    if args.pairs > 0:
        skipped = [c for c in clients if c not in pc.PER_CALL]
        if skipped:
            print(f"per-call mode: not for {', '.join(skipped)} (use the rounds)", file=sys.stderr)
        clients = [c for c in clients if c in pc.PER_CALL]
    need_kafka = any("kafka" in c or "confluent" in c for c in clients)
    need_amqp = any("pika" in c for c in clients)

    config = load({}, agent_log_reporter_active=False)
    tracing.configure(config)
    # Per call, the ring is drained every 100 pairs: the agent's ring size. A round sends and
    # consumes ``--messages`` each without a drain: a ring that holds them (~1 KiB a message).
    ring = Ring() if args.pairs > 0 else Ring(ring_size_for(2 * args.messages, 1024))
    if args.pairs > 0:
        load1 = os.getloadavg()[0]
        kw: dict[str, Any] = {"pairs": args.pairs, "warmup": args.warmup, "config": config, "ring": ring}
        try:
            with brokers(args.kafka, args.amqp, need_kafka, need_amqp, args.broker_warmup) as (kafka, amqp):
                if args.steps:
                    per = pc.publish_steps(clients, kafka, amqp, **kw)
                else:
                    per = pc.per_call(clients, kafka, amqp, **kw)
        finally:
            ring.close()
        (pc.print_steps if args.steps else pc.print_per_call)(per, args.pairs)
        print(f"Python {sys.version.split()[0]}, load {load1:.2f} -> {os.getloadavg()[0]:.2f}")
        if args.json:
            meta = {"pairs": args.pairs, "warmup": args.warmup, "load": [load1, os.getloadavg()[0]]}
            key = "publish_steps" if args.steps else "per_call"
            Path(args.json).write_text(json.dumps({key: per, "meta": meta}, indent=2) + "\n")
        return
    results: dict[str, Any] = {}
    results["in-process"] = in_process(ring, 20_000, max(3, args.rounds))
    with brokers(args.kafka, args.amqp, need_kafka, need_amqp, args.broker_warmup) as (kafka, amqp):
        for client in clients:
            harness = make_harness(client, kafka, amqp, args.messages)
            try:
                results[client] = bench_client(client, harness, args.rounds, config, ring)
            finally:
                harness.close()
            ring.drain()
    ring.close()

    print(f"\nCPU us per message; in-process: min of rounds; clients: median of {args.rounds} rounds")
    print(f"{'client':<16} {'operation':<9} {'plain':>9} {'instrumented':>13} {'added':>8}")
    for client, ops in results.items():
        for op, v in ops.items():
            plain, traced, added = v["plain_us"], v["instrumented_us"], v["added_us"]
            print(f"{client:<16} {op:<9} {plain:>9.2f} {traced:>13.2f} {added:>8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
