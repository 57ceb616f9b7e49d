"""Publish ``examples.work`` tasks without the agent, each continuing a trace of our own.

    python -m tests.e2e_apps.celery_publish BROKER QUEUE[,QUEUE...] N OUT.json

``N`` tasks to each queue. Every task carries an ``sw8`` header naming a fresh trace id (and a made-up parent
segment ``client-segment``), so a test can match each task to the segment the worker
reports for it. Writes ``{queue: {task id: trace id}}`` to ``OUT.json``.
"""

from __future__ import annotations

import json
import sys
import uuid

from celery import Celery

from tests.servers import sw8_header


def main(argv: list[str]) -> int:
    broker, queues, n, out = argv[0], argv[1].split(","), int(argv[2]), argv[3]
    app = Celery("publisher", broker=broker, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = True
    traces: dict[str, dict[str, str]] = {q: {} for q in queues}
    with app.producer_or_acquire() as producer:
        for queue in queues:
            for i in range(n):
                trace_id = uuid.uuid4().hex
                headers = {"sw8": sw8_header(trace_id)}
                sent = app.send_task("examples.work", (i,), queue=queue, producer=producer, headers=headers)
                traces[queue][sent.id] = trace_id
    with open(out, "w") as f:
        json.dump(traces, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
