"""A small Flask application for trying swmp under a prefork server.

    swmp run -- gunicorn -w 4 -b 127.0.0.1:8000 examples.app:app

Routes: ``/cpu`` (about 100 us of work), ``/io`` (2 ms of blocking I/O), ``/call`` (an
outbound HTTP call to ``DOWNSTREAM_URL``, default this app's own ``/cpu``), ``/error``.
"""

from __future__ import annotations

import hashlib
import os
import time
import urllib.request

from flask import Flask

app = Flask(__name__)
DOWNSTREAM_URL = os.environ.get("DOWNSTREAM_URL", "http://127.0.0.1:8000/cpu")


def _work(iterations: int = 60) -> str:
    digest = b"swmp"
    for _ in range(iterations):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()


@app.route("/cpu")
def cpu() -> str:
    return _work()


@app.route("/io")
def io() -> str:
    time.sleep(0.002)
    return "ok"


@app.route("/call")
def call() -> str:
    with urllib.request.urlopen(DOWNSTREAM_URL, timeout=5) as resp:
        return f"downstream said {resp.status}"


@app.route("/error")
def error() -> str:
    raise RuntimeError("example failure")


@app.route("/pid")
def pid() -> str:
    return str(os.getpid())
