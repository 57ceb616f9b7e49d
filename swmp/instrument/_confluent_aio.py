"""confluent-kafka's asyncio clients (``confluent_kafka.aio``, patched when it is imported).

``AIOProducer`` / ``AIOConsumer`` (and their ``AsyncSerializingProducer`` /
``AsyncDeserializingConsumer`` subclasses) build a sync ``confluent_kafka.Producer`` /
``Consumer`` through the module's name (so swmp's subclasses) and run its blocking calls in a
thread pool. Spans are made on the event loop, in the calling coroutine's context:

* ``AIOProducer.produce`` does not hand the message to librdkafka: it appends it to a
  buffer and returns a future; the buffer goes out through ``Producer.produce_batch`` in the
  pool (``batch_size`` messages, ``buffer_timeout`` of inactivity, ``flush``/``close``).
  librdkafka's batch call cannot carry headers and ``AIOProducer.produce`` refuses a
  ``headers`` argument. So the exit span covers the ``produce`` coroutine (serialization for
  ``AsyncSerializingProducer``, buffering, the batch hand-over when this call fills the
  buffer); its ``sw8`` headers ride in the buffered message as a :class:`TracedHeaders`
  list, and swmp's ``Producer.produce_batch`` sends such messages one by one through the
  compiled ``Producer.produce`` (no second span) with those headers, in batch order, the
  others through ``produce_batch`` as before. Calls passing ``headers`` are left to the
  library (``NotImplementedError``), untraced.
* ``AIOConsumer.poll`` / ``consume``: an entry span per returned message, recorded after
  the awaited call and before the message is returned; the wrapped sync ``Consumer`` records
  nothing itself (no span from a pool thread, no second span). ``AsyncDeserializingConsumer``
  goes through these (``super()``), so a message is recorded before it is deserialized.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from swmp.instrument import _mq
from swmp.instrument._patch import patch, restore
from swmp.tracing.span import current_span

_get_current = current_span.get
_BATCH_KWARGS = frozenset(("partition", "callback", "on_delivery"))
_TEXT = (bytes, str, type(None))
_patched: list[tuple[Any, str]] = []
# KafkaError._KEY_DESERIALIZATION / _VALUE_DESERIALIZATION (librdkafka's -160 / -159), by
# number: this module is imported before confluent_kafka is.
_DESERIALIZATION_ERRORS = frozenset((-160, -159))


class TracedHeaders(list):  # type: ignore[type-arg]
    """The ``sw8`` headers of a traced aio message, in its buffered dict (a type of its own:
    only these are produced one by one; headers an application puts into ``produce_batch``
    dicts are dropped by librdkafka, as without the agent)."""

    __slots__ = ()


class _Pending:
    """Headers waiting for the buffer of the producer whose traced ``produce`` is running."""

    __slots__ = ("buffer", "headers")

    def __init__(self, buffer: Any, headers: TracedHeaders | None) -> None:
        self.buffer = buffer
        self.headers = headers


_pending: ContextVar[_Pending | None] = ContextVar("swmp_confluent_aio", default=None)


def record(client: Any, msg: Any) -> None:
    """The entry span of one message a consumer returns (none for errors and timeouts)."""
    try:
        if msg is None or msg.error() is not None:
            return
        _consumed(client, msg)
    except Exception:
        _mq.warn_once("confluent.consume", "swmp: tracing a confluent-kafka message failed")


def record_delivered(client: Any, msg: Any) -> None:
    """Like :func:`record`, and also for a record that arrived but failed to deserialize
    (``DeserializingShareConsumer`` keeps it in the batch with a deserialization error)."""
    try:
        err = msg.error()
        if err is not None and err.code() not in _DESERIALIZATION_ERRORS:
            return
        _consumed(client, msg)
    except Exception:
        _mq.warn_once("confluent.consume", "swmp: tracing a confluent-kafka message failed")


def _consumed(client: Any, msg: Any) -> None:
    brokers = getattr(client, "_swmp_brokers", "")
    _mq.kafka_consumed(msg.topic() or "", getattr(client, "_swmp_group", ""), msg.headers(), brokers)


# -- producer ------------------------------------------------------------------------------
def _buffer_of(aio: Any) -> Any:
    """The batch buffer of an ``AIOProducer`` whose sync producer sends traced headers."""
    if not getattr(getattr(aio, "_producer", None), "_swmp_batch_headers", False):
        return None
    return getattr(aio, "_batch_processor", None)


async def _traced(orig: Any, aio: Any, topic: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    buffer = _buffer_of(aio)
    if buffer is None:
        return await orig(aio, topic, *args, **kwargs)
    brokers = getattr(aio._producer, "_swmp_brokers", "")
    span, headers = _mq.kafka_send_span(topic, brokers, None)
    if span is None:
        return await orig(aio, topic, *args, **kwargs)
    token = _pending.set(_Pending(buffer, TracedHeaders(headers)))
    try:
        with span:
            return await orig(aio, topic, *args, **kwargs)
    finally:
        _pending.reset(token)


def _make_produce(orig: Any) -> Any:
    async def produce(self: Any, topic: Any, *args: Any, **kwargs: Any) -> Any:
        # Nested (AsyncSerializingProducer -> AIOProducer.produce): the outer call traced it.
        if _get_current() is None or "headers" in kwargs or _pending.get() is not None:
            return await orig(self, topic, *args, **kwargs)
        return await _traced(orig, self, topic, args, kwargs)

    return produce


_SERIALIZING_BEFORE_HEADERS = 4  # key, value, partition, timestamp (after topic)


def _make_serializing_produce(orig: Any) -> Any:
    async def produce(self: Any, topic: Any, *args: Any, **kwargs: Any) -> Any:
        if (
            _get_current() is None
            or len(args) > _SERIALIZING_BEFORE_HEADERS
            or kwargs.get("headers") is not None
            or _pending.get() is not None
        ):
            return await orig(self, topic, *args, **kwargs)
        return await _traced(orig, self, topic, args, kwargs)

    return produce


def _make_add_message(orig: Any) -> Any:
    def add_message(self: Any, msg_data: Any, future: Any) -> Any:
        pending = _pending.get()
        if pending is not None and pending.buffer is self and pending.headers is not None:
            try:
                msg_data["headers"] = pending.headers
                pending.headers = None  # one message per traced produce
            except Exception:
                _mq.warn_once("confluent.aio.add", "swmp: tracing an aio confluent-kafka message failed")
        return orig(self, msg_data, future)

    return add_message


def carries_traced(messages: Any) -> bool:
    """Whether a ``produce_batch`` list holds a traced aio message."""
    if messages.__class__ is not list:
        return False
    return any(m.__class__ is dict and m.get("headers").__class__ is TracedHeaders for m in messages)


def _plain(m: Any) -> bool:
    """A message ``produce_batch`` would accept (it refuses the whole batch otherwise)."""
    return (
        m.__class__ is dict
        and m.get("timestamp") is None
        and isinstance(m.get("value"), _TEXT)
        and isinstance(m.get("key"), _TEXT)
        and isinstance(m.get("partition"), (int, type(None)))
    )


def produce_batch(
    producer: Any, topic: Any, messages: list[Any], args: Any, kwargs: Any, *, base: Any
) -> Any:
    """``produce_batch`` for a list holding traced aio messages: those one by one through
    ``base.produce`` (with their headers), runs of the others through ``base.produce_batch``,
    in order. The number queued, and ``_error`` on the dicts of messages that failed, as
    ``produce_batch`` reports them. Calls it would refuse as a whole go to it unchanged."""
    if args or not kwargs.keys() <= _BATCH_KWARGS or not all(map(_plain, messages)):
        return base.produce_batch(producer, topic, messages, *args, **kwargs)
    partition = kwargs.get("partition", -1)
    callback = kwargs.get("callback") or kwargs.get("on_delivery")
    run_kwargs = {"partition": partition}
    if callback is not None:
        run_kwargs["callback"] = callback
    good: int = 0
    run: list[Any] = []
    for m in messages:
        headers = m.get("headers")
        if headers.__class__ is not TracedHeaders:
            run.append(m)
            continue
        if run:
            good += base.produce_batch(producer, topic, run, **run_kwargs)
            run = []
        good += _produce_one(base, producer, topic, m, partition=partition, cb=m.get("callback") or callback)
    if run:
        good += base.produce_batch(producer, topic, run, **run_kwargs)
    return good


def _produce_one(base: Any, producer: Any, topic: Any, m: dict[str, Any], *, partition: int, cb: Any) -> int:
    from confluent_kafka import KafkaError, KafkaException  # noqa: PLC0415

    kw: dict[str, Any] = {"value": m.get("value"), "key": m.get("key"), "partition": partition}
    if cb is not None:
        kw["on_delivery"] = cb
    try:
        base.produce(producer, topic, headers=list(m["headers"]), **kw)
    except BufferError:
        # produce_batch reports a full queue per message, in the dict.
        m["_error"] = KafkaError(KafkaError._QUEUE_FULL)
        return 0
    except KafkaException as e:
        m["_error"] = e.args[0] if e.args else KafkaError(KafkaError._FAIL)
        return 0
    return 1


# -- consumer ------------------------------------------------------------------------------
def _make_consumer_init(orig: Any) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        try:
            self._consumer._swmp_aio = True  # its poll/consume record nothing: see _make_poll
        except Exception:
            _mq.warn_once("confluent.aio.init", "swmp: setting up an aio confluent-kafka consumer failed")

    return __init__


def _make_poll(orig: Any) -> Any:
    async def poll(self: Any, *args: Any, **kwargs: Any) -> Any:
        msg = await orig(self, *args, **kwargs)
        record(getattr(self, "_consumer", None), msg)
        return msg

    return poll


def _make_consume(orig: Any) -> Any:
    async def consume(self: Any, *args: Any, **kwargs: Any) -> Any:
        msgs = await orig(self, *args, **kwargs)
        consumer = getattr(self, "_consumer", None)
        try:
            for m in msgs:
                record(consumer, m)
        except Exception:
            _mq.warn_once("confluent.aio.consume", "swmp: tracing aio confluent-kafka messages failed")
        return msgs

    return consume


def install() -> None:
    """Patch ``confluent_kafka.aio`` (run by the post-import hook once it is imported)."""
    from confluent_kafka import aio  # noqa: PLC0415
    from confluent_kafka.aio.producer import _producer_batch_processor as batches  # noqa: PLC0415

    targets = [
        (batches.ProducerBatchManager, "add_message", _make_add_message),  # before produce
        (aio.AIOProducer, "produce", _make_produce),
        (aio.AIOConsumer, "__init__", _make_consumer_init),
        (aio.AIOConsumer, "poll", _make_poll),
        (aio.AIOConsumer, "consume", _make_consume),
    ]
    serializing = getattr(aio, "AsyncSerializingProducer", None)  # 2.16+
    if serializing is not None:
        targets.append((serializing, "produce", _make_serializing_produce))
    for owner, name, make in targets:
        patch(owner, name, make)
        _patched.append((owner, name))


def uninstall() -> None:
    for owner, name in _patched:
        restore(owner, name)
    _patched.clear()
