"""A Flask app that configures logging the way applications do, for tests/test_logs_gunicorn.py.

At import (in each Gunicorn worker, after the agent started in the master) it applies a
Django-style ``dictConfig`` that configures the root logger, with a formatter that prints
``%(tid)s`` into ``APP_LOG_FILE``; it replaces loguru's default sink (``logger.remove()``),
and leaves structlog on its default configuration (printing, not stdlib). Each route logs
one WARNING through one path, with ``case=<route> key=<query key>`` in the message:

* ``/dictconfig``: a propagating stdlib logger under the dictConfig'ed root;
* ``/force``: after ``logging.basicConfig(force=True)``;
* ``/reset``: after the root logger's handlers were removed;
* ``/quiet``: a ``propagate=False`` logger, and ``gunicorn.error`` (also non-propagating);
* ``/loguru``, ``/structlog``: through their own APIs;
* ``/pool``, ``/thread``: from a ``ThreadPoolExecutor`` work item / a ``threading.Thread``,
  which also open a span (``swmp.local_span``) there.

Nothing here calls the agent except ``swmp.local_span`` in the threads.
"""

from __future__ import annotations

import logging
import logging.config
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import structlog
from flask import Flask, request
from loguru import logger as loguru_logger

import swmp

APP_LOG_FILE = os.environ.get("APP_LOG_FILE", os.devnull)

logging.config.dictConfig(
    {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"with_tid": {"format": "tid=%(tid)s %(levelname)s %(name)s %(message)s"}},
        "handlers": {
            "file": {"class": "logging.FileHandler", "filename": APP_LOG_FILE, "formatter": "with_tid"},
        },
        "root": {"level": "INFO", "handlers": ["file"]},
    }
)
loguru_logger.remove()
loguru_logger.add(sys.stderr, level="INFO")

quiet = logging.getLogger("app.quiet")
quiet.propagate = False
quiet.addHandler(logging.NullHandler())

app = Flask(__name__)
pool = ThreadPoolExecutor(max_workers=2)
_forced = threading.Lock()


def _key() -> str:
    return request.args.get("key", "")


@app.route("/dictconfig")
def dictconfig() -> str:
    logging.getLogger("app.views").warning("case=dictconfig key=%s", _key())
    return "ok"


@app.route("/force")
def force() -> str:
    with _forced:
        logging.basicConfig(force=True, level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("app.views").warning("case=force key=%s", _key())
    return "ok"


@app.route("/reset")
def reset() -> str:
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    logging.getLogger("app.views").warning("case=reset key=%s", _key())
    return "ok"


@app.route("/quiet")
def quiet_route() -> str:
    quiet.warning("case=quiet key=%s", _key())
    logging.getLogger("gunicorn.error").warning("case=gunicorn key=%s", _key())
    return "ok"


@app.route("/loguru")
def loguru_route() -> str:
    loguru_logger.warning("case=loguru key={}", _key())
    return "ok"


@app.route("/structlog")
def structlog_route() -> str:
    structlog.get_logger().warning("case=structlog", key=_key())
    return "ok"


def _background(case: str, key: str) -> None:
    with swmp.local_span(f"background/{case}"):
        logging.getLogger("app.background").warning("case=%s key=%s", case, key)


@app.route("/pool")
def pool_route() -> str:
    pool.submit(_background, "pool", _key()).result(timeout=10)
    return "ok"


@app.route("/thread")
def thread_route() -> str:
    t = threading.Thread(target=_background, args=("thread", _key()))
    t.start()
    t.join(10)
    return "ok"
