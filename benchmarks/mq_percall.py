"""The message-queue instrumentation's cost per message, each message timed: the per-call mode of
``benchmarks/mq_bench.py`` (``--pairs N``, ``--steps``), which runs it.

Per call (``--pairs N``; instead of the rounds; not for ``confluent-aio``): each message
timed, plain and instrumented alternated call by call (ABBA, ``benchmarks/_abba.py``), so that
both see the caches as the previous round trip left them and machine drift hits both alike
(the rounds above scatter by microseconds). What is compared:

* ``publish``: one message sent inside its own entry span (the application's request), then
  delivered: kafka-python and confluent-kafka ``flush()``, aiokafka ``await`` of the send's
  future, pika / aio-pika nothing more (the send writes the frames to the socket itself;
  aio-pika without publisher confirms). Instrumented: the patched send. Plain, the agent's
  part absent: the same entry span and the library's original send on the same client
  (``swmp.instrument._patch.original``, the method the gate would call; confluent-kafka:
  librdkafka's, on the base class of the instrumented subclass; pika / aio-pika: a
  second channel of the same connection with the original method set on that channel
  object). Linger 0 and one delivery per message, so that what the client's I/O thread does
  for a message happens within its call; the figures per message are the same with batching
  except the per-batch work, which is in both sides.
* ``consume``: one message taken, from the same stream for both sides, every message carrying
  ``sw8`` (so the extra bytes are in both: what is compared is the instrumentation). Kafka:
  one topic, one record per batch, read from the start by two consumers, one plain (the
  library's original ``poll`` / ``getone``; confluent-kafka: a consumer made without the
  agent), one instrumented, one record per call. RabbitMQ (``basic_consume`` callbacks): two
  queues filled alike, prefetch 1 and manual acks, the message of a call let in (its
  predecessor acked, untimed) just before the call, so each call reads, decodes and
  dispatches exactly one delivery.

Clocks, all CPU time (waiting for the broker or for a CPU does not count; the brokers' CPU
is not counted; the kernel's work inside our syscalls is, on loopback part of the delivery):

* ``client`` (the table's main figure): the calling thread plus the client's own threads
  (by each thread's CPU clock): kafka-python's sender and I/O threads, librdkafka's
  threads, which build, checksum, send and fetch outside the caller's call, count; the
  other side's client (the consume runs have two consumers in the process) does not.
* ``proc``: the whole process (``CLOCK_PROCESS_CPUTIME_ID``, the outer clock of the ABBA
  loop): the same plus other threads' work, e.g. the other consumer's background fetches.
* the calling thread's alone (``thread_time_ns``; in the JSON) misses what the client's I/O
  threads do for the message (kafka-python: its batch CRC, most of its added cost), and for
  ``publish`` its parts: ``+call``, the send call (the exit span, the headers, the library's
  extra work in the caller) and ``+segment``, the entry span's exit (the exit span's share of
  the segment, serialized and written into the ring).

Medians per call; ``+`` is the median of the pairs' differences, with the two halves of the
run apart as a stability check (quartiles in the JSON). One message in flight per call means
every call starts with the CPU caches cold after the wait for the network: the cost at low
message rates (see ``cold_cache_bench.py``); back-to-back deliveries in batches run warmer.

``--steps`` (with ``--pairs``): where a traced publish's added CPU goes, per client, four
sends alternated pairwise the same way (``publish_variants``): the library's own work for a
header of sw8's size (original send with and without it), the agent's span work around the
real client (exit span, tags, sw8 headers done inline), the instrumentation's glue (the
instrumented send against that), and the total.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks._ring import Ring
from benchmarks.mq_bench import PAYLOAD, set_instrumented
from swmp.tracing.context import new_entry_span


# -- per call (--pairs): each message timed, plain and instrumented alternated (ABBA) ------------
def _process_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)


_thread_ns = time.thread_time_ns
Op = Callable[[], None]


def _tids() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


class ThreadsClock:
    """CPU time (ns) of the calling thread plus the given threads of this process: a client's
    own I/O threads (Linux: the CPU clock of a thread of this process by its id). A thread
    that has exited keeps its last reading."""

    def __init__(self, tids: set[int]) -> None:
        self.tids = [threading.get_native_id(), *sorted(tids)]
        self._ids = [((~tid) << 3) | 6 for tid in self.tids]  # MAKE_THREAD_CPUCLOCK(tid, SCHED)
        self._last = [0] * len(self._ids)

    def __call__(self) -> int:
        total = 0
        for i, cid in enumerate(self._ids):
            try:
                self._last[i] = time.clock_gettime_ns(cid)
            except OSError:
                pass
            total += self._last[i]
        return total


def client_threads(make: Callable[[], Any], use: Callable[[Any], Any]) -> tuple[Any, set[int]]:
    """``make()`` and the threads it started (the client's own), ``use(client)`` called first
    (librdkafka starts its broker threads once it connects)."""
    before = _tids()
    obj = make()
    use(obj)
    time.sleep(0.2)
    return obj, _tids() - before


class Rec:
    """One side's per-call times besides the process CPU clock of ``alternate``: the client's
    CPU time (``clock``: the calling thread and the client's own threads), the calling
    thread's CPU time of the whole operation, and for a publish its parts (the send call; the
    entry span's exit, where the segment is serialized and written into the ring)."""

    def __init__(self, clock: ThreadsClock | None = None) -> None:
        self.clock = clock or ThreadsClock(set())
        self.client: list[int] = []
        self.whole: list[int] = []
        self.call: list[int] = []
        self.seg: list[int] = []

    def clear(self) -> None:
        for times in (self.client, self.whole, self.call, self.seg):
            times.clear()


def _traced_first(k: int) -> bool:
    """Whether the k-th call (0-based) of ``benchmarks._abba.alternate`` is the traced one:
    pair i runs ``traced`` first when i is even."""
    i, second = divmod(k, 2)
    return (i & 1 == 0) != bool(second)


def _check_sides() -> None:
    from benchmarks._abba import alternate

    ran: list[bool] = []
    alternate(lambda: ran.append(False), lambda: ran.append(True), 5)
    assert ran == [_traced_first(k) for k in range(10)], ran


def sided(hook: Callable[[bool], None]) -> Callable[[int], None]:
    """``before`` for ``alternate`` that calls ``hook(traced)`` with the side of the next call."""
    k = 0

    def before(i: int) -> None:
        nonlocal k
        side = _traced_first(k)
        k += 1
        hook(side)

    return before


def _orig(owner: type, name: str) -> Any:
    """The library's own method under the instrumentation's patch (checked to be another)."""
    from swmp.instrument._patch import original

    fn = original(owner, name)
    assert fn is not owner.__dict__[name], f"{owner.__name__}.{name} is not patched"
    return fn


def _patched(owner: type, name: str) -> bool:
    from swmp.instrument._patch import original

    return original(owner, name) is not owner.__dict__[name]


def _base(obj: Any) -> Any:
    """The class an instrumented subclass derives from (confluent-kafka's compiled ones)."""
    return type(obj).__bases__[0]


def _publish_op(send: Op, deliver: Op, rec: Rec) -> Op:
    """One message published inside its own entry span (the application's request), then
    delivered (``deliver``: flush / wait for the broker's ack; nothing where the send writes
    to the socket itself)."""

    def op() -> None:
        t0 = _thread_ns()
        with new_entry_span("/publish"):
            t1 = _thread_ns()
            send()
            t2 = _thread_ns()
        t3 = _thread_ns()
        deliver()
        t4 = _thread_ns()
        rec.whole.append(t4 - t0)
        rec.call.append(t2 - t1)
        rec.seg.append(t3 - t2)

    return op


def _async_publish_op(loop: asyncio.AbstractEventLoop, send: Callable[[], Any], rec: Rec) -> Op:
    """:func:`_publish_op` for an asyncio client: ``await send()``, then, if that returned a
    future (aiokafka's delivery), ``await`` it after the entry span."""

    async def run() -> None:
        t0 = _thread_ns()
        with new_entry_span("/publish"):
            t1 = _thread_ns()
            fut = await send()
            t2 = _thread_ns()
        t3 = _thread_ns()
        if isinstance(fut, asyncio.Future):
            await fut
        t4 = _thread_ns()
        rec.whole.append(t4 - t0)
        rec.call.append(t2 - t1)
        rec.seg.append(t3 - t2)

    return lambda: loop.run_until_complete(run())


def _whole_op(fn: Op, rec: Rec) -> Op:
    def op() -> None:
        t0 = _thread_ns()
        fn()
        rec.whole.append(_thread_ns() - t0)

    return op


def _consumed(  # noqa: PLR0917
    plain: Op,
    traced: Op,
    recs: tuple[Rec, Rec],
    pairs: int,
    warmup: int,
    ring: Ring,
    before: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """One message consumed per call by each side, alternated (ABBA), each call timed whole;
    the ring drained every 100 pairs."""
    return _abba(
        _whole_op(plain, recs[0]),
        _whole_op(traced, recs[1]),
        recs,
        pairs,
        warmup,
        before=before,
        between=_every(100, ring.drain),
        ring=ring,
    )


def _abba(
    plain: Op,
    traced: Op,
    recs: tuple[Rec, Rec],
    pairs: int,
    warmup: int,
    *,
    before: Callable[[int], None] | None = None,
    between: Callable[[int], None] | None = None,
    ring: Ring | None = None,
) -> dict[str, Any]:
    """``warmup`` pairs untimed, then ``pairs`` pairs (benchmarks/_abba.py, the outer clock the
    process's CPU time); medians per call (us) and medians of the pairs' differences. ``ring``
    goes round once first (``Ring.warm``): the set-up before may have been a pause long enough
    for it to give its pages back."""
    import gc

    from benchmarks._abba import alternate

    rp, rt = recs

    def client_timed(op: Op, rec: Rec) -> Op:
        clock, times = rec.clock, rec.client

        def timed_op() -> None:
            t0 = clock()
            op()
            times.append(clock() - t0)

        return timed_op

    plain, traced = client_timed(plain, rp), client_timed(traced, rt)
    if ring is not None:
        ring.warm()
    if warmup:
        alternate(plain, traced, warmup, clock=_process_ns, before=before, between=between)
    rp.clear()
    rt.clear()
    gc.collect()
    p, t = alternate(plain, traced, pairs, clock=_process_ns, before=before, between=between)
    med = statistics.median

    def added(a: list[int], b: list[int]) -> float:
        return med([y - x for x, y in zip(a, b, strict=True)]) / 1000

    half = pairs // 2
    out: dict[str, Any] = {
        "process_plain_us": med(p) / 1000,
        "process_traced_us": med(t) / 1000,
        "process_added_us": added(p, t),
        "process_added_halves_us": [added(p[:half], t[:half]), added(p[half:], t[half:])],
        "process_added_quartiles_us": [
            q / 1000 for q in statistics.quantiles([y - x for x, y in zip(p, t, strict=True)], n=4)
        ],
        "client_plain_us": med(rp.client) / 1000,
        "client_traced_us": med(rt.client) / 1000,
        "client_added_us": added(rp.client, rt.client),
        "client_added_halves_us": [
            added(rp.client[:half], rt.client[:half]),
            added(rp.client[half:], rt.client[half:]),
        ],
        "client_threads": [len(rp.clock.tids), len(rt.clock.tids)],
        "thread_plain_us": med(rp.whole) / 1000,
        "thread_traced_us": med(rt.whole) / 1000,
        "thread_added_us": added(rp.whole, rt.whole),
        "thread_added_halves_us": [
            added(rp.whole[:half], rt.whole[:half]),
            added(rp.whole[half:], rt.whole[half:]),
        ],
        "pairs": pairs,
        "threads": len(os.listdir("/proc/self/task")),
    }
    if rp.call:
        out["call_added_us"] = added(rp.call, rt.call)
        out["segment_added_us"] = added(rp.seg, rt.seg)
        out["call_plain_us"] = med(rp.call) / 1000
    return out


def _every(n: int, fn: Callable[[], Any]) -> Callable[[int], None]:
    def between(i: int) -> None:
        if i % n == n - 1:
            fn()

    return between


# The whole prefilled topic in the first fetch (during the warm-up), so that no fetch lands in
# one side's calls more than in the other's.
FETCH_BYTES = 16 << 20


def prefill_kafka(bootstrap: str, n: int, config: Any) -> str:
    """A topic of ``n`` records carrying ``sw8`` (each sent inside an entry span by the
    instrumented kafka-python producer), one record per batch, as per-call sends make them."""
    from kafka import KafkaProducer

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    set_instrumented("kafka-python", True, config)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    try:
        for _ in range(n):
            with new_entry_span("/prefill"):
                producer.send(topic, PAYLOAD)
            producer.flush()
    finally:
        producer.close(timeout=10)
        set_instrumented("kafka-python", False, config)
    return topic


def percall_kafka_python(
    bootstrap: str, topic: str, *, pairs: int, warmup: int, config: Any, ring: Ring
) -> dict[str, Any]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    out: dict[str, Any] = {}
    set_instrumented("kafka-python", True, config)
    try:
        pub = f"bench-{uuid.uuid4().hex[:8]}"
        orig_send = _orig(KafkaProducer, "send")

        def first_send(p: Any) -> None:
            orig_send(p, pub, PAYLOAD)
            p.flush()

        p, tids = client_threads(lambda: KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0), first_send)
        try:
            send = p.send
            recs = (Rec(ThreadsClock(tids)), Rec(ThreadsClock(tids)))
            out["publish"] = _abba(
                _publish_op(lambda: orig_send(p, pub, PAYLOAD), p.flush, recs[0]),
                _publish_op(lambda: send(pub, PAYLOAD), p.flush, recs[1]),
                recs,
                pairs,
                warmup,
                between=_every(100, ring.drain),
                ring=ring,
            )
        finally:
            p.close(timeout=10)
        orig_poll = _orig(KafkaConsumer, "poll")

        def first_poll(c: Any) -> None:  # the first record, untraced: both consumers alike
            c.assign([TopicPartition(topic, 0)])
            c.seek_to_beginning()
            while not orig_poll(c, timeout_ms=1000, max_records=1):
                pass

        consumers, clocks = [], []
        for _ in range(2):
            c, tids = client_threads(
                lambda: KafkaConsumer(
                    bootstrap_servers=bootstrap,
                    enable_auto_commit=False,
                    group_id=None,
                    max_partition_fetch_bytes=FETCH_BYTES,
                ),
                first_poll,
            )
            consumers.append(c)
            clocks.append(ThreadsClock(tids))
        try:
            cp, ct = consumers

            def poll_plain() -> None:
                while not orig_poll(cp, timeout_ms=1000, max_records=1):
                    pass

            def poll_traced() -> None:
                while not ct.poll(timeout_ms=1000, max_records=1):
                    pass

            recs = (Rec(clocks[0]), Rec(clocks[1]))
            out["consume"] = _consumed(
                poll_plain,
                poll_traced,
                recs,
                pairs,
                warmup,
                ring,
            )
        finally:
            for c in consumers:
                c.close()
    finally:
        set_instrumented("kafka-python", False, config)
    return out


def percall_confluent(
    bootstrap: str, topic: str, *, pairs: int, warmup: int, config: Any, ring: Ring
) -> dict[str, Any]:
    import confluent_kafka

    out: dict[str, Any] = {}
    set_instrumented("confluent-kafka", True, config)
    try:
        pub = f"bench-{uuid.uuid4().hex[:8]}"

        def first_produce(p: Any) -> None:
            _base(p).produce(p, pub, PAYLOAD)
            p.flush(30)

        p, tids = client_threads(
            lambda: confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0}), first_produce
        )
        try:
            # The instrumented class is a subclass whose ``produce`` is a gate set in its body
            # (no ``__swmp_original__``): the original is librdkafka's, on the base class.
            produce, orig_produce = p.produce, _base(p).produce
            assert orig_produce is not type(p).__dict__["produce"]
            recs = (Rec(ThreadsClock(tids)), Rec(ThreadsClock(tids)))

            def deliver() -> None:
                p.flush(30)

            out["publish"] = _abba(
                _publish_op(lambda: orig_produce(p, pub, PAYLOAD), deliver, recs[0]),
                _publish_op(lambda: produce(pub, PAYLOAD), deliver, recs[1]),
                recs,
                pairs,
                warmup,
                between=_every(100, ring.drain),
                ring=ring,
            )
        finally:
            p.flush(10)

        # The plain consumer is an object of librdkafka's own class, made without the agent.
        def first_message(c: Any) -> None:  # the first record, untraced: both consumers alike
            c.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
            while True:
                m = _base(c).poll(c, 1.0) if hasattr(type(c), "_swmp_aio") else c.poll(1.0)
                if m is not None and m.error() is None:
                    return

        consumers, clocks = [], []
        for instrumented in (False, True):
            set_instrumented("confluent-kafka", instrumented, config)
            conf: dict[str, Any] = {
                "bootstrap.servers": bootstrap,
                "group.id": uuid.uuid4().hex,
                "enable.auto.commit": False,
            }
            c, tids = client_threads(functools.partial(confluent_kafka.Consumer, conf), first_message)
            consumers.append(c)
            clocks.append(ThreadsClock(tids))
        try:
            cp, ct = consumers
            assert not hasattr(type(cp), "_swmp_aio") and hasattr(type(ct), "_swmp_aio")

            def poll(c: Any) -> Op:
                def run() -> None:
                    while True:
                        m = c.poll(1.0)
                        if m is not None and m.error() is None:
                            return

                return run

            recs = (Rec(clocks[0]), Rec(clocks[1]))
            out["consume"] = _consumed(
                poll(cp),
                poll(ct),
                recs,
                pairs,
                warmup,
                ring,
            )
        finally:
            for c in consumers:
                c.close()
    finally:
        set_instrumented("confluent-kafka", False, config)
    return out


