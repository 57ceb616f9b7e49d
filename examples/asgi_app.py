"""The same routes as ``examples/app.py`` as a Starlette (ASGI) application.

    swmp run -- gunicorn -k uvicorn.workers.UvicornWorker -w 4 -b 127.0.0.1:8000 examples.asgi_app:app

``/call`` makes its outbound call with ``httpx.AsyncClient`` (traced as an exit span).
"""

from __future__ import annotations

import asyncio
import hashlib
import os

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

DOWNSTREAM_URL = os.environ.get("DOWNSTREAM_URL", "http://127.0.0.1:8000/cpu")
CPU_ITERATIONS = int(os.environ.get("CPU_ITERATIONS", "200"))


def _reply(text: str) -> PlainTextResponse:
    return PlainTextResponse(text, headers={"X-Worker-Pid": str(os.getpid())})


async def cpu(_: Request) -> PlainTextResponse:
    digest = b"swmp"
    for _i in range(CPU_ITERATIONS):
        digest = hashlib.sha256(digest).digest()
    return _reply(digest.hex())


async def io(_: Request) -> PlainTextResponse:
    await asyncio.sleep(0.002)
    return _reply("ok")


async def call(_: Request) -> PlainTextResponse:
    async with httpx.AsyncClient(timeout=10) as client:
        resp = await client.get(DOWNSTREAM_URL)
    return _reply(f"downstream said {resp.status_code}")


async def pid(_: Request) -> PlainTextResponse:
    return _reply(str(os.getpid()))


app = Starlette(
    routes=[Route("/cpu", cpu), Route("/io", io), Route("/call", call), Route("/pid", pid)],
)
