"""A small Flask application for trying swmp under a prefork server.

    swmp run -- gunicorn -w 4 -b 127.0.0.1:8000 examples.app:app

Routes: ``/cpu`` (about 100 us of hashing), ``/io`` (2 ms of blocking I/O), ``/call`` (an
outbound HTTP call to ``DOWNSTREAM_URL``, default this app's own ``/cpu``, passing on the
query string; a downstream error status fails the call), ``/error``,
``/pid`` and ``/sleep?s=SECONDS`` (for worker-timeout experiments). Every response names
the worker that produced it in an ``X-Worker-Pid`` header.

Nothing here knows about the agent: ``swmp run`` (or a start call elsewhere, see
``examples/started_app.py`` and ``examples/gunicorn_conf.py``) instruments Flask.
"""

from __future__ import annotations

import hashlib
import os
import time
import urllib.request

from flask import Flask, Response, request

app = Flask(__name__)
DOWNSTREAM_URL = os.environ.get("DOWNSTREAM_URL", "http://127.0.0.1:8000/cpu")
CPU_ITERATIONS = int(os.environ.get("CPU_ITERATIONS", "200"))  # ~100 us on a 2020s core


def _work(iterations: int = CPU_ITERATIONS) -> str:
    digest = b"swmp"
    for _ in range(iterations):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()


@app.after_request
def _name_worker(resp: Response) -> Response:
    resp.headers["X-Worker-Pid"] = str(os.getpid())
    return resp


@app.route("/cpu")
def cpu() -> str:
    return _work()


@app.route("/io")
def io() -> str:
    time.sleep(0.002)
    return "ok"


@app.route("/call")
def call() -> str:
    url = DOWNSTREAM_URL
    if request.query_string:
        url += ("&" if "?" in url else "?") + request.query_string.decode("latin-1")
    with urllib.request.urlopen(url, timeout=10) as resp:
        return f"downstream said {resp.status}"


@app.route("/error")
def error() -> str:
    raise RuntimeError("example failure")


@app.route("/pid")
def pid() -> str:
    return str(os.getpid())


@app.route("/sleep")
def sleep() -> str:
    time.sleep(float(request.args.get("s", "1")))
    return "slept"
