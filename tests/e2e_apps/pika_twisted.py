"""pika's Twisted adapter (``TwistedProtocolConnection``) on Twisted's default reactor, with
the pika instrumentation and an in-memory sink: publishes three messages (two inside an
entry span), takes one back with ``basic_get`` and two through ``basic_consume``'s queue,
then writes what it saw and the records the agent made to a JSON file.

Run by tests/test_instrument_pika_adapters.py in a process of its own: a Twisted reactor is
installed once per process and cannot be restarted.

    python -m tests.e2e_apps.pika_twisted AMQP_URL QUEUE OUT_JSON
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pika
from pika.adapters.twisted_connection import TwistedProtocolConnection
from twisted.internet import defer, protocol, task

from swmp import _sink, instrument, tracing
from swmp.config import load
from swmp.tracing.context import active_span, new_entry_span, new_local_span


def _seen(properties: Any, body: bytes) -> dict[str, Any]:
    span = active_span()
    with new_local_span("handle"):  # work done where the message is handled
        pass
    headers = properties.headers or {}
    return {
        "body": body.decode(),
        "headers": {k: v.decode() if isinstance(v, bytes) else v for k, v in headers.items()},
        "op": span.op if span is not None else None,
    }


@defer.inlineCallbacks
def exchange(
    reactor: Any, url: str, queue: str, out: Path, sink: _sink.MemorySink
) -> Generator[Any, Any, None]:
    params = pika.URLParameters(url)
    creator = protocol.ClientCreator(reactor, TwistedProtocolConnection, params)
    conn = yield creator.connectTCP(params.host, params.port)
    yield conn.ready
    ch = yield conn.channel()
    props = pika.BasicProperties(headers={"app": "kept"}, content_type="text/plain")
    with new_entry_span("/orders"):  # the application publishing inside a trace
        ch.basic_publish("", queue, b"m1", props)
        ch.basic_publish("", queue, b"m2")
    yield ch.basic_publish("", queue, b"m3")  # outside the trace
    got = yield ch.basic_get(queue, auto_ack=True)
    seen = {"get": [_seen(got.properties, got.body)], "consume": [], "kept": props.headers == {"app": "kept"}}
    queue_object, _tag = yield ch.basic_consume(queue)
    for _ in range(2):
        msg = yield queue_object.get()
        seen["consume"].append(_seen(msg.properties, msg.body))
        msg.channel.basic_ack(msg.method.delivery_tag)
    yield conn.close()
    seen["records"] = [[t, base64.b64encode(p).decode()] for t, p in sink.records]
    out.write_text(json.dumps(seen))


def main(argv: list[str]) -> None:
    url, queue, out = argv
    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    cfg = load({}, agent_log_reporter_active=False)
    tracing.configure(cfg)
    assert instrument.install_one("swmp.instrument.pika", cfg)[1] == "installed"
    task.react(lambda reactor: exchange(reactor, url, queue, Path(out), sink))


if __name__ == "__main__":
    main(sys.argv[1:])
