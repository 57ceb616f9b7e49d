"""A small Flask app for the prefork end-to-end tests (Gunicorn / uWSGI under ``swmp run``).

``/pid`` answers ``"<worker pid> <trace id>"`` and an ``X-Worker-Pid`` header, so a test
knows which worker served each request and which trace the agent gave it. The short
sleep keeps a worker busy long enough that concurrent clients spread over all workers.
"""

from __future__ import annotations

import os
import time

from flask import Flask, Response

import swmp

app = Flask(__name__)


@app.after_request
def _name_worker(resp: Response) -> Response:
    resp.headers["X-Worker-Pid"] = str(os.getpid())
    return resp


@app.route("/pid")
def pid() -> str:
    time.sleep(0.01)
    return f"{os.getpid()} {swmp.trace_id()}"
