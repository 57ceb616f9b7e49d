"""aiohttp, Tornado and Sanic applications with the same routes, run under their own
servers by ``tests/test_servers_async_web.py`` (under ``swmp run``).

Routes: ``/users/{id}`` answers the id; ``/boom`` raises ``ValueError("boom-<framework>")``
(the framework answers 500); ``/call?port=N`` calls ``http://127.0.0.1:N/users/9`` with an
aiohttp ``ClientSession`` and then opens a ``websockets`` connection to
``ws://127.0.0.1:N/ws`` (the aiohttp app's echo endpoint), answering what both returned.

    python -m aiohttp.web -H 127.0.0.1 -P PORT tests.e2e_apps.async_web:aiohttp_main
    gunicorn -k aiohttp.GunicornWebWorker tests.e2e_apps.async_web:aiohttp_factory
    python -m tests.e2e_apps.async_web tornado PORT
    sanic tests.e2e_apps.async_web:sanic_app --host 127.0.0.1 --port PORT --workers 2

The Sanic app's ``/children?op=NAME`` starts, from the worker, a multiprocessing spawn child
that records an entry span ``NAME`` and a Python subprocess (``tests/test_sanic_children.py``).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any


async def downstream(port: str) -> str:
    import aiohttp
    import websockets

    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/users/9") as resp:
        body = await resp.text()
    async with websockets.connect(f"ws://127.0.0.1:{port}/ws") as ws:
        await ws.send("ping")
        echo = await ws.recv()
    return f"{body}|{echo!s}"


# -- aiohttp ---------------------------------------------------------------------------------
def aiohttp_app() -> Any:
    from aiohttp import WSMsgType, web

    async def user(request: web.Request) -> web.Response:
        return web.Response(text=request.match_info["id"], headers={"X-Worker-Pid": str(os.getpid())})

    async def boom(request: web.Request) -> web.Response:
        raise ValueError("boom-aiohttp")

    async def call(request: web.Request) -> web.Response:
        return web.Response(text=await downstream(request.query["port"]))

    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        async for msg in sock:
            if msg.type == WSMsgType.TEXT:
                await sock.send_str(msg.data)
        return sock

    app = web.Application()
    app.router.add_get("/users/{id}", user)
    app.router.add_get("/boom", boom)
    app.router.add_get("/call", call)
    app.router.add_get("/ws", ws)
    return app


def aiohttp_main(argv: list[str]) -> Any:
    return aiohttp_app()


async def aiohttp_factory() -> Any:
    return aiohttp_app()


# -- Tornado ---------------------------------------------------------------------------------
def tornado_main(port: int) -> None:
    import asyncio

    import tornado.web

    class User(tornado.web.RequestHandler):
        def get(self, uid: str) -> None:
            self.write(uid)

    class Boom(tornado.web.RequestHandler):
        def get(self) -> None:
            raise ValueError("boom-tornado")

    class Call(tornado.web.RequestHandler):
        async def get(self) -> None:
            self.write(await downstream(self.get_argument("port")))

    async def serve() -> None:
        app = tornado.web.Application([(r"/users/([0-9]+)", User), (r"/boom", Boom), (r"/call", Call)])
        app.listen(port, address="127.0.0.1")
        print(f"tornado listening on {port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


# -- Sanic -------------------------------------------------------------------------------------
def _sanic_app() -> Any:
    from sanic import Sanic, response

    app = Sanic("swmp_test_app")

    @app.get("/users/<uid:int>")
    async def user(request: Any, uid: int) -> Any:
        return response.text(str(uid), headers={"X-Worker-Pid": str(os.getpid())})

    @app.get("/boom")
    async def boom(request: Any) -> Any:
        raise ValueError("boom-sanic")

    @app.get("/call")
    async def call(request: Any) -> Any:
        return response.text(await downstream(request.args.get("port")))

    @app.get("/children")
    async def children(request: Any) -> Any:
        # A multiprocessing spawn child that records a span, then a Python subprocess that
        # tells whose application its agent joined: "<spawn pid> <subprocess pid> <its owner>".
        return response.text(await asyncio.to_thread(start_children, request.args.get("op")))

    return app


def start_children(op: str) -> str:
    import multiprocessing
    import subprocess

    # Sanic's workers are daemonic processes, which multiprocessing forbids to have children;
    # applications that need them lift the flag the same way.
    multiprocessing.current_process()._config["daemon"] = False  # type: ignore[attr-defined]
    child = multiprocessing.get_context("spawn").Process(target=spawned_span, args=(op,))
    child.start()
    child.join(20)
    probe = "import os, swmp.agent as a; r = a.current(); print(os.getpid(), r and r.owner_pid)"
    out = subprocess.run(
        [sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=20
    )
    return f"{child.pid} {out.stdout.strip()}"


def spawned_span(op: str) -> None:
    import swmp

    with swmp.entry_span(op):
        swmp.tag("pid", str(os.getpid()))


sanic_app = _sanic_app() if os.environ.get("SWMP_TEST_SANIC") else None


if __name__ == "__main__":
    if sys.argv[1] == "tornado":
        tornado_main(int(sys.argv[2]))
