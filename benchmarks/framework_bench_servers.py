"""Cases of ``benchmarks/framework_bench.py`` for the frameworks that are their own servers
(aiohttp, Tornado, Sanic) and for gRPC: measured with the same function and table.

These frameworks have no WSGI/ASGI callable to call in memory. aiohttp and Sanic: their
own server protocol object (the real request path: parser, handler task, router,
middleware, response writer) is fed ``GET /users/42`` from memory, one request after the
other on one kept-alive connection, without sockets. Tornado and gRPC: the real server
runs on 127.0.0.1 in the benchmark's own event loop (gRPC sync: its thread pool) and gets
the request over one kept-alive connection from a client that is not instrumented (raw
asyncio streams; for gRPC a channel made with the library's own, unpatched, channel
function); the socket round trip is in both modes and makes ``bare`` larger. ``traced -
bare`` is the server-side entry span (plus the route naming and error hooks), as for the
other cases.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

Serve = Callable[[int], None]
_LENGTH = re.compile(rb"(?i)content-length: *(\d+)")
_REQUEST = b"GET /users/42 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def _loop_serve(start: Callable[[], Awaitable[int]]) -> Serve:
    """Start a server with ``start()`` (returns its port) in a new loop; ``serve(n)`` sends n
    requests on one connection in that loop."""
    loop = asyncio.new_event_loop()

    async def connect() -> Callable[[], Awaitable[None]]:
        port = await start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)

        async def one() -> None:
            writer.write(_REQUEST)
            head = await reader.readuntil(b"\r\n\r\n")
            m = _LENGTH.search(head)
            if m is None or not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"unexpected answer {head!r}")
            await reader.readexactly(int(m.group(1)))

        return one

    one = loop.run_until_complete(connect())

    async def many(n: int) -> None:
        for _ in range(n):
            await one()

    def serve(n: int) -> None:
        loop.run_until_complete(many(n))

    return serve


class _MemoryTransport(asyncio.Transport):
    """A connection whose bytes stay in memory: the server's own protocol object parses the
    request and writes the response here, without sockets or the selector."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.waiter: asyncio.Future[None] | None = None

    def write(self, data: Any) -> None:
        self.out += data
        head_end = self.out.find(b"\r\n\r\n")
        if head_end < 0 or self.waiter is None or self.waiter.done():
            return
        m = _LENGTH.search(self.out, 0, head_end)
        if m is not None and len(self.out) >= head_end + 4 + int(m.group(1)):
            if not self.out.startswith(b"HTTP/1.1 200"):
                self.waiter.set_exception(RuntimeError(f"unexpected answer {bytes(self.out[:80])!r}"))
            else:
                self.waiter.set_result(None)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


class _SanicTransport(_MemoryTransport):
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


def _memory_serve(
    loop: asyncio.AbstractEventLoop, start: Callable[[], Awaitable[tuple[Any, _MemoryTransport]]]
) -> Serve:
    """``start()`` makes a server protocol connected to a memory transport, in ``loop``;
    ``serve(n)`` feeds it n requests, one after the other, in that loop."""
    protocol, transport = loop.run_until_complete(start())

    async def many(n: int) -> None:
        for _ in range(n):
            transport.out.clear()
            transport.waiter = loop.create_future()
            protocol.data_received(_REQUEST)
            await transport.waiter

    def serve(n: int) -> None:
        loop.run_until_complete(many(n))

    def close() -> None:
        # A server's handler task may wait for the next request (aiohttp): end the
        # connection and let it finish, or the loop is discarded with it pending ("Task was
        # destroyed but it is pending" at exit).
        protocol.connection_lost(None)
        loop.run_until_complete(asyncio.sleep(0.01))
        loop.close()

    weakref.finalize(serve, close)
    return serve


def build_aiohttp() -> Serve:
    """aiohttp's own server protocol (``RequestHandler``) fed from memory: the real request
    path (parser, handler task, middlewares, router, response writer), no sockets."""
    from aiohttp import web

    async def user(request: web.Request) -> web.Response:
        return web.Response(text=request.match_info["uid"])

    loop = asyncio.new_event_loop()

    async def start() -> tuple[Any, _MemoryTransport]:
        app = web.Application()
        app.router.add_get("/users/{uid}", user)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        protocol = runner.server()  # type: ignore[misc]
        transport = _MemoryTransport()
        protocol.connection_made(transport)
        return protocol, transport

    return _memory_serve(loop, start)


