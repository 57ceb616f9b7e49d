"""What the message-queue instrumentations share: producer exit spans, consumer entry spans.

Producers: a message sent inside a trace gets an exit span (layer MQ) and carries the
``sw8`` headers; a message sent outside any trace is passed through after one check
(``current_span.get() is None``), with no span and no header. The producer library's call
runs exactly as without the agent: same arguments (headers are a new list or dict, the
caller's object is never modified), same return value, same exceptions.

Consumers: every consumed message gets an entry span of its own, in a segment of its own,
whatever span happens to be current where the message is received (a consumer loop inside
a web request still reports the message's own trace). With an ``sw8`` header the segment
continues the producer's trace (a CrossProcess ref to the producer's exit span); without
one it starts a new trace (subject to sampling). Where the library hands the message to a
callback, the span is current while the callback runs, so what the callback calls is
traced under it; where the library returns messages (``poll``, iteration), the span
records the delivery and is finished before the message is returned.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from swmp.propagation import SW8, SW8_CORRELATION, SW8_X, decode_sw8, from_headers
from swmp.tracing import context as _ctx
from swmp.tracing.constants import TAG_MQ_BROKER, TAG_MQ_QUEUE, TAG_MQ_TOPIC, Component, Layer
from swmp.tracing.limits import limits
from swmp.tracing.span import Span, current_span, native_core

log = logging.getLogger("swmp.instrument")

# The headers the agent owns: dropped from a caller's headers before ours are added, so a
# forwarded message never carries two (possibly conflicting) sw8 values.
OWN_HEADERS = frozenset((SW8, SW8_CORRELATION, SW8_X))

T = TypeVar("T")
A = TypeVar("A")
_get_current = current_span.get
_set_current = current_span.set
# context.new_entry_span's two steps, called here directly (one Python frame less per
# consumed message): the native common case, else the Python decision.
_entry_root = _ctx.entry_root
_decide_entry = _ctx.decide_entry_span
_MQ = Layer.MQ
_KAFKA_CONSUMER = Component.KAFKA_CONSUMER
_RABBITMQ_CONSUMER = Component.RABBITMQ_CONSUMER
_warned: set[str] = set()


def warn_once(key: str, msg: str, *args: Any) -> None:
    """Log an instrumentation's own failure once per kind; the application carries on."""
    if key not in _warned:
        _warned.add(key)
        log.warning(msg, *args, exc_info=True)


def exit_span(op: str, peer: str, component: int) -> Span | None:
    """An open (not yet current) exit span for a send inside a trace, else None.

    Callers check ``current_span.get() is None`` first: that is the whole cost of a send
    outside a trace.
    """
    span = _ctx.new_exit_span(op, peer, component, Layer.MQ)
    return span if isinstance(span, Span) else None


def producer_span(  # noqa: PLR0917 (the message's facts, in a fixed order)
    op: str,
    broker: str,
    component: int,
    topic: str,
    queue: str | None,
    attach: Callable[[Span, A], T],
    arg: A,
) -> tuple[Span | None, T | None]:
    """The exit span of a send inside a trace, tagged, and ``attach(span, arg)`` (the
    message's new headers); ``(None, None)`` when nothing is to be recorded or anything failed
    (then no span is left open: the send goes out untraced).
    """
    span = None
    try:
        span = exit_span(op, broker, component)
        if span is None:
            return None, None
        tag_mq(span, broker, topic, queue)
        return span, attach(span, arg)
    except Exception:
        warn_once(f"produce:{component}", "swmp: tracing a message send failed")
        if span is not None:
            span.finish()
        return None, None


def tag_mq(span: Span, broker: str, topic: str, queue: str | None = None) -> None:
    """``mq.broker``, ``mq.topic`` and (RabbitMQ) ``mq.queue``, set as one list when the span
    has no tags yet and the values need no clipping (the common case), else one by one."""
    lim = limits.tag_value_max
    if (
        not span.tags
        and broker.__class__ is str
        and topic.__class__ is str
        and len(broker) <= lim
        and len(topic) <= lim
    ):
        if queue is None:
            span.tags = [TAG_MQ_BROKER, broker, TAG_MQ_TOPIC, topic]
            return
        if queue.__class__ is str and len(queue) <= lim:
            span.tags = [TAG_MQ_BROKER, broker, TAG_MQ_TOPIC, topic, TAG_MQ_QUEUE, queue]
            return
    span.tag(TAG_MQ_BROKER, broker)
    span.tag(TAG_MQ_TOPIC, topic)
    if queue is not None:
        span.tag(TAG_MQ_QUEUE, queue)


