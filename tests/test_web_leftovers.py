"""Entry and exit spans of the web instrumentations in shapes a review found wrong, each
against the real framework or server (in process, on loopback):

* an aiohttp response that fails half-way through streaming keeps the status it sent;
* a Sanic websocket handler's span has the 101 of its upgrade (as aiohttp's and Tornado's);
* a path no route matched is named by its decoded text (``/café``, not ``/caf%C3%A9``)
  under Tornado and Sanic, as under aiohttp, ASGI and WSGI;
* an ``http.client`` request or a websockets handshake stopped by a ``KeyboardInterrupt``
  or a cancellation is logged as interrupted, not flagged as failed;
* a WSGI application raising right after ``start_response("200 OK")``: the server answers
  500, and the span has that status, not the 200 it was given.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Coroutine, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson
import pytest

from reporter_proc import records as R
from swmp import _sink
from swmp.instrument import wsgi
from swmp.tracing import Kind
from swmp.tracing.span import native_core
from tests.instrumented import instrumented
from tests.test_instrument_sanic import serve_with

_apps = 0


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with instrumented() as (memory, _):
        yield memory


def spans(sink: _sink.MemorySink, kind: int | None = Kind.ENTRY) -> list[list[Any]]:
    return [
        span
        for t, payload in sink.records
        if t == R.SEGMENT
        for span in orjson.loads(payload)[R.SEG_SPANS]
        if kind is None or span[R.SPAN_TYPE] == kind
    ]


def tags_of(span: list[Any]) -> dict[str, str]:
    t = span[R.SPAN_TAGS]
    return dict(zip(t[::2], t[1::2], strict=True))


def statuses(span: list[Any]) -> list[str]:
    t = span[R.SPAN_TAGS]
    return [v for k, v in zip(t[::2], t[1::2], strict=True) if k == "http.status_code"]


def log_fields(span: list[Any]) -> list[dict[str, str]]:
    return [dict(zip(data[::2], data[1::2], strict=True)) for _, data in span[R.SPAN_LOGS]]


async def _wait_spans(sink: _sink.MemorySink, n: int, kind: int | None = Kind.ENTRY) -> None:
    for _ in range(3000):  # a span ends as its request's task unwinds, after the client read
        if len(spans(sink, kind)) >= n:
            return
        await asyncio.sleep(0.01)


async def _raw_get(port: int, path: str) -> bytes:
    """The whole answer to ``GET path`` on a connection the server closes (or the client,
    once the answer is complete)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: h:1\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


def _status_line(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


# -- 1. aiohttp: a stream that fails half-way --------------------------------------------------
def test_aiohttp_stream_failing_half_way_keeps_the_status_it_sent(sink: _sink.MemorySink) -> None:
    """A ``StreamResponse`` prepared with 200 (headers and a chunk out), then the handler
    raises: aiohttp cannot answer 500 any more (it drops the connection); the span has the
    200 that went out, the error flag and the handler's exception. A websocket handler
    failing after its upgrade keeps its 101 likewise."""
    import aiohttp
    from aiohttp import web

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200)
        resp.content_type = "text/plain"
        await resp.prepare(request)
        await resp.write(b"part")
        raise ValueError("half-way")

    async def socket_then_fail(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        raise ValueError("after upgrade")

    async def main() -> tuple[bytes, Any]:
        app = web.Application()
        app.router.add_get("/stream/{id}", stream)
        app.router.add_get("/ws", socket_then_fail)
        runner = web.AppRunner(app)
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(runner, sock).start()
        try:
            port = sock.getsockname()[1]
            answer = await _raw_get(port, "/stream/7")
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(f"http://127.0.0.1:{port}/ws") as ws,
            ):
                closed = await ws.receive()  # the server dropped the connection
            await _wait_spans(sink, 2)
        finally:
            await runner.cleanup()
        return answer, closed.type

    answer, closed = asyncio.run(main())
    assert closed in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.ERROR)
    assert _status_line(answer) == 200 and b"part" in answer
    got = {s[R.SPAN_OPERATION]: s for s in spans(sink)}
    for op, status, message in (("/stream/{id}", "200", "half-way"), ("/ws", "101", "after upgrade")):
        span = got[op]
        assert statuses(span) == [status], op
        assert span[R.SPAN_IS_ERROR] is True
        assert message in orjson.dumps(span[R.SPAN_LOGS]).decode()


