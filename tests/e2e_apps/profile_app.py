"""Apps for the profiling end-to-end tests: one slow endpoint whose stack names its cause.

``wsgi`` (Flask, Gunicorn sync workers) and ``asgi`` (Starlette, the Uvicorn worker) both
serve ``/slow`` (about 300 ms in a function whose name the profile must show) and
``/fast``. Every answer carries ``X-Worker-Pid`` so a test can spread load over workers.
"""

from __future__ import annotations

import asyncio
import os
import time

from flask import Flask, Response
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

SLOW_S = 0.3

wsgi = Flask(__name__)


@wsgi.after_request
def _name_worker(resp: Response) -> Response:
    resp.headers["X-Worker-Pid"] = str(os.getpid())
    return resp


def sluggish_report_builder() -> None:
    deadline = time.monotonic() + SLOW_S
    while time.monotonic() < deadline:
        time.sleep(0.005)


@wsgi.route("/slow")
def slow() -> str:
    sluggish_report_builder()
    return "slow"


@wsgi.route("/fast")
def fast() -> str:
    return "fast"


async def sluggish_async_report_builder() -> None:
    await asyncio.sleep(SLOW_S)


async def slow_async(request: Request) -> PlainTextResponse:
    await sluggish_async_report_builder()
    return PlainTextResponse("slow", headers={"X-Worker-Pid": str(os.getpid())})


async def fast_async(request: Request) -> PlainTextResponse:
    return PlainTextResponse("fast", headers={"X-Worker-Pid": str(os.getpid())})


asgi = Starlette(routes=[Route("/slow", slow_async), Route("/fast", fast_async)])
