"""A Celery application and a Flask front end that enqueues its tasks, for trying swmp.

    swmp run -- celery -A examples.celery_app worker --pool prefork -c 4
    swmp run -- gunicorn -w 2 -b 127.0.0.1:8000 examples.celery_app:web
    curl 'http://127.0.0.1:8000/enqueue?n=3'

Broker: ``CELERY_BROKER_URL`` (default ``redis://127.0.0.1:6379/0``); queue:
``CELERY_QUEUE`` (default ``celery``); ``CELERY_BEAT_EVERY=SECONDS`` gives ``celery beat`` a
schedule (``work`` every so many seconds). Results are not stored (no result backend): the web
side answers with the ids of the tasks it sent. Tasks: ``work`` (a little CPU),
``sleep`` (seconds; writes its pid to ``<marker>`` first, so a test knows which process
runs it), ``fail`` (raises), ``flaky`` (asks for one retry, then succeeds), ``fanout``
(a group of ``work`` sent from inside a task). Nothing here knows about the agent.
"""

from __future__ import annotations

import hashlib
import os
import time

from celery import Celery, group
from flask import Flask, jsonify, request

app = Celery("examples.celery_app", broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_default_queue=os.environ.get("CELERY_QUEUE", "celery"),
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
)
if os.environ.get("CELERY_BEAT_EVERY"):  # for `celery beat`: send `work` every so many seconds
    app.conf.beat_schedule = {
        "work": {"task": "examples.work", "schedule": float(os.environ["CELERY_BEAT_EVERY"]), "args": (1,)}
    }


class FlakyError(RuntimeError):
    pass


@app.task(name="examples.work")
def work(i: int, iterations: int = 200) -> str:
    digest = str(i).encode()
    for _ in range(iterations):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:8]


@app.task(name="examples.sleep")
def sleep(seconds: float, marker: str = "") -> float:
    if marker:
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
    time.sleep(seconds)
    return seconds


@app.task(name="examples.fail")
def fail(message: str) -> None:
    raise ValueError(message)


@app.task(name="examples.flaky", bind=True, max_retries=3)
def flaky(self: object, x: int) -> int:
    if self.request.retries == 0:  # type: ignore[attr-defined]
        raise self.retry(exc=FlakyError(f"first attempt of {x}"), countdown=0.1)  # type: ignore[attr-defined]
    return x


@app.task(name="examples.fanout")
def fanout(n: int) -> None:
    group(work.s(i) for i in range(n)).apply_async()


web = Flask(__name__)


@web.route("/enqueue")
def enqueue() -> object:
    """Send ``n`` ``work`` tasks (default 1); ``?task=sleep&s=0.5&marker=PATH`` sends ``sleep``."""
    n = int(request.args.get("n", "1"))
    if request.args.get("task") == "sleep":
        seconds, marker = float(request.args.get("s", "0.5")), request.args.get("marker", "")
        sent = [sleep.delay(seconds, marker) for _ in range(n)]
    else:
        sent = [work.delay(i) for i in range(n)]
    resp = jsonify([r.id for r in sent])
    resp.headers["X-Worker-Pid"] = str(os.getpid())
    return resp