def _py_kafka_headers(span: Span, headers: Iterable[tuple[str, Any]] | None) -> list[tuple[str, bytes]]:
    """A new Kafka header list: the caller's headers (minus old sw8 ones) plus this span's."""
    out = [h for h in headers if h[0] not in OWN_HEADERS] if headers else []
    for k, v in span.inject().items():
        out.append((k, v.encode("ascii")))
    return out


def _py_amqp_headers(span: Span, headers: dict[str, Any] | None) -> dict[str, Any]:
    """A new AMQP headers table: the caller's entries (minus old sw8 ones) plus this span's."""
    out = {k: v for k, v in headers.items() if k not in OWN_HEADERS} if headers else {}
    out.update(span.inject())
    return out


def _text(v: Any) -> Any:
    return v.decode("ascii", "replace") if isinstance(v, (bytes, bytearray)) else v


def _carrier(sw8: Any, correlation: Any, sw8x: Any) -> Any:
    """The producer's context from the values of its three headers (``sw8`` not None)."""
    if correlation is None and sw8x is None:
        # decode_sw8 takes bytes itself: non-ASCII is invalid either way.
        return decode_sw8(sw8)
    return from_headers(
        _text(sw8),
        _text(correlation),
        _text(sw8x),
        limits.correlation_max_elements,
        limits.correlation_max_value_length,
    )


def carrier_from(lookup: Callable[[str], Any]) -> Any:
    """The producer's context from a message's headers (``lookup(name)`` -> value or None)."""
    sw8 = lookup(SW8)
    if sw8 is None:
        return None
    correlation = lookup(SW8_CORRELATION)
    sw8x = lookup(SW8_X)
    if correlation is None and sw8x is None:
        return decode_sw8(sw8)  # _carrier's common case, inlined: once per consumed message
    return _carrier(sw8, correlation, sw8x)


def pairs_carrier(headers: Iterable[tuple[str, Any]] | None) -> Any:
    """:func:`carrier_from` over Kafka-style ``(name, value)`` pairs (the last of a name wins,
    as a map would); one pass, and nothing decoded without ``sw8``."""
    if not headers:
        return None
    sw8 = correlation = sw8x = None
    for h in headers:
        name = h[0]
        if name == SW8:
            sw8 = h[1]
        elif name in OWN_HEADERS:
            if name == SW8_CORRELATION:
                correlation = h[1]
            else:
                sw8x = h[1]
    if sw8 is None:
        return None
    if correlation is None and sw8x is None:
        return decode_sw8(sw8)  # _carrier's common case, inlined
    return _carrier(sw8, correlation, sw8x)


def delivered(  # noqa: PLR0917 (the message's facts, in a fixed order)
    op: str, carrier: Any, component: int, broker: str, topic: str, queue: str | None = None
) -> None:
    """Record the delivery of one message that the library returns to its caller, given its
    decoded headers (``carrier``, None without ``sw8``)."""
    token = span = None
    try:
        if _get_current() is not None:  # a consumer loop inside a trace: not the parent
            token = _set_current(None)
        span = _entry_root(op, component, _MQ, carrier) or _decide_entry(op, carrier, component, _MQ)
        if span.__class__ is Span or isinstance(span, Span):
            lim = limits.tag_value_max
            if (  # tag_mq's common case, inlined (a new span has no tags)
                queue is None
                and broker.__class__ is str
                and topic.__class__ is str
                and len(broker) <= lim
                and len(topic) <= lim
            ):
                span.tags = [TAG_MQ_BROKER, broker, TAG_MQ_TOPIC, topic]
            else:
                tag_mq(span, broker, topic, queue)
            span.finish()
    except Exception:
        warn_once(f"consume:{component}", "swmp: recording a consumed message failed")
        if isinstance(span, Span) and not span.end:  # made, not finished: it counts as open
            with contextlib.suppress(Exception):
                span.finish()
    finally:
        if token is not None:
            current_span.reset(token)