def percall_aiokafka(
    bootstrap: str, topic: str, *, pairs: int, warmup: int, config: Any, ring: Ring
) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    out: dict[str, Any] = {}
    loop = asyncio.new_event_loop()
    set_instrumented("aiokafka", True, config)
    try:

        async def start_producer() -> Any:
            p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
            await p.start()
            return p

        p = loop.run_until_complete(start_producer())
        try:
            send, orig_send = p.send, _orig(AIOKafkaProducer, "send")
            pub = f"bench-{uuid.uuid4().hex[:8]}"
            recs = (Rec(), Rec())
            out["publish"] = _abba(
                _async_publish_op(loop, lambda: orig_send(p, pub, PAYLOAD), recs[0]),
                _async_publish_op(loop, lambda: send(pub, PAYLOAD), recs[1]),
                recs,
                pairs,
                warmup,
                between=_every(100, ring.drain),
                ring=ring,
            )
        finally:
            loop.run_until_complete(p.stop())

        async def start_consumer() -> Any:
            c = AIOKafkaConsumer(
                bootstrap_servers=bootstrap,
                enable_auto_commit=False,
                group_id=None,
                max_partition_fetch_bytes=FETCH_BYTES,
            )
            await c.start()
            tp = TopicPartition(topic, 0)
            c.assign([tp])
            await c.seek_to_beginning(tp)
            return c

        cp = loop.run_until_complete(start_consumer())
        ct = loop.run_until_complete(start_consumer())
        try:
            orig_getone = _orig(AIOKafkaConsumer, "getone")
            recs = (Rec(), Rec())
            out["consume"] = _consumed(
                lambda: loop.run_until_complete(orig_getone(cp)),
                lambda: loop.run_until_complete(ct.getone()),
                recs,
                pairs,
                warmup,
                ring,
            )
        finally:
            loop.run_until_complete(cp.stop())
            loop.run_until_complete(ct.stop())
    finally:
        set_instrumented("aiokafka", False, config)
        loop.close()
    return out


