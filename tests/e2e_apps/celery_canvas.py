"""Celery canvas (chord, chain, group) with a result backend, for tests/test_prefork_celery.py.

The worker side: ``celery -A tests.e2e_apps.celery_canvas worker ...`` (broker
``CELERY_BROKER_URL``, result backend ``CELERY_RESULT_BACKEND``, queue ``CELERY_QUEUE``).
The publisher side, run under ``swmp run``:

    python -m tests.e2e_apps.celery_canvas N OUT.json

sends, inside one entry span ``/canvas`` (a trace of its own), a chord of ``N`` ``add``
tasks whose callback is ``tsum``, a chain ``add(1, 2) | add(10)`` and a group of three
``add``; waits for their results and writes them to ``OUT.json`` with the trace id. Nothing
here but the manual span knows about the agent.
"""

from __future__ import annotations

import json
import os
import sys

from celery import Celery, chain, chord, group

app = Celery(
    "tests.e2e_apps.celery_canvas",
    broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"),
    backend=os.environ.get("CELERY_RESULT_BACKEND", "redis://127.0.0.1:6379/1"),
)
app.conf.update(
    task_default_queue=os.environ.get("CELERY_QUEUE", "celery"),
    broker_connection_retry_on_startup=True,
    result_expires=600,
)


@app.task(name="canvas.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="canvas.tsum")
def tsum(numbers: list[int]) -> int:
    return sum(numbers)


def main(argv: list[str]) -> int:
    from swmp.tracing.context import new_entry_span

    n, out = int(argv[0]), argv[1]
    with new_entry_span("/canvas") as span:
        trace_id = span.trace_id
        chord_result = chord([add.s(i, i) for i in range(n)])(tsum.s())
        chain_result = chain(add.s(1, 2), add.s(10)).apply_async()
        group_result = group(add.s(i, 100) for i in range(3)).apply_async()
    results = {
        "trace_id": trace_id,
        "chord": chord_result.get(timeout=60),
        "chain": chain_result.get(timeout=60),
        "group": group_result.get(timeout=60),
    }
    with open(out + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(out + ".tmp", out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