class Consuming:
    """``with Consuming(...)``: the entry span of one message, current while its callback runs.

    Set up never raises into the application; the callback's exception marks the span as an
    error and propagates unchanged. The context is given back as it was: when no span was
    current before, it is cleared again (cheaper than a token; the same for the caller).
    """

    __slots__ = ("_span", "_token")

    def __init__(  # noqa: PLR0917
        self, op: str, component: int, broker: str, topic: str, queue: str | None, table: Any
    ) -> None:
        self._token = _set_current(None) if _get_current() is not None else None
        self._span: Span | None = None
        span = None
        try:
            carrier = table_carrier(table)
            span = _entry_root(op, component, _MQ, carrier) or _decide_entry(op, carrier, component, _MQ)
            if span.__class__ is Span or isinstance(span, Span):
                tag_mq(span, broker, topic, queue)
                span.__enter__()
                self._span = span
        except Exception:
            warn_once(f"consuming:{component}", "swmp: tracing a consumed message failed")
            if self._span is None and isinstance(span, Span):  # made, not entered: it counts as open
                with contextlib.suppress(Exception):
                    span.finish()

    def __enter__(self) -> Consuming:
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        span = self._span
        try:
            if span is not None:
                span.__exit__(et, ev, tb)
        finally:
            token = self._token
            if token is not None:
                current_span.reset(token)
            elif _get_current() is not None:
                _set_current(None)


# -- the names and shapes per broker kind (as the SkyWalking Python agent names them) -------
def _py_kafka_send_span(
    topic: Any, brokers: str, headers: Any, merge: Callable[[Span, Any], Any] | None = None
) -> tuple[Span | None, Any]:
    """A Kafka producer's exit span and the record's new headers (``merge(span, headers)``,
    by default the caller's headers without sw8 ones plus the span's)."""
    return producer_span(
        f"Kafka/{topic}/Producer",
        brokers,
        Component.KAFKA_PRODUCER,
        str(topic),
        None,
        merge or _py_kafka_headers,
        headers,
    )


def _py_kafka_consumed(topic: str, group: str, headers: Any, brokers: str) -> None:
    """One consumed Kafka record (headers: ``(name, value)`` pairs or None)."""
    try:
        carrier = pairs_carrier(headers) if headers else None
    except Exception:
        warn_once(f"consume:{_KAFKA_CONSUMER}", "swmp: recording a consumed message failed")
        return
    delivered(f"Kafka/{topic}/Consumer/{group}", carrier, _KAFKA_CONSUMER, brokers, topic)


def _py_amqp_send_span(
    exchange: Any, routing_key: Any, peer: str, attach: Callable[[Span, A], T], arg: A
) -> tuple[Span | None, T | None]:
    """A RabbitMQ publisher's exit span and ``attach(span, arg)`` (the message's new
    properties)."""
    return producer_span(
        f"RabbitMQ/Topic/{exchange}/Queue/{routing_key}/Producer",
        peer,
        Component.RABBITMQ_PRODUCER,
        str(exchange),
        str(routing_key),
        attach,
        arg,
    )


def _py_amqp_consuming(exchange: str, routing_key: str, headers: Any, peer: str) -> Consuming:
    """The entry span of one delivered RabbitMQ message (its headers table or None), current
    inside ``with``."""
    return Consuming(
        f"RabbitMQ/Topic/{exchange}/Queue/{routing_key}/Consumer",
        _RABBITMQ_CONSUMER,
        peer,
        exchange,
        routing_key,
        headers,
    )


