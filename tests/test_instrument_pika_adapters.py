"""pika's asyncio, Tornado and Twisted connection adapters (``AsyncioConnection``,
``TornadoConnection`` on Tornado's asyncio-backed IOLoop, ``TwistedProtocolConnection`` on
Twisted's reactor) against the real RabbitMQ: publishing from a traced coroutine gives the
exit span and the ``sw8`` header, each message taken is an entry span continuing the
publisher's trace (with the asyncio and Tornado adapters, the ``basic_consume`` and
``basic_get`` callbacks run inside it). ``SelectConnection`` is tested in
``tests/test_instrument_mq.py``."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pika
import pytest
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.adapters.tornado_connection import TornadoConnection
from tornado.ioloop import IOLoop

from reporter_proc import records as R
from swmp import _sink
from swmp.tracing import Component, Kind
from swmp.tracing.constants import Layer
from swmp.tracing.context import active_span, new_entry_span, new_local_span
from tests.brokers import RabbitMQBroker
from tests.servers import REPO_ROOT
from tests.test_instrument_mq import _declare, _peer, assert_continues, sink, spans_of, tags

__all__ = ["sink"]  # the fixture, shared with the other MQ tests


async def _open(url: str, adapter: str) -> tuple[Any, Any]:
    """A connection of the given adapter on the running loop and a channel, once both are open."""
    loop = asyncio.get_running_loop()
    opened: asyncio.Future[Any] = loop.create_future()

    def failed(_conn: Any, err: Any) -> None:
        if not opened.done():
            opened.set_exception(ConnectionError(str(err)))

    cls, ioloop = (AsyncioConnection, loop) if adapter == "asyncio" else (TornadoConnection, IOLoop.current())
    conn = cls(
        pika.URLParameters(url),
        on_open_callback=lambda c: c.channel(on_open_callback=opened.set_result),
        on_open_error_callback=failed,
        custom_ioloop=ioloop,
    )
    return conn, await asyncio.wait_for(opened, 30)


async def _close(conn: Any) -> None:
    if conn.is_closed:
        return
    closed = asyncio.get_running_loop().create_future()
    conn.add_on_close_callback(lambda _c, _reason: closed.done() or closed.set_result(None))
    conn.close()
    await asyncio.wait_for(closed, 30)


def _seen_in_callback(seen: list[dict[str, Any]], properties: Any, body: bytes) -> None:
    span = active_span()
    seen.append(
        {
            "body": body,
            "headers": dict(properties.headers or {}),
            "op": span.op if span is not None else None,
        }
    )
    with new_local_span("handle"):  # work done by the callback is inside the message's trace
        pass


@pytest.mark.parametrize("adapter", ["asyncio", "tornado"])
def test_connection_adapter_publish_consume_and_get(
    sink: _sink.MemorySink, rabbitmq: RabbitMQBroker, adapter: str
) -> None:
    queue = _declare(rabbitmq.url)
    props = pika.BasicProperties(headers={"app": "kept"}, content_type="text/plain")
    consumed: list[dict[str, Any]] = []
    got: list[dict[str, Any]] = []

    async def main() -> None:
        conn, ch = await _open(rabbitmq.url, adapter)
        try:
            loop = asyncio.get_running_loop()
            with new_entry_span("/orders"):  # a traced coroutine publishing
                assert ch.basic_publish("", queue, b"m1", props) is None
                ch.basic_publish("", queue, b"m2")
            ch.basic_publish("", queue, b"m3")  # outside the trace
            assert props.headers == {"app": "kept"}  # the caller's properties are not modified

            fetched = loop.create_future()

            def on_get(channel: Any, method: Any, properties: Any, body: bytes) -> None:
                _seen_in_callback(got, properties, body)
                fetched.set_result(None)

            ch.basic_get(queue, on_get, auto_ack=True)
            await asyncio.wait_for(fetched, 30)

            done = loop.create_future()

            def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
                _seen_in_callback(consumed, properties, body)
                channel.basic_ack(method.delivery_tag)
                if len(consumed) == 2:
                    done.set_result(None)

            ch.basic_consume(queue, on_message)
            await asyncio.wait_for(done, 30)
        finally:
            await _close(conn)

    asyncio.run(main())

    peer = _peer(rabbitmq)
    op = f"RabbitMQ/Topic//Queue/{queue}"
    assert [s["body"] for s in got + consumed] == [b"m1", b"m2", b"m3"]
    assert [s["op"] for s in got + consumed] == [f"{op}/Consumer"] * 3  # current in the callbacks
    assert got[0]["headers"]["app"] == "kept"
    assert "sw8" in consumed[0]["headers"] and "sw8" not in consumed[1]["headers"]

    producers = spans_of(sink, Kind.EXIT, Component.RABBITMQ_PRODUCER)
    assert len(producers) == 2
    for _seg, span in producers:
        assert span[R.SPAN_OPERATION] == f"{op}/Producer"
        assert span[R.SPAN_LAYER] == Layer.MQ
        assert span[R.SPAN_PEER] == peer
        assert tags(span) == {"mq.broker": peer, "mq.topic": "", "mq.queue": queue}
        assert not span[R.SPAN_IS_ERROR]

    consumers = spans_of(sink, Kind.ENTRY, Component.RABBITMQ_CONSUMER)
    assert len(consumers) == 3
    for cseg, cspan in consumers:
        assert cspan[R.SPAN_OPERATION] == f"{op}/Consumer"
        assert tags(cspan) == {"mq.broker": peer, "mq.topic": "", "mq.queue": queue}
        assert [s[R.SPAN_OPERATION] for s in cseg[R.SEG_SPANS]] == ["handle", f"{op}/Consumer"]
    # Segments are reported as they finish: the basic_get one first, then m2, then m3.
    assert_continues(producers[0], consumers[0], got[0]["headers"]["sw8"])
    assert_continues(producers[1], consumers[1], consumed[0]["headers"]["sw8"])
    assert consumers[2][1][R.SPAN_REFS] == []  # published outside a trace: a new trace


def test_twisted_adapter_publish_get_and_consume(rabbitmq: RabbitMQBroker, tmp_path: Path) -> None:
    """pika's ``TwistedProtocolConnection`` on Twisted's reactor (in a process of its own,
    tests/e2e_apps/pika_twisted.py): publishing inside a trace gives the exit span and the
    ``sw8`` header; each message taken by ``basic_get`` or from ``basic_consume``'s queue
    is an entry span continuing the publisher's trace, recorded when the message arrives.
    Code resumed by the message's Deferred runs in its own ``inlineCallbacks`` context, not
    inside that span (Twisted runs each such generator in the context it started in)."""
    queue = _declare(rabbitmq.url)
    out = tmp_path / "twisted.json"
    run = subprocess.run(
        [sys.executable, "-m", "tests.e2e_apps.pika_twisted", rabbitmq.url, queue, str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(out.read_text())
    sink = _sink.MemorySink()
    sink.records = [(t, base64.b64decode(p)) for t, p in seen["records"]]
    got, consumed = seen["get"], seen["consume"]
    peer = _peer(rabbitmq)
    op = f"RabbitMQ/Topic//Queue/{queue}"
    assert [s["body"] for s in got + consumed] == ["m1", "m2", "m3"]
    assert seen["kept"] and got[0]["headers"]["app"] == "kept"  # the caller's properties untouched
    assert "sw8" in consumed[0]["headers"] and "sw8" not in consumed[1]["headers"]
    assert [s["op"] for s in got + consumed] == [None] * 3  # the generator's own context

    producers = spans_of(sink, Kind.EXIT, Component.RABBITMQ_PRODUCER)
    assert len(producers) == 2
    for _seg, span in producers:
        assert span[R.SPAN_OPERATION] == f"{op}/Producer" and span[R.SPAN_PEER] == peer
        assert tags(span) == {"mq.broker": peer, "mq.topic": "", "mq.queue": queue}
    consumers = spans_of(sink, Kind.ENTRY, Component.RABBITMQ_CONSUMER)
    assert len(consumers) == 3
    for cseg, cspan in consumers:
        assert cspan[R.SPAN_OPERATION] == f"{op}/Consumer" and cspan[R.SPAN_LAYER] == Layer.MQ
        assert tags(cspan) == {"mq.broker": peer, "mq.topic": "", "mq.queue": queue}
        assert [s[R.SPAN_OPERATION] for s in cseg[R.SEG_SPANS]] == [f"{op}/Consumer"]
    assert_continues(producers[0], consumers[0], got[0]["headers"]["sw8"])
    assert_continues(producers[1], consumers[1], consumed[0]["headers"]["sw8"])
    assert consumers[2][1][R.SPAN_REFS] == []  # published outside a trace: a new trace
