"""Sanic in process: a real server on loopback (started by ``create_server``, so Sanic's
touch-up recompiles ``handle_request``), requests over raw asyncio streams, segments in a
memory sink. What ``tests/test_servers_async_web.py`` checks under ``swmp run``, plus
that the wrappers survive the touch-up, that no hook is registered on the app, and that
uninstalling leaves Sanic untraced."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import orjson
import pytest

from reporter_proc import records as R
from swmp import _sink, instrument, propagation
from swmp.instrument._patch import is_patched
from swmp.tracing import Component, Kind
from tests.instrumented import instrumented
from tests.test_instrument_frameworks import segments, tags_of

T = TypeVar("T")

sanic = pytest.importorskip("sanic")

SW8 = propagation.encode_sw8(
    "trace-up", "seg-up", 4, propagation.b64("up"), propagation.b64("up-1"), "/up", "me:1"
)
_LENGTH = re.compile(rb"(?i)content-length: *(\d+)")
_apps = 0


@pytest.fixture()
def sink(monkeypatch: pytest.MonkeyPatch) -> Iterator[_sink.MemorySink]:
    # test_mode: Sanic touches up from the pristine methods each time (one app per test).
    monkeypatch.setattr(sanic.Sanic, "test_mode", True)
    with instrumented(plugin_sanic_collect_http_params=True) as (memory, _):
        yield memory


def make_app() -> Any:
    global _apps
    _apps += 1
    app = sanic.Sanic(f"swmp_sanic_{_apps}", configure_logging=False)
    app.config.ACCESS_LOG = False

    @app.get("/users/<uid:int>")
    async def user(request: Any, uid: int) -> Any:
        return sanic.response.text(str(uid))

    @app.get("/boom")
    async def boom(request: Any) -> Any:
        raise ValueError("boom-sanic")

    @app.get("/stream")
    async def stream(request: Any) -> None:
        response = await request.respond(content_type="text/plain")
        await response.send("a")
        await response.send("b")
        await response.eof()

    return app


async def _get(port: int, paths: list[tuple[str, dict[str, str]]]) -> list[tuple[int, bytes]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    out = []
    try:
        for path, headers in paths:
            extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            m = _LENGTH.search(head)
            if m is not None:
                body = await reader.readexactly(int(m.group(1)))
            else:  # chunked
                body = b""
                while True:
                    size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                    chunk = await reader.readexactly(size + 2)
                    if size == 0:
                        break
                    body += chunk[:-2]
            out.append((status, body))
    finally:
        writer.close()
    return out


def serve(app: Any, paths: list[tuple[str, dict[str, str]]]) -> list[tuple[int, bytes]]:
    return serve_with(app, lambda port: _get(port, paths))


def serve_with(app: Any, client: Callable[[int], Awaitable[T]]) -> T:
    """``client(port)`` run against ``app`` served by Sanic's own server on a free port."""

    async def main() -> T:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = await app.create_server(sock=sock, return_asyncio_server=True)
        assert server is not None
        await server.startup()
        await server.before_start()
        await server.after_start()
        try:
            return await client(int(sock.getsockname()[1]))
        finally:
            await server.close()

    return asyncio.run(main())


def test_entry_span_after_touch_up(sink: _sink.MemorySink) -> None:
    app = make_app()
    got = serve(app, [("/users/7?a=b", {"sw8": SW8}), ("/stream", {})])
    assert got == [(200, b"7"), (200, b"ab")]
    assert app.config.TOUCHUP and sanic.Sanic.__touched__  # the methods were recompiled ...
    assert is_patched(sanic.Sanic, "handle_request")  # ... and wrapped again
    # No middleware nor signal handler of ours: Sanic's dispatch stays out of the request.
    assert not app.request_middleware and not app.response_middleware
    assert not [r for r in app.signal_router.routes if r.name.startswith("http.")]
    (ok, streamed) = segments(sink)
    (span,) = ok[R.SEG_SPANS]
    assert span[R.SPAN_OPERATION] == "/users/<uid:int>"  # the route template
    assert span[R.SPAN_COMPONENT] == Component.SANIC and span[R.SPAN_TYPE] == Kind.ENTRY
    assert ok[R.SEG_TRACE_ID] == "trace-up"
    assert span[R.SPAN_REFS][0][1:4] == ["trace-up", "seg-up", 4]
    t = tags_of(span)
    assert t["http.method"] == "GET" and t["http.status_code"] == "200"
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/users/7", t["http.url"])
    assert t["http.params"] == "a=b"
    assert span[R.SPAN_PEER].startswith("127.0.0.1:")
    assert not span[R.SPAN_IS_ERROR]
    (s,) = streamed[R.SEG_SPANS]
    assert s[R.SPAN_OPERATION] == "/stream" and tags_of(s)["http.status_code"] == "200"


