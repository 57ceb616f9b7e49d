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
import time
from typing import Any

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


def _when_ready(result: Any, timeout: float = 60.0) -> Any:
    """The result's value once the backend holds it, read by polling its meta key.

    Why not ``result.get()`` alone: with the Redis result backend it waits on a pub/sub
    subscription, and once in a few runs the chain's result, stored by the worker while the
    publisher was still waiting for the chord, never reached it (every task had succeeded).
    ``ready()`` reads the stored state directly; ``get()`` then returns it from the cache."""
    deadline = time.monotonic() + timeout
    while not result.ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no result for {result!r} within {timeout} s")
        time.sleep(0.05)
    return result.get(timeout=timeout)


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
        "chord": _when_ready(chord_result),
        "chain": _when_ready(chain_result),
        "group": _when_ready(group_result),
    }
    with open(out + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(out + ".tmp", out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
