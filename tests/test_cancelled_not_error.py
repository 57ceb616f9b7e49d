"""A span ended by a ``BaseException`` that is no ``Exception`` is not a failed span.

A request whose handler task is cancelled because its client went away (aiohttp with
``handler_cancellation``, an ASGI server cancelling the application's task) ended its entry
span flagged as an error with the ``CancelledError``'s stack, so the OAP counted client
disconnects against the endpoint's success rate. As the SkyWalking Python agent (its
``Span.__exit__`` flags only ``Exception``): ``CancelledError``, ``KeyboardInterrupt`` and
``SystemExit`` leave an ``event=interrupted`` log and no error flag, ``GeneratorExit`` nothing;
the span still ends once and the exception propagates unchanged. Both span cores."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from reporter_proc import records as R
from swmp import _sink
from swmp.tracing import Kind
from tests.instrumented import instrumented

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with instrumented() as (memory, _):
        yield memory


def entries(sink: _sink.MemorySink) -> list[list[Any]]:
    return [
        span
        for kind, payload in sink.records
        if kind == R.SEGMENT
        for span in orjson.loads(payload)[R.SEG_SPANS]
        if span[R.SPAN_TYPE] == Kind.ENTRY
    ]


def log_fields(span: list[Any]) -> list[dict[str, str]]:
    return [dict(zip(data[::2], data[1::2], strict=True)) for _, data in span[R.SPAN_LOGS]]


# Run once per core (SWMP_TRACE_PURE): spans ended through the shared ``__exit__`` by each
# kind of exception; prints what each span recorded and what the ``with`` raised.
_SCENARIO = r"""
import asyncio, json
from swmp import _sink, tracing
from swmp.config import load
from swmp.tracing import Component, Layer
from swmp.tracing.context import current_span, new_entry_span, new_local_span
from swmp.tracing.span import NATIVE

memory = _sink.MemorySink()
_sink.set_sink(memory)
tracing.configure(load({}, agent_log_reporter_active=False))
out = {"native": NATIVE, "spans": []}
for exc in (asyncio.CancelledError("gone"), GeneratorExit(), KeyboardInterrupt(), SystemExit(3),
            ValueError("bad")):
    raised = None
    try:
        with new_entry_span("/e", None, Component.UNKNOWN, Layer.HTTP) as entry:
            with new_local_span("inner") as local:
                raise exc
    except BaseException as e:
        raised = e
    logs = [dict(zip(d[::2], d[1::2])) for span in (entry, local) for _, d in span.logs]
    out["spans"].append({
        "kind": type(exc).__name__, "same": raised is exc, "errors": [entry.is_error, local.is_error],
        "ended": bool(entry.end and local.end), "current": current_span.get() is None,
        "events": [{k: v for k, v in f.items() if k != "stack"} for f in logs],
    })
    entry.__exit__(type(exc), exc, None)  # a second end changes nothing
out["segments"] = len(memory.records)
print(json.dumps(out))
"""

_INTERRUPTED = {
    "CancelledError": {"event": "interrupted", "kind": "CancelledError", "message": "gone"},
    "KeyboardInterrupt": {"event": "interrupted", "kind": "KeyboardInterrupt", "message": ""},
    "SystemExit": {"event": "interrupted", "kind": "SystemExit", "message": "3"},
}


@pytest.mark.parametrize("pure", [False, True])
def test_shared_exit_flags_only_exceptions_in_both_cores(pure: bool) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SWMP_TRACE_PURE": "1" if pure else "0"}
    done = subprocess.run(
        [sys.executable, "-c", _SCENARIO], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["native"] is not pure
    assert out["segments"] == 5  # one per entry: each span ended once
    got = {s["kind"]: s for s in out["spans"]}
    for kind, s in got.items():
        assert s["same"] and s["ended"] and s["current"], s
        if kind == "ValueError":
            assert s["errors"] == [True, True]
            assert [e["event"] for e in s["events"]] == ["error", "error"]
        elif kind == "GeneratorExit":
            assert s["errors"] == [False, False] and s["events"] == []
        else:
            assert s["errors"] == [False, False], kind
            assert s["events"] == [_INTERRUPTED[kind]] * 2  # the local span's, then the entry's


def test_asgi_entry_whose_task_is_cancelled_is_not_an_error(sink: _sink.MemorySink) -> None:
    """An ASGI server cancels the application's task (the client went away): the entry span
    ends, not failed, and the server sees the CancelledError as without the agent."""
    from swmp.instrument import asgi

    async def main() -> BaseException | None:
        entered = asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            entered.set()
            await asyncio.Event().wait()

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            return None

        scope = {"type": "http", "method": "GET", "path": "/slow", "query_string": b"", "headers": [],
                 "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 5000), "scheme": "http",
                 "asgi": {"version": "3.0"}, "http_version": "1.1"}  # fmt: skip
        task = asyncio.ensure_future(asgi.ASGIMiddleware(app)(scope, receive, send))
        await entered.wait()
        task.cancel()
        try:
            await task
        except BaseException as e:
            return e
        return None

    raised = asyncio.run(main())
    assert isinstance(raised, asyncio.CancelledError)
    (span,) = entries(sink)
    assert span[R.SPAN_OPERATION] == "/slow"
    assert span[R.SPAN_IS_ERROR] is False
    assert [f["event"] for f in log_fields(span)] == ["interrupted"]
    assert log_fields(span)[0]["kind"] == "CancelledError"


def test_aiohttp_handler_cancelled_by_client_disconnect_is_not_an_error(sink: _sink.MemorySink) -> None:
    """aiohttp with ``handler_cancellation=True`` cancels the handler of a request whose
    client closed the connection: the entry span ends once, not failed, the cancellation
    logged; the handler sees the CancelledError as without the agent."""
    from aiohttp import web

    seen: list[str] = []

    async def main() -> None:
        entered = asyncio.Event()
        cancelled = asyncio.Event()

        async def slow(request: web.Request) -> web.Response:
            entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                seen.append("cancelled")
                cancelled.set()
                raise
            return web.Response(text="never")

        app = web.Application()
        app.router.add_get("/slow/{id}", slow)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(runner, sock)
        await site.start()
        try:
            port = sock.getsockname()[1]
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /slow/7 HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            await asyncio.wait_for(entered.wait(), 30)
            writer.close()  # the client goes away mid-request
            await asyncio.wait_for(cancelled.wait(), 30)
            for _ in range(3000):  # the span ends as the handler's task unwinds
                if entries(sink):
                    break
                await asyncio.sleep(0.01)
        finally:
            await runner.cleanup()

    asyncio.run(main())
    assert seen == ["cancelled"]
    (span,) = entries(sink)
    assert span[R.SPAN_OPERATION] == "/slow/{id}"
    assert span[R.SPAN_IS_ERROR] is False
    fields = log_fields(span)
    assert [f["event"] for f in fields] == ["interrupted"] and fields[0]["kind"] == "CancelledError"
    assert "stack" not in fields[0]