def percall_pika(url: str, *, pairs: int, warmup: int, config: Any, ring: Ring) -> dict[str, Any]:
    """The plain side runs on a channel of the same connection whose ``basic_publish`` /
    ``_on_deliver`` are pika's originals (set on that channel object), its consumer
    registered with the original ``BlockingChannel.basic_consume``."""
    import types

    import pika
    from pika.adapters.blocking_connection import BlockingChannel
    from pika.channel import Channel

    out: dict[str, Any] = {}
    set_instrumented("pika", True, config)
    conn = pika.BlockingConnection(pika.URLParameters(url))
    queues: list[str] = []
    try:
        ch_p, ch_t, ch_fill = conn.channel(), conn.channel(), conn.channel()
        ch_p._impl.basic_publish = types.MethodType(_orig(Channel, "basic_publish"), ch_p._impl)
        # The consumer's way in that the instrumentation patches: _on_deliver before
        # 2026-11-28, basic_consume (its callback wrapped once) since.
        for name in ("_on_deliver", "basic_consume"):
            if _patched(Channel, name):
                setattr(ch_p._impl, name, types.MethodType(_orig(Channel, name), ch_p._impl))
        pub, q_p, q_t = (f"bench-{uuid.uuid4().hex[:8]}" for _ in range(3))
        for q in (pub, q_p, q_t):
            ch_fill.queue_declare(q)
            queues.append(q)
        recs = (Rec(), Rec())

        def nothing() -> None:
            pass

        def drain() -> None:
            ring.drain()
            ch_fill.queue_purge(pub)

        out["publish"] = _abba(
            _publish_op(lambda: ch_p.basic_publish("", pub, PAYLOAD), nothing, recs[0]),
            _publish_op(lambda: ch_t.basic_publish("", pub, PAYLOAD), nothing, recs[1]),
            recs,
            pairs,
            warmup,
            between=_every(200, drain),
            ring=ring,
        )
        # consume: both queues filled with the same messages (carrying sw8); prefetch 1 and
        # manual acks: the message of a call is let in (its predecessor acked) just before it.
        for q in (q_p, q_t):
            for _ in range(pairs + warmup + 2):
                with new_entry_span("/prefill"):
                    ch_fill.basic_publish("", q, PAYLOAD)
        held: dict[bool, Any] = {False: None, True: None}

        def callback(side: bool) -> Callable[..., None]:
            def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
                held[side] = method.delivery_tag

            return on_message

        channels = {False: ch_p, True: ch_t}
        for ch in channels.values():
            ch.basic_qos(prefetch_count=1)
        _orig(BlockingChannel, "basic_consume")(ch_p, q_p, callback(False))
        ch_t.basic_consume(q_t, callback(True))
        while held[False] is None or held[True] is None:
            conn.process_data_events(time_limit=0.1)

        def let_in(side: bool) -> None:
            channels[side].basic_ack(held[side])
            held[side] = None

        def consume(side: bool) -> Op:
            def run() -> None:
                while held[side] is None:
                    conn.process_data_events(time_limit=None)

            return run

        recs = (Rec(), Rec())
        out["consume"] = _consumed(
            consume(False),
            consume(True),
            recs,
            pairs,
            warmup,
            ring,
            before=sided(let_in),
        )
    finally:
        set_instrumented("pika", False, config)
        with contextlib.suppress(Exception):
            for c in (ch_p, ch_t):  # their consumers cancelled before the queues go
                c.close()
            ch = conn.channel()
            for q in queues:
                ch.queue_delete(q)
        conn.close()
    return out