def build_tornado() -> Serve:
    import tornado.web
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    class User(tornado.web.RequestHandler):
        def get(self, uid: str) -> None:
            self.write(uid)

        def log_exception(self, *args: Any) -> None:
            pass

    async def start() -> int:
        app = tornado.web.Application([(r"/users/([0-9]+)", User)], log_function=lambda h: None)
        sockets = bind_sockets(0, "127.0.0.1")
        HTTPServer(app).add_sockets(sockets)
        return int(sockets[0].getsockname()[1])

    return _loop_serve(start)


_sanic_apps = 0


def build_sanic(hooks: bool = False) -> Serve:
    """Sanic's ``HttpProtocol`` fed from memory (the app is started by ``create_server``
    first, as under its server). ``hooks``: the app also gets a no-op request middleware
    and a no-op response signal handler, what an instrumentation through Sanic's own hooks
    adds (swmp's did until it wrapped ``handle_request``; the ``generic`` comparison)."""
    import socket

    from sanic import Sanic, response

    global _sanic_apps
    _sanic_apps += 1
    loop = asyncio.new_event_loop()
    app = Sanic(f"bench{_sanic_apps}", configure_logging=False)
    app.config.ACCESS_LOG = False
    app.config.TOUCHUP = False  # Sanic cannot touch up a second app in one process

    @app.get("/users/<uid:int>")
    async def user(request: Any, uid: int) -> Any:
        return response.text(str(uid))

    if hooks:

        async def nothing(request: Any, response: Any = None) -> None:
            return None

        app.register_middleware(nothing, "request")
        app.signal("http.lifecycle.response")(nothing)

    async def start() -> tuple[Any, _MemoryTransport]:
        from sanic.models.server_types import Signal
        from sanic.server.protocols.http_protocol import HttpProtocol

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = await app.create_server(sock=sock, return_asyncio_server=True)
        assert server is not None
        await server.startup()  # the app started as under its server (router, signals)
        protocol = HttpProtocol(
            loop=loop, app=app, signal=Signal(), connections=set(), state={"requests_count": 0}
        )
        transport = _SanicTransport()
        protocol.connection_made(transport)
        return protocol, transport

    return _memory_serve(loop, start)


def _raw_channel(target: str, aio: bool = False) -> Any:
    """A channel without the agent's client interceptors (only the server is measured)."""
    import grpc

    from swmp.instrument._patch import original

    return original(grpc.aio if aio else grpc, "insecure_channel")(target)


def build_grpc_sync() -> Serve:
    from concurrent import futures

    import grpc

    handler = grpc.method_handlers_generic_handler(
        "bench.Users", {"Get": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    call = _raw_channel(f"127.0.0.1:{port}").unary_unary("/bench.Users/Get")

    def serve(n: int, _server: Any = server) -> None:  # the server lives as long as serve
        for _ in range(n):
            call(b"42")

    return serve


def build_grpc_aio() -> Serve:
    import grpc

    loop = asyncio.new_event_loop()

    async def get(req: bytes, ctx: Any) -> bytes:
        return req

    async def start() -> Any:
        handler = grpc.method_handlers_generic_handler(
            "bench.Users", {"Get": grpc.unary_unary_rpc_method_handler(get)}
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return _raw_channel(f"127.0.0.1:{port}", aio=True).unary_unary("/bench.Users/Get"), server

    call, server = loop.run_until_complete(start())

    async def many(n: int) -> None:
        for _ in range(n):
            await call(b"42")

    def serve(n: int, _server: Any = server) -> None:  # the server lives as long as serve
        loop.run_until_complete(many(n))

    return serve


Built = Callable[[], Serve]


def server_cases() -> list[tuple[str, Built, str, Built | None]]:
    """``(name, build, what users deploy it with, generic)`` for ``framework_bench.CASES``;
    ``generic``: the same server with the hooks an instrumentation needs, doing nothing."""
    return [
        ("aiohttp", build_aiohttp, "its own (web.run_app / GunicornWebWorker)", None),
        ("tornado", build_tornado, "its own (HTTPServer)", None),
        ("sanic", build_sanic, "its own (Sanic server)", lambda: build_sanic(hooks=True)),
        ("grpc-sync", build_grpc_sync, "grpc.server (thread pool)", None),
        ("grpc-aio", build_grpc_aio, "grpc.aio.server", None),
    ]
