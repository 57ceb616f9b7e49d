"""pika (RabbitMQ), blocking and asynchronous connections: an exit span per
``basic_publish`` inside a trace (``sw8`` in the message's headers table) and an entry span
per delivered message.

Operation names, as the SkyWalking Python agent's RabbitMQ plugin names them:
``RabbitMQ/Topic/<exchange>/Queue/<routing key>/Producer`` and ``.../Consumer``; components
rabbitmq-producer (52) / rabbitmq-consumer (53), layer MQ, peer and ``mq.broker``
``host:port``, ``mq.topic`` the exchange, ``mq.queue`` the routing key.

Where each span lives:

* Publishing: ``pika.channel.Channel.basic_publish``, which ``BlockingChannel.basic_publish``
  calls too (one span either way). The message gets a copy of the caller's properties with
  the ``sw8`` headers added; the caller's ``BasicProperties`` object is never modified.
* Asynchronous connections (``SelectConnection``, asyncio, Tornado adapters): the span is
  current while the ``basic_consume`` callback (or the ``basic_get`` callback) runs, so what
  it calls is traced under the message.
* The Twisted adapter hands messages over through Deferreds (``basic_get``) and a queue
  (``basic_consume``): the span records the message's arrival; the ``inlineCallbacks`` code
  that receives it runs in its own context, outside the span.
* ``BlockingChannel.basic_consume``: the span is current while the callback runs
  (``start_consuming`` / ``process_data_events`` dispatch it).
* ``BlockingChannel.consume()`` (the generator) and ``BlockingChannel.basic_get``: the span
  records the message's arrival and is finished before the message is handed over.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from swmp.instrument import _mq
from swmp.instrument._gate import gated
from swmp.instrument._patch import patch, restore
from swmp.instrument._props_copy import attach_step

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "pika"
PEER_NAMES = ("sw_rabbitmq",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "pika"
SUPPORTED = ("1.0", "2")
TRIGGER = "pika"

_MARK = "__swmp_consumer__"  # on the callbacks this module wrapped (their span is ours)


def _py_peer(channel: Any) -> str:
    try:
        p = channel.connection.params
        return f"{p.host}:{p.port}"
    except Exception:
        return ""


def _impl(channel: Any) -> Any:
    return getattr(channel, "_impl", channel)


def _py_consuming(channel: Any, method: Any, properties: Any) -> AbstractContextManager[Any]:
    exchange = getattr(method, "exchange", None) or ""
    routing_key = getattr(method, "routing_key", None) or ""
    headers = getattr(properties, "headers", None)
    return _mq.amqp_consuming(exchange, routing_key, headers, _py_peer(channel))


def _py_traced_callback(callback: Any, via_impl: bool = True) -> Any:
    """``callback(channel, method, properties, body)`` inside the message's entry span, its
    facts read from the channel's implementation (a BlockingChannel's) or the channel."""

    def on_message(channel: Any, method: Any, properties: Any, body: Any) -> Any:
        with _consuming(_impl(channel) if via_impl else channel, method, properties):
            return callback(channel, method, properties, body)

    setattr(on_message, _MARK, True)
    return on_message


# The same steps in C with the native core (swmp/_native/deliver.c): a delivery then runs
# none of the agent's Python frames.
_consuming: Callable[[Any, Any, Any], AbstractContextManager[Any]] = _py_consuming
_traced_callback: Callable[[Any, bool], Any] = _py_traced_callback
_peer: Callable[[Any], str] = _py_peer  # (for a publish; its memo saves pika's two properties)
if _mq.native_consuming is not None:
    _peer = _mq.native_consuming.pika_peer
    _consuming = _mq.native_consuming.pika_consuming
    _traced_callback = _mq.native_consuming.pika_callback


def install(config: Config) -> None:
    from pika import BasicProperties  # noqa: PLC0415
    from pika.adapters.blocking_connection import BlockingChannel  # noqa: PLC0415
    from pika.channel import Channel  # noqa: PLC0415

    def make_publish(orig: Any) -> Any:
        def basic_publish(  # noqa: PLR0917 (the library's own signature)
            self: Any,
            exchange: Any,
            routing_key: Any,
            body: Any,
            properties: Any = None,
            mandatory: Any = False,
        ) -> Any:
            span, traced = _mq.amqp_send_span(exchange, routing_key, _peer(self), _with_headers, properties)
            if span is None:
                return orig(self, exchange, routing_key, body, properties, mandatory)
            with span:
                return orig(self, exchange, routing_key, body, traced, mandatory)

        return gated(orig, basic_publish)  # outside a trace: the original itself

    # A copy of the caller's properties (or new ones) with the trace's headers.
    _with_headers = attach_step(BasicProperties)

    def traced_at_dispatch(on_message_callback: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether a callback handed to ``Channel.basic_consume`` is a BlockingChannel's hand-
        over of a consumer whose own callback we wrapped (its span is made when the
        BlockingChannel dispatches the message, not here)."""
        owner = getattr(on_message_callback, "__self__", None)
        if not isinstance(owner, BlockingChannel):
            return False
        tag = kwargs["consumer_tag"] if "consumer_tag" in kwargs else args[2] if len(args) > 2 else None
        info = owner._consumer_infos.get(tag)
        return info is not None and getattr(info.on_message_callback, _MARK, False)

    def make_consume(orig: Any) -> Any:
        # The consumer's callback wrapped once, when it is registered: pika's _on_deliver
        # then calls our wrapper for each message (no frame of ours per message before it).
        def basic_consume(self: Any, queue: Any, on_message_callback: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                if callable(on_message_callback) and not traced_at_dispatch(
                    on_message_callback, args, kwargs
                ):
                    on_message_callback = _traced_callback(on_message_callback, False)
            except Exception:
                _mq.warn_once("pika.consume", "swmp: tracing a pika consumer failed")
            return orig(self, queue, on_message_callback, *args, **kwargs)

        return basic_consume

    def make_on_getok(orig: Any) -> Any:
        def _on_getok(self: Any, method_frame: Any, header_frame: Any, body: Any) -> Any:
            with _consuming(self, method_frame.method, header_frame.properties):
                return orig(self, method_frame, header_frame, body)

        return _on_getok

    def make_blocking_consume(orig: Any) -> Any:
        def basic_consume(self: Any, queue: Any, on_message_callback: Any, *args: Any, **kwargs: Any) -> Any:
            if callable(on_message_callback):
                on_message_callback = _traced_callback(on_message_callback, True)
            return orig(self, queue, on_message_callback, *args, **kwargs)

        return basic_consume

    patch(Channel, "basic_publish", make_publish)
    patch(Channel, "basic_consume", make_consume)
    patch(Channel, "_on_getok", make_on_getok)
    patch(BlockingChannel, "basic_consume", make_blocking_consume)


def uninstall() -> None:
    from pika.adapters.blocking_connection import BlockingChannel  # noqa: PLC0415
    from pika.channel import Channel  # noqa: PLC0415

    restore(Channel, "basic_publish")
    restore(Channel, "basic_consume")
    restore(Channel, "_on_getok")
    restore(BlockingChannel, "basic_consume")
