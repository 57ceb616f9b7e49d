"""aiormq (RabbitMQ over asyncio), and aio-pika, which publishes and consumes through it:
an exit span per ``Channel.basic_publish`` inside a trace (``sw8`` in the message's headers
table) and an entry span per delivered message.

Span shapes are those of the pika instrumentation (``swmp.instrument.pika``): operation
``RabbitMQ/Topic/<exchange>/Queue/<routing key>/Producer`` / ``.../Consumer``, components
52 / 53, ``mq.broker`` ``host:port`` of the connection URL, ``mq.topic`` the exchange,
``mq.queue`` the routing key.

* Publishing: the span covers ``basic_publish`` up to the broker's confirmation when the
  channel has publisher confirms (aio-pika's default), else up to the hand-over to the
  connection. The message gets a copy of the caller's properties with the headers added;
  the ``message_id`` aiormq writes on it (one it makes when there is none) is given to the
  caller's properties when the publish is over, as aiormq would have set it there.
* ``basic_consume`` callbacks (aio-pika's ``Queue.consume`` callbacks): aiormq runs each
  delivery's callback in a task of its own; the span is current for the whole callback,
  so what it awaits is traced under the message. aio-pika's ``Queue.iterator()`` is fed by
  such a callback: there the span records the arrival only, not the loop body.
* ``basic_get`` (aio-pika's ``Queue.get``): the span records the arrival and is finished
  before the message is returned.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from swmp.instrument import _mq
from swmp.instrument._gate import gated, named_like
from swmp.instrument._patch import patch, restore
from swmp.instrument._props_copy import attach_step, copy_back

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "aiormq"
PEER_NAMES = ("sw_aiormq",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "aiormq"
SUPPORTED = ("6.0", "8")
TRIGGER = "aiormq"


# The last connection URL's peer: a yarl URL is immutable, and an application publishes
# through one connection or a few, so the peer is usually the one made last time (its
# host and port read and joined once, not on every publish).
_last_peer: tuple[Any, str] = (None, "")


def _py_peer(channel: Any) -> str:
    global _last_peer
    try:
        url = channel.connection.url
        last_url, peer = _last_peer
        if url is last_url:
            return peer
        peer = f"{url.host}:{url.port}" if url.port else str(url.host)
        _last_peer = (url, peer)
        return peer
    except Exception:
        return ""


def _message_facts(channel: Any, message: Any) -> tuple[str, str, Any, str]:
    """``(exchange, routing key, headers table, peer)`` of a delivered message."""
    delivery = message.delivery
    exchange = getattr(delivery, "exchange", None) or ""
    routing_key = getattr(delivery, "routing_key", None) or ""
    headers = getattr(getattr(message.header, "properties", None), "headers", None)
    return exchange, routing_key, headers, _py_peer(channel)


def _py_message_consuming(channel: Any, message: Any) -> AbstractContextManager[Any]:
    return _mq.amqp_consuming(*_message_facts(channel, message))


# The same steps in C with the native core (swmp/_native/deliver.c): no frame of the agent's
# but the callback's own coroutine.
_message_consuming: Callable[[Any, Any], AbstractContextManager[Any]] = _py_message_consuming
_peer: Callable[[Any], str] = _py_peer  # (for a publish)
if _mq.native_consuming is not None:
    _peer = _mq.native_consuming.aiormq_peer
    _message_consuming = _mq.native_consuming.aiormq_consuming
# The publish without a coroutine of ours (swmp/_native/publish.c); None without the
# native core.
_AmqpPublish: Any = getattr(_mq.native_consuming, "AmqpPublish", None)
# The callback's wrapper without a coroutine of ours (swmp/_native/within.c): aiormq runs
# each delivery's callback in a task, and a Python wrapper's frame was resumed at every
# await of the callback. None without the native core.
_AwaitingCall: Any = getattr(_mq.native_consuming, "AwaitingCall", None)


def _py_on_message(channel: Any, callback: Any) -> Callable[[Any], Any]:
    async def on_message(message: Any) -> Any:
        try:
            consuming = _message_consuming(channel, message)
        except Exception:
            return await callback(message)
        with consuming:
            return await callback(message)

    return on_message


# What makes the native wrapper a coroutine function to ``inspect.iscoroutinefunction``
# (the duck typing it applies to Cython's compiled functions): aiormq hands a callback it
# does not take for one to a Python coroutine of its own, which is what this replaces.
_FUNCTION_LIKE = _py_on_message(None, None)


def _on_message(channel: Any, callback: Any) -> Callable[[Any], Any]:
    """The consumer callback aiormq is given: ``callback(message)`` awaited inside the
    delivered message's entry span, opened when aiormq's task starts it."""
    if _AwaitingCall is None:
        return _py_on_message(channel, callback)
    wrapped = _AwaitingCall(_message_consuming, channel, callback, callback)
    like = _FUNCTION_LIKE
    wrapped.__dict__.update(
        __code__=like.__code__,
        __name__=like.__name__,
        __qualname__=like.__qualname__,
        __defaults__=None,
        __kwdefaults__=None,
        __annotations__={},
    )
    return wrapped  # type: ignore[no-any-return]


def publish(orig: Any, with_headers: Callable[[Any, Any], Any]) -> Any:
    """The wrapper of ``Channel.basic_publish``: an exit span per publish inside a trace, the
    message given a copy of its properties with the trace's headers (``with_headers``, the
    attach step); outside a trace the original itself."""

    async def basic_publish(self: Any, body: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            return await orig(self, body, *args, **kwargs)
        span, traced = _mq.amqp_send_span(
            kwargs.get("exchange", ""),
            kwargs.get("routing_key", ""),
            _peer(self),
            with_headers,
            kwargs.get("properties"),
        )
        if span is None:
            return await orig(self, body, *args, **kwargs)
        with span:
            try:
                return await orig(self, body, *args, **{**kwargs, "properties": traced})
            finally:
                # aiormq writes the message_id it makes on the properties it is given: the
                # copy; the caller's object ends up as it would without the agent.
                copy_back(kwargs.get("properties"), traced)

    # With the native core the same steps in C, the span opened when the publish is awaited.
    named_like(basic_publish, orig)  # the fallback's binding errors name aiormq's (see there)
    native = basic_publish if _AmqpPublish is None else _AmqpPublish(orig, basic_publish, with_headers, _peer)
    return gated(orig, native)


def install(config: Config) -> None:
    from aiormq import Channel  # noqa: PLC0415
    from pamqp.commands import Basic  # noqa: PLC0415

    # A copy of the caller's properties with the trace's headers; aiormq's own default
    # (``delivery_mode=1``) when there are none.
    with_headers = attach_step(functools.partial(Basic.Properties, delivery_mode=1))

    from aiormq.tools import awaitable  # noqa: PLC0415

    def make_consume(orig: Any) -> Any:
        async def basic_consume(
            self: Any, queue: Any, consumer_callback: Any, *args: Any, **kwargs: Any
        ) -> Any:
            # aiormq takes a plain function too (its ``awaitable`` makes it one to await); our
            # wrapper awaits the callback, and looks like a coroutine function to aiormq, so it
            # is given the callback as aiormq would have made it.
            wrapped = (
                _on_message(self, awaitable(consumer_callback))
                if callable(consumer_callback)
                else consumer_callback
            )
            return await orig(self, queue, wrapped, *args, **kwargs)

        return basic_consume

    def make_get(orig: Any) -> Any:
        async def basic_get(self: Any, *args: Any, **kwargs: Any) -> Any:
            message = await orig(self, *args, **kwargs)
            try:
                if isinstance(getattr(message, "delivery", None), Basic.GetOk):
                    _mq.amqp_consumed(*_message_facts(self, message))
            except Exception:
                _mq.warn_once("aiormq.get", "swmp: tracing an aiormq basic_get failed")
            return message

        return basic_get

    patch(Channel, "basic_publish", lambda orig: publish(orig, with_headers))
    patch(Channel, "basic_consume", make_consume)
    patch(Channel, "basic_get", make_get)


def uninstall() -> None:
    from aiormq import Channel  # noqa: PLC0415

    restore(Channel, "basic_publish")
    restore(Channel, "basic_consume")
    restore(Channel, "basic_get")