# -- 2. Sanic websocket ------------------------------------------------------------------------
def _sanic_app() -> Any:
    import sanic

    global _apps
    _apps += 1
    app = sanic.Sanic(f"swmp_leftovers_{_apps}", configure_logging=False)
    app.config.ACCESS_LOG = False

    @app.websocket("/ws/<room>")  # type: ignore[untyped-decorator]
    async def ws(request: Any, ws: Any, room: str) -> None:
        await ws.send(await ws.recv() + room)

    @app.get("/users/<uid:int>")
    async def user(request: Any, uid: int) -> Any:
        return sanic.response.text(str(uid))

    return app


_serve_sanic = serve_with  # Sanic's own server on a free port (tests/test_instrument_sanic.py)


@pytest.fixture()
def sanic_sink(monkeypatch: pytest.MonkeyPatch) -> Iterator[_sink.MemorySink]:
    sanic = pytest.importorskip("sanic")
    monkeypatch.setattr(sanic.Sanic, "test_mode", True)  # one app per test: touch-up each time
    with instrumented() as (memory, _):
        yield memory


def test_sanic_websocket_span_has_the_upgrade_status(sanic_sink: _sink.MemorySink) -> None:
    """A Sanic websocket handler's entry span has ``http.status_code`` 101 (the upgrade Sanic
    answered), not failed; aiohttp and Tornado tag their upgrades so."""
    import websockets

    async def client(port: int) -> str:
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws/r1") as c:
            await c.send("hi")
            echoed = str(await c.recv())
        await _wait_spans(sanic_sink, 1)
        return echoed

    assert _serve_sanic(_sanic_app(), client) == "hir1"
    (span,) = spans(sanic_sink)
    assert span[R.SPAN_OPERATION] == "/ws/<room:str>"
    assert statuses(span) == ["101"]
    assert span[R.SPAN_IS_ERROR] is False


# -- 3. a path no route matched: its decoded text ----------------------------------------------
_CAFE = "/caf\u00e9"
_UNMATCHED = ["/caf%C3%A9", "/caf%c3%a9", "/caf\u00e9".encode().decode("latin-1")]


def _request_lines(port: int, paths: list[str]) -> Coroutine[Any, Any, list[int]]:
    async def get_all() -> list[int]:
        out = []
        for path in paths:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                line = f"GET {path} HTTP/1.1\r\nHost: h:1\r\nConnection: close\r\n\r\n"
                writer.write(line.encode("latin-1"))  # a path beyond ASCII: its UTF-8 bytes
                await writer.drain()
                out.append(_status_line(await asyncio.wait_for(reader.read(), 30)))
            finally:
                writer.close()
        return out

    return get_all()


def _named(sink: _sink.MemorySink) -> list[tuple[str, str]]:
    return [(s[R.SPAN_OPERATION], tags_of(s)["http.url"].partition("h:1")[2]) for s in spans(sink)]


def test_sanic_unmatched_path_is_named_decoded(sanic_sink: _sink.MemorySink) -> None:
    """``/caf%C3%A9`` and ``/caf%c3%a9`` are one endpoint, ``/café`` (operation and
    ``http.url``), as aiohttp, ASGI and WSGI name them; escapes that spell no UTF-8 text
    are kept. (Sanic refuses a request line beyond ASCII with a 400 of its own.) Routed
    requests keep their template."""

    async def client(port: int) -> list[int]:
        got = await _request_lines(port, [*_UNMATCHED[:2], "/%FF", "/users/7"])
        await _wait_spans(sanic_sink, 4)
        return got

    assert _serve_sanic(_sanic_app(), client) == [404] * 3 + [200]
    assert _named(sanic_sink) == [(_CAFE, _CAFE)] * 2 + [("/%FF", "/%FF"), ("/users/<uid:int>", "/users/7")]


def test_tornado_unmatched_path_is_named_decoded(sink: _sink.MemorySink) -> None:
    """The same under Tornado (its default 404 handler), the UTF-8 bytes sent unescaped
    too (Tornado reads them as latin-1 characters: ``/cafÃ©``); the rule patterns of
    matched requests are unchanged."""
    import tornado.web

    class Users(tornado.web.RequestHandler):
        def get(self, uid: str) -> None:
            self.write(uid)

    async def main() -> list[int]:
        app = tornado.web.Application([(r"/users/([0-9]+)", Users)])
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        server = tornado.httpserver.HTTPServer(app)
        server.add_sockets([sock])
        try:
            got = await _request_lines(sock.getsockname()[1], [*_UNMATCHED, "/%FF", "/users/7"])
            await _wait_spans(sink, 5)
        finally:
            server.stop()
        return got

    import tornado.httpserver

    assert asyncio.run(main()) == [404] * 4 + [200]
    assert _named(sink) == [(_CAFE, _CAFE)] * 3 + [("/%FF", "/%FF"), ("/users/([0-9]+)", "/users/7")]