def percall_aio_pika(url: str, *, pairs: int, warmup: int, config: Any, ring: Ring) -> dict[str, Any]:
    """As :func:`percall_pika`: the plain side's aiormq channel has aiormq's original
    ``basic_publish`` / ``basic_consume`` set on it."""
    import types

    import aio_pika
    import aiormq

    out: dict[str, Any] = {}
    loop = asyncio.new_event_loop()
    set_instrumented("aio-pika", True, config)
    names = [f"bench-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    pub, q_p, q_t = names

    async def start() -> tuple[Any, Any, Any, Any]:
        conn = await aio_pika.connect(url)
        ch_p = await conn.channel(publisher_confirms=False)
        ch_t = await conn.channel(publisher_confirms=False)
        ch_fill = await conn.channel(publisher_confirms=False)
        u = await ch_p.get_underlay_channel()
        u.basic_publish = types.MethodType(_orig(aiormq.Channel, "basic_publish"), u)
        u.basic_consume = types.MethodType(_orig(aiormq.Channel, "basic_consume"), u)
        for q in names:
            await ch_fill.declare_queue(q)
        return conn, ch_p, ch_t, ch_fill

    conn, ch_p, ch_t, ch_fill = loop.run_until_complete(start())
    try:
        recs = (Rec(), Rec())

        def publisher(ch: Any) -> Callable[[], Any]:
            publish = ch.default_exchange.publish
            return lambda: publish(aio_pika.Message(PAYLOAD), routing_key=pub)

        async def purge() -> None:
            await (await ch_fill.get_queue(pub)).purge()

        def drain() -> None:
            ring.drain()
            loop.run_until_complete(purge())

        out["publish"] = _abba(
            _async_publish_op(loop, publisher(ch_p), recs[0]),
            _async_publish_op(loop, publisher(ch_t), recs[1]),
            recs,
            pairs,
            warmup,
            between=_every(200, drain),
            ring=ring,
        )
        held: dict[bool, Any] = {False: None, True: None}
        waiting: dict[bool, asyncio.Future[None]] = {}

        async def fill_and_consume() -> None:
            for q in (q_p, q_t):
                for _ in range(pairs + warmup + 2):
                    with new_entry_span("/prefill"):
                        await ch_fill.default_exchange.publish(aio_pika.Message(PAYLOAD), routing_key=q)
            for side, ch, q in ((False, ch_p, q_p), (True, ch_t, q_t)):
                await ch.set_qos(prefetch_count=1)
                waiting[side] = loop.create_future()

                def on_message(message: Any, side: bool = side) -> Any:
                    held[side] = message
                    if not waiting[side].done():
                        waiting[side].set_result(None)

                async def callback(message: Any, on_message: Any = on_message) -> None:
                    on_message(message)

                await (await ch.get_queue(q)).consume(callback)
            await asyncio.gather(*waiting.values())

        loop.run_until_complete(fill_and_consume())

        def let_in(side: bool) -> None:
            loop.run_until_complete(held[side].ack())
            held[side] = None
            waiting[side] = loop.create_future()

        def consume(side: bool) -> Op:
            return lambda: loop.run_until_complete(waiting[side])

        recs = (Rec(), Rec())
        out["consume"] = _consumed(
            consume(False),
            consume(True),
            recs,
            pairs,
            warmup,
            ring,
            before=sided(let_in),
        )
    finally:
        set_instrumented("aio-pika", False, config)

        async def stop() -> None:
            for c in (ch_p, ch_t):  # their consumers cancelled before the queues go
                with contextlib.suppress(Exception):
                    await c.close()
            for q in names:
                with contextlib.suppress(Exception):
                    await ch_fill.queue_delete(q)
            await conn.close()

        loop.run_until_complete(stop())
        loop.close()
    return out


# -- where a traced publish's added CPU goes (--steps) ---------------------------------------------
SW8_SIZED = "1-" + "Y" * 146  # a header value of the size of the agent's sw8 (148 bytes)
STEPS = (("header bytes", 0, 1), ("span work", 1, 2), ("glue", 2, 3), ("total", 0, 3))


def publish_variants(client: str, kafka: str, amqp: str) -> tuple[list[Any], Op, Any, Op]:
    """Four sends of one message, all with the library's original method except the last:
    V0 no header; V1 a header of sw8's size (``SW8_SIZED``); V2 the agent's span work done
    inline (the exit span with its tags and the sw8 headers from ``_mq``) around the original
    send with those headers; V3 the instrumented send. ``(variants, deliver, loop, close)``;
    with ``loop`` the variants return awaitables."""
    from swmp.instrument import _mq

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    hdr = [("sw8", SW8_SIZED.encode())]
    nothing: Op = lambda: None  # noqa: E731
    if client == "kafka-python":
        from kafka import KafkaProducer

        kp = KafkaProducer(bootstrap_servers=kafka, linger_ms=0)
        send = _orig(KafkaProducer, "send")

        def inline() -> None:
            span, traced = _mq.kafka_send_span(topic, kafka, None)
            assert span is not None
            with span:
                send(kp, topic, PAYLOAD, None, traced)

        variants = [
            lambda: send(kp, topic, PAYLOAD),
            lambda: send(kp, topic, PAYLOAD, None, hdr),
            inline,
            lambda: kp.send(topic, PAYLOAD),
        ]
        return variants, kp.flush, None, lambda: kp.close(timeout=10)
    if client == "confluent-kafka":
        import confluent_kafka

        from swmp.instrument.confluent_kafka import _with_headers

        cp = confluent_kafka.Producer({"bootstrap.servers": kafka, "linger.ms": 0})
        produce = _base(cp).produce

        def inline_c() -> None:
            span, traced = _mq.kafka_send_span(topic, kafka, None, _with_headers)
            assert span is not None
            with span:
                produce(cp, topic, PAYLOAD, headers=traced)

        variants = [
            lambda: produce(cp, topic, PAYLOAD),
            lambda: produce(cp, topic, PAYLOAD, headers=hdr),
            inline_c,
            lambda: cp.produce(topic, PAYLOAD),
        ]

        def flush() -> None:
            cp.flush(30)

        return variants, flush, None, flush
    if client == "aiokafka":
        from aiokafka import AIOKafkaProducer

        loop = asyncio.new_event_loop()

        async def start_a() -> Any:
            producer = AIOKafkaProducer(bootstrap_servers=kafka, linger_ms=0)
            await producer.start()
            return producer

        ap = loop.run_until_complete(start_a())
        asend = _orig(AIOKafkaProducer, "send")

        async def inline_a() -> Any:
            span, traced = _mq.kafka_send_span(topic, kafka, None)
            assert span is not None
            with span:
                return await asend(ap, topic, PAYLOAD, headers=traced)

        def close_a() -> None:
            loop.run_until_complete(ap.stop())
            loop.close()

        variants = [
            lambda: asend(ap, topic, PAYLOAD),
            lambda: asend(ap, topic, PAYLOAD, headers=hdr),
            inline_a,
            lambda: ap.send(topic, PAYLOAD),
        ]
        return variants, nothing, loop, close_a
    if client == "pika":
        import types

        import pika
        from pika.channel import Channel

        conn = pika.BlockingConnection(pika.URLParameters(amqp))
        ch_p, ch_t = conn.channel(), conn.channel()
        ch_p._impl.basic_publish = types.MethodType(_orig(Channel, "basic_publish"), ch_p._impl)
        ch_p.queue_declare(topic)
        props = pika.BasicProperties(headers={"sw8": SW8_SIZED})
        peer = amqp.rsplit("@", 1)[-1].rstrip("/")

        def with_headers(span: Any, _: Any) -> Any:
            new = pika.BasicProperties()
            new.headers = _mq.amqp_headers(span, None)
            return new

        def inline_p() -> None:
            span, traced = _mq.amqp_send_span("", topic, peer, with_headers, None)
            assert span is not None
            with span:
                ch_p.basic_publish("", topic, PAYLOAD, traced)

        def close_p() -> None:
            ch_p.queue_delete(topic)
            conn.close()

        variants = [
            lambda: ch_p.basic_publish("", topic, PAYLOAD),
            lambda: ch_p.basic_publish("", topic, PAYLOAD, props),
            inline_p,
            lambda: ch_t.basic_publish("", topic, PAYLOAD),
        ]
        return variants, nothing, None, close_p
    import types

    import aio_pika
    import aiormq

    loop = asyncio.new_event_loop()

    async def start() -> tuple[Any, Any, Any]:
        conn = await aio_pika.connect(amqp)
        ch_p = await conn.channel(publisher_confirms=False)
        ch_t = await conn.channel(publisher_confirms=False)
        u = await ch_p.get_underlay_channel()
        u.basic_publish = types.MethodType(_orig(aiormq.Channel, "basic_publish"), u)
        await ch_p.declare_queue(topic)
        return conn, ch_p, ch_t

    aconn, ach_p, ach_t = loop.run_until_complete(start())
    pub_p, pub_t = ach_p.default_exchange.publish, ach_t.default_exchange.publish
    apeer = amqp.rsplit("@", 1)[-1].rstrip("/")

    async def inline_ap() -> Any:
        span, headers = _mq.amqp_send_span("", topic, apeer, lambda s, _: _mq.amqp_headers(s, None), None)
        assert span is not None
        with span:
            return await pub_p(aio_pika.Message(PAYLOAD, headers=headers), routing_key=topic)

    def close_ap() -> None:
        async def stop() -> None:
            await ach_p.queue_delete(topic)
            await aconn.close()

        loop.run_until_complete(stop())
        loop.close()

    variants = [
        lambda: pub_p(aio_pika.Message(PAYLOAD), routing_key=topic),
        lambda: pub_p(aio_pika.Message(PAYLOAD, headers={"sw8": SW8_SIZED}), routing_key=topic),
        inline_ap,
        lambda: pub_t(aio_pika.Message(PAYLOAD), routing_key=topic),
    ]
    return variants, nothing, loop, close_ap


def publish_steps(
    clients: list[str], kafka: str, amqp: str, *, pairs: int, warmup: int, config: Any, ring: Ring
) -> dict[str, Any]:
    """Per client, each step of :func:`publish_variants` timed per call like ``--pairs``
    (``header bytes`` V1-V0: the library's own work for a header of sw8's size; ``span work``
    V2-V1: the agent's exit span, tags and headers around the real client; ``glue`` V3-V2:
    the instrumentation's wrapper around them; ``total`` V3-V0), each an ABBA run of its own
    (so the steps add up to the total only roughly)."""
    out: dict[str, Any] = {}
    for client in clients:
        set_instrumented(client, True, config)
        try:
            variants, deliver, loop, close = publish_variants(client, kafka, amqp)
            try:
                out[client] = {}
                for name, a, b in STEPS:
                    recs = (Rec(), Rec())
                    if loop is None:
                        ops = (
                            _publish_op(variants[a], deliver, recs[0]),
                            _publish_op(variants[b], deliver, recs[1]),
                        )
                    else:
                        ops = (
                            _async_publish_op(loop, variants[a], recs[0]),
                            _async_publish_op(loop, variants[b], recs[1]),
                        )
                    out[client][name] = _abba(
                        *ops, recs, pairs, warmup, between=_every(100, ring.drain), ring=ring
                    )
            finally:
                close()
        finally:
            set_instrumented(client, False, config)
        ring.drain()
    return out


def print_steps(results: dict[str, Any], pairs: int) -> None:
    print(
        f"\nwhere a traced publish's added CPU goes, us per message ({pairs} pairs per step, medians of "
        "the pairs' differences): process CPU / the send call's (calling thread)"
    )
    print(f"{'client':<16}" + "".join(f"{name:>18}" for name, _, _ in STEPS))
    for client, steps in results.items():
        cells = "".join(
            f"{steps[name]['process_added_us']:>9.2f} /{steps[name]['call_added_us']:>6.2f} "
            for name, _, _ in STEPS
        )
        print(f"{client:<16}{cells}")


PER_CALL = ("kafka-python", "confluent-kafka", "aiokafka", "pika", "aio-pika")


def per_call(
    clients: list[str], kafka: str, amqp: str, *, pairs: int, warmup: int, config: Any, ring: Ring
) -> dict[str, Any]:
    _check_sides()
    out: dict[str, Any] = {}
    topic = ""
    if any(c in ("kafka-python", "confluent-kafka", "aiokafka") for c in clients):
        topic = prefill_kafka(kafka, pairs + warmup + 10, config)
    kw: dict[str, Any] = {"pairs": pairs, "warmup": warmup, "config": config, "ring": ring}
    for client in clients:
        if client == "kafka-python":
            out[client] = percall_kafka_python(kafka, topic, **kw)
        elif client == "confluent-kafka":
            out[client] = percall_confluent(kafka, topic, **kw)
        elif client == "aiokafka":
            out[client] = percall_aiokafka(kafka, topic, **kw)
        elif client == "pika":
            out[client] = percall_pika(amqp, **kw)
        elif client == "aio-pika":
            out[client] = percall_aio_pika(amqp, **kw)
        ring.drain()
    return out


def print_per_call(results: dict[str, Any], pairs: int) -> None:
    print(
        f"\nper message, {pairs} pairs alternated (ABBA), medians, us; client = CPU of the calling "
        "thread and the client's own threads,\nproc = of the whole process, call / segment = the "
        "calling thread's in the send call / the entry span's exit; + = median of the pairs' differences"
    )
    head = ("client", "op", "plain", "+client", "+proc", "+call", "+segment", "halves(+client)")
    print(
        f"{head[0]:<16}{head[1]:<9}{head[2]:>8}{head[3]:>9}{head[4]:>8}{head[5]:>7}{head[6]:>9}{head[7]:>17}"
    )
    for client, ops in results.items():
        for op, r in ops.items():
            call = f"{r['call_added_us']:.2f}" if "call_added_us" in r else "-"
            seg = f"{r['segment_added_us']:.2f}" if "segment_added_us" in r else "-"
            halves = "/".join(f"{h:.1f}" for h in r["client_added_halves_us"])
            print(
                f"{client:<16}{op:<9}{r['client_plain_us']:>8.1f}{r['client_added_us']:>9.2f}"
                f"{r['process_added_us']:>8.2f}{call:>7}{seg:>9}{halves:>17}"
            )