def test_errors_and_unmatched_paths(sink: _sink.MemorySink) -> None:
    got = serve(make_app(), [("/boom", {}), ("/nope/42", {})])
    assert [status for status, _ in got] == [500, 404]
    boom, nope = (seg[R.SEG_SPANS][0] for seg in segments(sink))
    assert boom[R.SPAN_OPERATION] == "/boom" and boom[R.SPAN_IS_ERROR]
    assert tags_of(boom)["http.status_code"] == "500"
    logs = orjson.dumps(boom[R.SPAN_LOGS]).decode()
    assert "boom-sanic" in logs and "Traceback" in logs and "ValueError" in logs
    assert nope[R.SPAN_OPERATION] == "/nope/42" and nope[R.SPAN_IS_ERROR]
    assert tags_of(nope)["http.status_code"] == "404"
    assert not nope[R.SPAN_LOGS]  # a 404 is no exception to log


def test_uninstalled_is_untraced(sink: _sink.MemorySink) -> None:
    instrument.uninstall_all()
    assert not is_patched(sanic.Sanic, "handle_request")
    assert serve(make_app(), [("/users/3", {}), ("/boom", {})])[0] == (200, b"3")
    assert not is_patched(sanic.Sanic, "handle_request")  # _startup did not wrap again
    assert segments(sink) == []


async def _asgi_get(app: Any, path: str) -> int:
    body = [{"type": "http.request", "body": b"", "more_body": False}]
    out: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if body:
            return body.pop()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def send(m: dict[str, Any]) -> None:
        out.append(m)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"h:1"), (b"sw8", SW8.encode())],
        "client": ("10.0.0.1", 5000),
        "server": ("h", 1),
    }
    await app(scope, receive, send)
    return int(out[0]["status"])


def test_asgi_mode(sink: _sink.MemorySink) -> None:
    """Sanic as an ASGI application: ``ASGIApp`` calls the same ``handle_request``."""
    app = make_app()

    async def main() -> list[int]:
        life_in: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await life_in.put({"type": "lifespan.startup"})
        life_out: list[dict[str, Any]] = []

        async def life_send(m: dict[str, Any]) -> None:
            life_out.append(m)

        lifespan = {"type": "lifespan", "asgi": {"version": "3.0"}}
        life = asyncio.ensure_future(app(lifespan, life_in.get, life_send))
        while not life_out:  # started (touch-up included)
            await asyncio.sleep(0.01)
        statuses = [await _asgi_get(app, "/users/4"), await _asgi_get(app, "/boom")]
        await life_in.put({"type": "lifespan.shutdown"})
        await life
        return statuses

    assert asyncio.run(main()) == [200, 500]
    ok, boom = (seg[R.SEG_SPANS][0] for seg in segments(sink))
    assert ok[R.SPAN_OPERATION] == "/users/<uid:int>" and ok[R.SPAN_COMPONENT] == Component.SANIC
    assert ok[R.SPAN_REFS][0][1:4] == ["trace-up", "seg-up", 4]
    assert tags_of(ok) == {"http.method": "GET", "http.url": "http://h:1/users/4", "http.status_code": "200"}
    assert ok[R.SPAN_PEER] == "10.0.0.1:5000"
    assert boom[R.SPAN_IS_ERROR] and tags_of(boom)["http.status_code"] == "500"
    assert "boom-sanic" in orjson.dumps(boom[R.SPAN_LOGS]).decode()