def test_aiohttp_unmatched_path_is_named_decoded(sink: _sink.MemorySink) -> None:
    """aiohttp's own ``request.path`` (decoded by yarl): the reference the others follow."""
    from aiohttp import web

    async def main() -> list[int]:
        runner = web.AppRunner(web.Application())
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(runner, sock).start()
        try:
            got = await _request_lines(sock.getsockname()[1], [*_UNMATCHED[:2], "/%FF"])
            await _wait_spans(sink, 3)
        finally:
            await runner.cleanup()
        return got

    assert asyncio.run(main()) == [404] * 3
    assert _named(sink) == [(_CAFE, _CAFE)] * 2 + [("/%FF", "/%FF")]


# -- 4. http.client and websockets: an interruption is no failure -------------------------------
class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _App:
    """A WSGI application answering ``ok`` (the peer of the http.client requests)."""

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]


@pytest.fixture()
def http_port() -> Iterator[int]:
    server: WSGIServer = make_server("127.0.0.1", 0, _App(), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        thread.join(30)
        server.server_close()


class _Raising:
    """A connected socket whose send or read raises ``exc`` (a ``KeyboardInterrupt`` reaching
    the thread blocked in it), the rest of it the real socket's."""

    def __init__(self, sock: socket.socket, where: str, exc: BaseException) -> None:
        self._sock, self._where, self._exc = sock, where, exc

    def sendall(self, data: bytes) -> None:
        if self._where == "send":
            raise self._exc
        self._sock.sendall(data)

    def makefile(self, mode: str) -> Any:
        fp = self._sock.makefile("rb" if mode == "rb" else "wb")
        if self._where != "read":
            return fp
        exc = self._exc

        class Reader:
            def readline(self, limit: int = -1) -> bytes:
                raise exc

            def flush(self) -> None:
                pass

            def close(self) -> None:
                fp.close()

        return Reader()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


@pytest.mark.parametrize("where", ["send", "read"])
@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(2), ConnectionResetError("reset")])
def test_http_client_request_interrupted_is_not_an_error(
    sink: _sink.MemorySink, http_port: int, where: str, exc: BaseException
) -> None:
    """A ``KeyboardInterrupt`` or ``SystemExit`` raised inside the socket send
    (``request``) or read (``getresponse``): the exit span ends, not failed, with an
    ``event=interrupted`` log, as every span of the agent's; it propagates unchanged. A
    ``ConnectionResetError`` still fails the span."""
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
    conn.connect()
    real = conn.sock
    conn.sock = _Raising(real, where, exc)
    try:
        with pytest.raises(type(exc)) as raised:
            conn.request("GET", "/x")
            conn.getresponse()
        assert raised.value is exc
    finally:
        real.close()
        conn.close()
    (span,) = spans(sink, Kind.EXIT)
    assert span[R.SPAN_OPERATION] == "/x"
    fields = log_fields(span)
    if isinstance(exc, Exception):
        assert span[R.SPAN_IS_ERROR] is True and fields[0]["event"] == "error"
    else:
        assert span[R.SPAN_IS_ERROR] is False
        assert fields == [{"event": "interrupted", "kind": type(exc).__name__, "message": str(exc)}]
    # The same connection still traces a request that completes.
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/y", timeout=30) as resp:
        assert resp.read() == b"ok"
    assert statuses(spans(sink, Kind.EXIT)[-1]) == ["200"]


def test_websockets_handshake_cancelled_is_not_an_error(sink: _sink.MemorySink) -> None:
    """A websockets handshake whose task is cancelled while it waits for the server's
    answer: the exit span ends, not failed, the cancellation logged, no ``invalid
    handshake`` status (no answer came); the task sees the CancelledError as without the
    agent. A handshake the server refuses (a 404) still fails the span."""
    import websockets

    async def main() -> BaseException | None:
        asked = asyncio.Event()

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            asked.set()
            await reader.read()  # never answers; the client goes away
            writer.close()

        async def refusing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        refuser = await asyncio.start_server(refusing, "127.0.0.1", 0)
        try:
            port = server.sockets[0].getsockname()[1]
            task = asyncio.ensure_future(websockets.connect(f"ws://127.0.0.1:{port}/chat", open_timeout=None))
            await asyncio.wait_for(asked.wait(), 30)
            task.cancel()
            try:
                await task
                raised: BaseException | None = None
            except BaseException as e:
                raised = e
            with pytest.raises(websockets.InvalidStatus):
                await websockets.connect(f"ws://127.0.0.1:{refuser.sockets[0].getsockname()[1]}/no")
            await _wait_spans(sink, 2, Kind.EXIT)
        finally:
            server.close()
            refuser.close()
        return raised

    assert isinstance(asyncio.run(main()), asyncio.CancelledError)
    got = {s[R.SPAN_OPERATION]: s for s in spans(sink, Kind.EXIT)}
    cancelled, refused = got["/chat"], got["/no"]
    assert cancelled[R.SPAN_IS_ERROR] is False
    assert [f["event"] for f in log_fields(cancelled)] == ["interrupted"]
    assert log_fields(cancelled)[0]["kind"] == "CancelledError"
    assert "http.status_msg" not in tags_of(cancelled)
    assert refused[R.SPAN_IS_ERROR] is True
    assert tags_of(refused)["http.status_msg"] == "invalid handshake" and statuses(refused) == ["404"]


