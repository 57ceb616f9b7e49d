"""Tornado route naming in process (a real HTTPServer on loopback, Tornado's own HTTP client,
segments in a memory sink): the operation is the matched rule's pattern, found once per
request whatever the number of rules tried before it (the agent makes as many Python calls
for the 50th rule as for the first); a handler class under several rules, a rule in a
nested router, rules added after the first request and an unmatched path are named as
Tornado routed them.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import orjson
import pytest

from reporter_proc import records as R
from swmp import _sink
from tests.instrumented import instrumented

RULES = 50


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with instrumented() as (memory, _):
        import tornado.web  # noqa: F401  (imported now: its deferred instrumentation is installed)

        yield memory


def entry_ops(sink: _sink.MemorySink, n: int) -> list[str]:
    out: list[str] = []
    for _ in range(500):
        out = []
        for kind, payload in sink.records:
            if kind == R.SEGMENT:
                seg = orjson.loads(payload)
                out += [s[R.SPAN_OPERATION] for s in seg[R.SEG_SPANS] if s[R.SPAN_TYPE] == R.SPAN_TYPE_ENTRY]
        if len(out) >= n:
            break
        threading.Event().wait(0.01)
    return out


class AgentCalls:
    """Counts the Python calls (and coroutine resumptions) into the Tornado instrumentation
    module made on this thread while counting."""

    def __init__(self) -> None:
        from swmp.instrument import tornado as instrumentation

        self.file = instrumentation.__file__
        self.count = 0

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename == self.file:
            self.count += 1

    async def during(self, coro: Any) -> int:
        self.count = 0
        sys.setprofile(self._profile)
        try:
            await coro
        finally:
            sys.setprofile(None)
        return self.count


def test_tornado_route_found_once_per_request(sink: _sink.MemorySink) -> None:
    import tornado.web
    from tornado.httpclient import AsyncHTTPClient
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    def handler(name: str) -> type[tornado.web.RequestHandler]:
        def get(self: tornado.web.RequestHandler, *args: str) -> None:
            self.write(name)

        return type(name, (tornado.web.RequestHandler,), {"get": get})

    shared = handler("Shared")
    rules: list[Any] = [(rf"/r{i}/([0-9]+)", handler(f"H{i}")) for i in range(RULES)]
    rules += [(r"/shared/([0-9]+)", shared), (r"/also/(.*)", shared)]
    rules += [(r"/nested/.*", [(r"/nested/items/([0-9]+)", handler("Item"))])]

    async def main() -> tuple[list[bytes], list[int]]:
        app = tornado.web.Application(rules, log_function=lambda h: None)
        sockets = bind_sockets(0, "127.0.0.1")
        server = HTTPServer(app)
        server.add_sockets(sockets)
        base = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        client = AsyncHTTPClient(force_instance=True)
        counter = AgentCalls()
        try:

            async def get(path: str) -> bytes:
                resp = await client.fetch(base + path, raise_error=False)
                return bytes(resp.body)

            bodies = [await get("/r0/1")]  # the first request builds the route index
            calls = [await counter.during(get("/r0/2")), await counter.during(get(f"/r{RULES - 1}/3"))]
            bodies += [await get(p) for p in ("/shared/4", "/also/x", "/nested/items/5", "/none")]
            app.add_handlers(r".*", [(r"/late/([0-9]+)", handler("Late"))])
            bodies.append(await get("/late/6"))
            return bodies, calls
        finally:
            client.close()
            server.stop()
            await server.close_all_connections()

    bodies, calls = asyncio.run(main())
    assert bodies[:4] == [b"H0", b"Shared", b"Shared", b"Item"] and bodies[5] == b"Late"
    # As many calls into the instrumentation for the last rule as for the first.
    assert calls[0] == calls[1], calls
    assert entry_ops(sink, 8) == [
        "/r0/([0-9]+)",
        "/r0/([0-9]+)",
        f"/r{RULES - 1}/([0-9]+)",
        "/shared/([0-9]+)",
        "/also/(.*)",
        "/nested/items/([0-9]+)",
        "/none",  # no rule: the path
        "/late/([0-9]+)",
    ]


def test_an_exception_with_an_odd_status_code_is_logged_by_tornado(
    sink: _sink.MemorySink, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler's exception whose ``status_code`` is not a number: Tornado's own
    ``log_exception`` still logs it ("Uncaught exception"), the span marks the failure."""
    import logging

    import tornado.web
    from tornado.httpclient import AsyncHTTPClient
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    class ApiError(Exception):
        status_code = None

    class Failing(tornado.web.RequestHandler):
        def get(self) -> None:
            raise ApiError("boom")

    async def main() -> int:
        app = tornado.web.Application([(r"/x", Failing)], log_function=lambda h: None)
        sockets = bind_sockets(0, "127.0.0.1")
        server = HTTPServer(app)
        server.add_sockets(sockets)
        client = AsyncHTTPClient(force_instance=True)
        try:
            url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}/x"
            return int((await client.fetch(url, raise_error=False)).code)
        finally:
            client.close()
            server.stop()
            await server.close_all_connections()

    with caplog.at_level(logging.ERROR, logger="tornado.application"):
        assert asyncio.run(main()) == 500
    messages = [r.getMessage() for r in caplog.records if r.name == "tornado.application"]
    assert any(m.startswith("Uncaught exception") for m in messages), messages
    assert not any("Error in exception logger" in m for m in messages), messages
    assert entry_ops(sink, 1) == ["/x"]


def entry_spans(sink: _sink.MemorySink, n: int) -> list[list[Any]]:
    out: list[list[Any]] = []
    for _ in range(500):
        out = []
        for kind, payload in sink.records:
            if kind == R.SEGMENT:
                out += [s for s in orjson.loads(payload)[R.SEG_SPANS] if s[R.SPAN_TYPE] == R.SPAN_TYPE_ENTRY]
        if len(out) >= n:
            break
        threading.Event().wait(0.01)
    return out


@pytest.mark.parametrize("xheaders", [False, True])
def test_peer_is_the_clients_ip_and_port(sink: _sink.MemorySink, xheaders: bool) -> None:
    """The entry span's peer is the client's ``ip:port`` (the connection's address, read
    from a plain socket client that knows its own port); with ``xheaders`` and an
    ``X-Real-Ip`` header, the ip Tornado reports, alone (the port is the proxy's)."""
    import socket

    import tornado.web
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    class Hello(tornado.web.RequestHandler):
        def get(self) -> None:
            self.write("hi")

    def call(port: int) -> tuple[bytes, int]:
        with socket.create_connection(("127.0.0.1", port)) as s:
            extra = b"X-Real-Ip: 10.1.2.3\r\n" if xheaders else b""
            s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra + b"\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            return data, s.getsockname()[1]

    async def main() -> tuple[bytes, int]:
        app = tornado.web.Application([(r"/hello", Hello)], log_function=lambda h: None)
        sockets = bind_sockets(0, "127.0.0.1")
        server = HTTPServer(app, xheaders=xheaders)
        server.add_sockets(sockets)
        try:
            return await asyncio.get_running_loop().run_in_executor(None, call, sockets[0].getsockname()[1])
        finally:
            server.stop()
            await server.close_all_connections()

    data, client_port = asyncio.run(main())
    assert data.startswith(b"HTTP/1.1 200"), data
    (span,) = entry_spans(sink, 1)
    assert span[R.SPAN_PEER] == ("10.1.2.3" if xheaders else f"127.0.0.1:{client_port}")