def amqp_consumed(exchange: str, routing_key: str, headers: Any, peer: str) -> None:
    """One RabbitMQ message handed to the caller (``basic_get``): its delivery is recorded."""
    try:
        carrier = table_carrier(headers)
    except Exception:
        warn_once(f"consume:{_RABBITMQ_CONSUMER}", "swmp: recording a consumed message failed")
        return
    delivered(
        f"RabbitMQ/Topic/{exchange}/Queue/{routing_key}/Consumer",
        carrier,
        _RABBITMQ_CONSUMER,
        peer,
        exchange,
        routing_key,
    )


def table_carrier(headers: Any) -> Any:
    """The producer's context from an AMQP headers table (a dict; anything else has none)."""
    if headers.__class__ is not dict and not isinstance(headers, dict):
        return None
    get = headers.get
    sw8 = get(SW8)
    if sw8 is None:
        return None
    correlation = get(SW8_CORRELATION)
    sw8x = get(SW8_X)
    if correlation is None and sw8x is None:
        return decode_sw8(sw8)  # _carrier's common case, inlined: once per consumed message
    return _carrier(sw8, correlation, sw8x)


def _send_failed(component: int, span: Span | None) -> None:
    """The native producer steps' ``except Exception`` (called while it is handled): as
    :func:`producer_span`'s."""
    warn_once(f"produce:{component}", "swmp: tracing a message send failed")
    if span is not None:
        span.finish()


# The producer steps: in C with the native core (swmp/_native/mq.c; the common cases, the
# Python forms above for the rest), else the Python forms.
kafka_send_span: Callable[..., tuple[Span | None, Any]] = _py_kafka_send_span
amqp_send_span: Callable[..., tuple[Span | None, Any]] = _py_amqp_send_span
kafka_headers: Callable[[Span, Any], list[tuple[str, bytes]]] = _py_kafka_headers
amqp_headers: Callable[[Span, Any], dict[str, Any]] = _py_amqp_headers
if hasattr(native_core, "setup_mq"):
    native_core.setup_mq(
        Span,
        _py_kafka_send_span,
        _py_amqp_send_span,
        _py_kafka_headers,
        _py_amqp_headers,
        tag_mq,
        _send_failed,
        limits,
        Layer.MQ,
        TAG_MQ_BROKER,
        TAG_MQ_TOPIC,
        TAG_MQ_QUEUE,
        OWN_HEADERS,
        Component.KAFKA_PRODUCER,
        Component.RABBITMQ_PRODUCER,
    )
    kafka_send_span = native_core.kafka_send_span
    amqp_send_span = native_core.amqp_send_span
    kafka_headers = native_core.kafka_headers
    amqp_headers = native_core.amqp_headers


def _consuming_failed() -> None:
    """The native consumed-message entry's ``except Exception`` (called while it is
    handled): as :class:`Consuming`'s."""
    warn_once(f"consuming:{_RABBITMQ_CONSUMER}", "swmp: tracing a consumed message failed")


def _delivery_failed() -> None:
    """The native Kafka delivery's ``except Exception``: as :func:`delivered`'s."""
    warn_once(f"consume:{_KAFKA_CONSUMER}", "swmp: recording a consumed message failed")


# A delivered RabbitMQ message's entry span around its callback and a Kafka record's
# delivery: in C with the native core (swmp/_native/consume.c; the common cases, the Python
# forms for the rest).
amqp_consuming: Callable[[Any, Any, Any, Any], AbstractContextManager[Any]] = _py_amqp_consuming
kafka_consumed: Callable[[Any, Any, Any, Any], None] = _py_kafka_consumed
# The native core once its consumed-message entry is set up (for the clients' own steps
# around it, swmp/_native/deliver.c), else None.
native_consuming: Any = None
if hasattr(native_core, "setup_consume"):
    native_core.setup_consume(
        Span,
        _py_amqp_consuming,
        table_carrier,
        decode_sw8,
        _decide_entry,
        current_span,
        _consuming_failed,
        Layer.MQ,
        _RABBITMQ_CONSUMER,
        SW8,
        SW8_CORRELATION,
        SW8_X,
    )
    amqp_consuming = native_core.amqp_consuming
    native_core.setup_kafka_consumed(_py_kafka_consumed, _delivery_failed, _KAFKA_CONSUMER)
    kafka_consumed = native_core.kafka_consumed
    native_consuming = native_core
