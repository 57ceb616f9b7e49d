"""Web request -> Celery task, against a real SkyWalking OAP 10.1.0, read back through GraphQL.

A Flask app under Gunicorn (``swmp run``, 2 workers) enqueues ``examples.work`` tasks on a
real Redis; a prefork Celery worker (``swmp run``, 4 children) runs them; both report over
gRPC. Each request's trace, as the OAP stores it, must hold the request's entry span, one
MQ exit span per task sent, and one entry span per task run in the worker's service, on a
pool child's instance, linked to that exit span by a CrossProcess reference.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from tests.celery_support import celery_env, new_queue, run_celery, succeeded, wait_exit, worker_command
from tests.daemons import ServerInfo
from tests.oap_graphql import Span, wait_for
from tests.realpeers import OapServer, free_ports, unique_name
from tests.servers import gunicorn_command, load, run_server, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.servers, pytest.mark.timeout(240)]

REQUESTS = 12
TASKS_PER_REQUEST = 2
DATA_TIMEOUT = 90.0


def test_one_trace_spans_web_request_and_celery_tasks(
    oap_server: OapServer, redis_server: ServerInfo, tmp_path: Path
) -> None:
    web, cel = unique_name("e2e-web"), unique_name("e2e-cel")
    broker, queue = f"redis://127.0.0.1:{redis_server.port}/9", new_queue()
    env_w = celery_env(tmp_path / "cel", oap_server.grpc, broker, queue, service=cel)
    env_web = celery_env(tmp_path / "web", oap_server.grpc, broker, queue, service=web)
    port = free_ports(1)[0]
    with (
        run_celery(tmp_path, env_w, worker_command("prefork", 4), children=4) as worker,
        run_server(
            "gunicorn",
            tmp_path,
            gunicorn_command(port, app="examples.celery_app:web", workers=2),
            env_web,
            port=port,
            workers=2,
            name=web,
        ),
    ):
        children = set(worker.worker_pids())
        results = load(port, [f"/enqueue?n={TASKS_PER_REQUEST}"], REQUESTS, concurrency=4, traced_every=1)
        assert all(r.status == 200 for r in results), Counter((r.status, r.error) for r in results)
        total = REQUESTS * TASKS_PER_REQUEST
        wait_until(lambda: len(succeeded(worker)) >= total, 60, f"{total} tasks to succeed")
        worker.proc.send(signal.SIGTERM)
        assert wait_exit(worker) == 0

    q = oap_server.query
    cel_instances = {f"{cel}-w{i}" for i in range(4)}
    for r in results:

        def whole(trace_id: str = r.trace_id) -> list[Span] | None:
            spans = q.trace(trace_id)
            runs = [s for s in spans if s.service_code == cel]
            return spans if len(runs) == TASKS_PER_REQUEST else None

        spans = wait_for(whole, DATA_TIMEOUT, what=f"trace {r.trace_id} with its task runs")
        (request,) = [s for s in spans if s.service_code == web and s.type == "Entry"]
        assert request.operation_name == "/enqueue"
        sends = [s for s in spans if s.service_code == web and s.type == "Exit"]
        runs = [s for s in spans if s.service_code == cel]
        assert len(sends) == TASKS_PER_REQUEST
        for send in sends:
            assert (send.layer, send.component, send.operation_name) == (
                "MQ",
                "Celery",
                "celery/examples.work",
            )
            assert send.peer == f"127.0.0.1:{redis_server.port}"
            assert send.segment_id == request.segment_id
        linked = set()
        for run in runs:
            assert (run.type, run.layer, run.component) == ("Entry", "MQ", "Celery")
            assert run.operation_name == "celery/examples.work"
            assert run.service_instance_name in cel_instances
            assert run.segment_id != request.segment_id
            (ref,) = run.refs
            assert ref.type == "CROSS_PROCESS"
            assert ref.parent_segment_id == request.segment_id
            linked.add(ref.parent_span_id)
        assert linked == {s.span_id for s in sends}  # each send is continued exactly once
    assert children  # the worker had its pool children while the tasks ran
