"""A chord on a result backend without native chord support, for tests/test_celery_chord_unlock.py.

With such a backend (the SQLAlchemy database backend here: ``CELERY_RESULT_BACKEND`` =
``db+sqlite:///...``) Celery does not send the callback from the last header task; it
publishes ``celery.chord_unlock``, which retries itself every
``result_chord_retry_interval`` until the header group is ready, then sends the callback.

The worker side: ``celery -A tests.e2e_apps.celery_chord_unlock worker ...`` (broker
``CELERY_BROKER_URL``, queue ``CELERY_QUEUE``). The header tasks wait until
``chord_unlock`` has asked for a retry ``CHORD_GATE_RETRIES`` times (each retry leaves a
file in ``CHORD_GATE_DIR``), so that the polling path is taken however fast the machine is;
the worker needs a free child for ``chord_unlock`` while the header tasks wait (more
children than header tasks). The publisher side, run under ``swmp run``:

    python -m tests.e2e_apps.celery_chord_unlock N OUT.json

sends, inside one entry span ``/chord`` (a trace of its own), a chord of ``N`` ``add``
tasks whose callback is ``tsum``; waits for its result and writes it to ``OUT.json`` with the
trace id. Nothing here but the manual span knows about the agent.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from typing import Any

from celery import Celery, chord
from celery.signals import task_retry

app = Celery(
    "tests.e2e_apps.celery_chord_unlock",
    broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"),
    backend=os.environ.get("CELERY_RESULT_BACKEND", "db+sqlite:///results.db"),
)
app.conf.update(
    task_default_queue=os.environ.get("CELERY_QUEUE", "celery"),
    broker_connection_retry_on_startup=True,
    result_expires=600,
    result_chord_retry_interval=0.1,  # chord_unlock's retry countdown (Celery's default: 1 s)
)

GATE_DIR = os.environ.get("CHORD_GATE_DIR", "")
GATE_RETRIES = int(os.environ.get("CHORD_GATE_RETRIES", "2"))
GATE_TIMEOUT = 30.0  # the header tasks go on anyway; the test then finds too few retries


@task_retry.connect
def _count_unlock_retries(sender: Any = None, **_: Any) -> None:
    if GATE_DIR and getattr(sender, "name", "") == "celery.chord_unlock":
        open(os.path.join(GATE_DIR, f"retry-{uuid.uuid4().hex}"), "w").close()


@app.task(name="unlock.add")
def add(x: int, y: int) -> int:
    deadline = time.monotonic() + GATE_TIMEOUT
    while GATE_DIR and len(os.listdir(GATE_DIR)) < GATE_RETRIES and time.monotonic() < deadline:
        time.sleep(0.02)
    return x + y


@app.task(name="unlock.tsum")
def tsum(numbers: list[int]) -> int:
    return sum(numbers)


def main(argv: list[str]) -> int:
    from swmp.tracing.context import new_entry_span

    n, out = int(argv[0]), argv[1]
    with new_entry_span("/chord") as span:
        trace_id = span.trace_id
        result = chord([add.s(i, i) for i in range(n)])(tsum.s())
    results = {"trace_id": trace_id, "chord": result.get(timeout=60)}
    with open(out + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(out + ".tmp", out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