# -- 5. WSGI: the application raises after start_response ------------------------------------
FORMS = ["python"] + (["native"] if native_core is not None else [])


def _raising_after_start(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    raise ValueError("after start_response")


@pytest.mark.parametrize("form", FORMS)
def test_wsgi_app_raising_after_start_response_under_wsgiref(
    sink: _sink.MemorySink, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    """No header was sent when the application raised: wsgiref answers 500 (as Gunicorn and
    Waitress do), and the span has that status only, failed, the exception logged; not the
    200 the application gave ``start_response``. The native ``wsgi_call`` and its Python
    form."""
    if form == "python":
        monkeypatch.setattr(wsgi, "trace_wsgi", wsgi._py_trace_wsgi)
    else:
        assert wsgi.trace_wsgi is native_core.wsgi_call
    server: WSGIServer = make_server(
        "127.0.0.1", 0, wsgi.WSGIMiddleware(_raising_after_start), handler_class=_Quiet
    )
    thread = threading.Thread(target=server.handle_request)
    thread.start()
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/x", timeout=30)
        assert err.value.code == 500
    finally:
        thread.join(30)
        server.server_close()
    (span,) = spans(sink)
    assert statuses(span) == ["500"]
    assert span[R.SPAN_IS_ERROR] is True
    assert "after start_response" in orjson.dumps(span[R.SPAN_LOGS]).decode()


# -- 6. WSGI: an interrupt is no failure ---------------------------------------------------
def _start_then(raised: BaseException, where: str) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> Any:
        start_response("200 OK", [("Content-Type", "text/plain")])
        if where == "app":
            raise raised

        def body() -> Iterator[bytes]:
            if where == "later":
                yield b"first"
            raise raised

        return body()

    return app


# (request form, body form): the native wsgi_call always makes the native body.
INTERRUPT_FORMS = [("python", "python")] + (
    [("python", "native"), ("native", "native")] if native_core is not None else []
)
INTERRUPTS = [KeyboardInterrupt(), SystemExit(3)]


@pytest.mark.parametrize("forms", INTERRUPT_FORMS, ids="-".join)
@pytest.mark.parametrize("where", ["app", "first", "later"])
@pytest.mark.parametrize("raised", INTERRUPTS, ids=lambda e: type(e).__name__)
def test_wsgi_request_ended_by_an_interrupt_is_not_an_error(
    sink: _sink.MemorySink,
    monkeypatch: pytest.MonkeyPatch,
    forms: tuple[str, str],
    where: str,
    raised: BaseException,
) -> None:
    """A KeyboardInterrupt or SystemExit raised by the application (a worker told to stop
    while it runs a request), or by its body before or after the first item, goes on to the
    server unchanged and is logged on the span as an interruption, not flagged as its error:
    as every other span of the agent (Span.ended_by). Both request forms, both bodies."""
    form, body_form = forms
    if form == "python":
        monkeypatch.setattr(wsgi, "trace_wsgi", wsgi._py_trace_wsgi)
    if body_form == "python":
        monkeypatch.setattr(wsgi, "_make_body", wsgi._Body)
    app = wsgi.WSGIMiddleware(_start_then(raised, where))
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/stop", "SERVER_NAME": "h", "SERVER_PORT": "80"}
    with pytest.raises(type(raised)):
        result = app(environ, lambda status, headers, exc_info=None: None)
        try:
            for _ in result:
                pass
        finally:
            result.close()
    (span,) = spans(sink)
    assert span[R.SPAN_IS_ERROR] is False
    assert [(f["event"], f["kind"]) for f in log_fields(span)] == [("interrupted", type(raised).__name__)]
    assert statuses(span) == ["200"]  # what start_response was given: no 500 for an exit
