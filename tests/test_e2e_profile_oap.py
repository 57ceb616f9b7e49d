"""Profiling against a real SkyWalking OAP 10.1.0, in every worker of a prefork server.

A task is created through GraphQL on ``/slow`` of an app served by four workers under
``swmp run`` (Gunicorn: sync Flask workers with the reporter process or with
``SW_AGENT_REPORTER_PROCESS=false``, gevent workers, the Uvicorn worker with an ASGI app;
uWSGI's prefork workers, which enable threads by default since 2.0.26; and, on a Celery task's
endpoint, a Celery prefork worker's four pool children). Under load, the
OAP must list profiled segments from every worker, its analysis must return stack trees
naming the slow function, and no snapshot may lie after its segment's end.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.celery_support import new_queue, run_celery, worker_command
from tests.daemons import ServerInfo
from tests.oap_graphql import wait_for
from tests.oap_profile import (
    ProfiledSegment,
    analyze,
    create_task,
    profiled_segments,
    snapshot_count,
    task_logs,
)
from tests.realpeers import OapServer, free_ports, unique_name
from tests.servers import agent_env, gunicorn_command, load, run_server, uwsgi_command

pytestmark = [pytest.mark.e2e, pytest.mark.servers, pytest.mark.timeout(240)]

WORKERS = 4
MAX_SAMPLING = 3  # per worker (each worker is an instance)
DATA_TIMEOUT = 90.0

WSGI_APP = "tests.e2e_apps.profile_app:wsgi"
ASGI_APP = "tests.e2e_apps.profile_app:asgi"


@dataclass(frozen=True)
class Case:
    worker_class: str
    app: str
    reporter_process: bool
    slow_function: str  # what the stack trees must name
    server: str = "gunicorn"


CASES = [
    pytest.param(Case("sync", WSGI_APP, True, "sluggish_report_builder"), id="sync-process"),
    pytest.param(Case("sync", WSGI_APP, False, "sluggish_report_builder"), id="sync-thread"),
    pytest.param(Case("gevent", WSGI_APP, True, "sluggish_report_builder"), id="gevent"),
    pytest.param(
        Case("uvicorn.workers.UvicornWorker", ASGI_APP, True, "sluggish_async_report_builder"),
        id="uvicorn-asgi",
    ),
    pytest.param(Case("prefork", WSGI_APP, True, "sluggish_report_builder", "uwsgi"), id="uwsgi"),
]


def task_notified_to(oap_server: OapServer, service: str, endpoint: str, names: set[str]) -> str:
    """A profile task on ``endpoint`` of ``service`` (once the OAP knows the service), returned
    once every instance of ``names`` was notified of it (the OAP caches tasks ~10 s; the
    agents poll every second)."""
    q = oap_server.query
    service_id = wait_for(lambda: q.service_id(service), DATA_TIMEOUT, what=f"service {service}")
    task_id = create_task(
        q,
        service_id,
        endpoint,
        duration_min=1,
        min_duration_ms=50,
        dump_period_ms=10,
        max_sampling_count=MAX_SAMPLING,
    )

    def notified() -> set[str] | None:
        got = {name for name, op in task_logs(q, task_id) if op == "NOTIFIED"}
        return got if got >= names else None

    wait_for(notified, DATA_TIMEOUT, what="every instance notified of the task")
    return task_id


@pytest.mark.parametrize("case", CASES)
def test_profile_task_samples_every_worker(case: Case, oap_server: OapServer, tmp_path: Path) -> None:
    service = unique_name("e2e-profile")
    base = f"{service}-inst"
    env = agent_env(
        tmp_path,
        oap_server.grpc,
        service=service,
        instance=base,
        reporter_process=case.reporter_process,
        extra={"SW_AGENT_PROFILE_ACTIVE": "true", "SW_AGENT_COLLECTOR_GET_PROFILE_TASK_INTERVAL": "1"},
    )
    port = free_ports(1)[0]
    if case.server == "uwsgi":
        cmd = uwsgi_command(port, module=case.app, workers=WORKERS)
    else:
        cmd = gunicorn_command(port, app=case.app, workers=WORKERS, worker_class=case.worker_class)
    q = oap_server.query
    names = {f"{base}-w{i}" for i in range(WORKERS)}
    with run_server(case.server, tmp_path, cmd, env, port=port, workers=WORKERS, name=service) as srv:
        workers = set(srv.worker_pids())
        fast = load(srv.port, ["/fast"], 40, concurrency=8, traced_every=0)
        assert all(r.status == 200 for r in fast), fast[:3]
        task_id = task_notified_to(oap_server, service, "/slow", names)

        seen: dict[str, object] = {}

        def profiled_everywhere() -> list[ProfiledSegment] | None:
            results = load(srv.port, ["/slow"], 24, concurrency=8, traced_every=0)
            assert all(r.status == 200 for r in results), results[:3]
            found = seen["segments"] = profiled_segments(q, task_id)
            return found if {s.instance_name for s in found} >= names else None

        try:
            segments = wait_for(profiled_everywhere, DATA_TIMEOUT, what="profiled segments from every worker")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; found {seen.get('segments')}\n{srv.proc.tail(60)}") from None
        assert {r.worker_pid for r in fast} <= workers

    # At most MAX_SAMPLING segments per worker instance.
    per_instance = {n: sum(1 for s in segments if s.instance_name == n) for n in names}
    assert all(1 <= c <= MAX_SAMPLING for c in per_instance.values()), per_instance
    for seg in segments:
        assert seg.end_ms - seg.start_ms >= 250, seg  # the slow endpoint's segments only

        def trees(seg: ProfiledSegment = seg) -> list[list[dict[str, object]]] | None:
            found = analyze(q, seg.segment_id, seg.start_ms, seg.end_ms)
            return found or None

        found = wait_for(trees, DATA_TIMEOUT, what=f"stack trees of segment {seg.segment_id}")
        signatures = [str(e["codeSignature"]) for tree in found for e in tree]
        assert any(f".{case.slow_function}:" in s for s in signatures), signatures[:20]
        # Every snapshot of the segment was dumped within it: the analysis of [start, end]
        # covers as many as that of ten minutes either side. (The OAP answers a range that
        # holds no snapshot with the segment's first one, so "after the end" cannot be
        # queried as such.)
        wide = analyze(q, seg.segment_id, seg.start_ms - 600_000, seg.end_ms + 600_000)
        assert snapshot_count(found) == snapshot_count(wide) >= 1, (seg, found, wide)


def test_profile_task_samples_every_celery_child(
    oap_server: OapServer, redis_server: ServerInfo, tmp_path: Path
) -> None:
    """A profile task on a Celery task's endpoint (``celery/examples.work``) reaches each of
    the four prefork pool children (each its own instance), and the OAP lists profiled runs
    from every child whose stack trees name the task's function."""
    from celery import Celery

    from swmp.instrument._patch import original

    service = unique_name("e2e-profile-cel")
    base = f"{service}-inst"
    broker, queue = f"redis://127.0.0.1:{redis_server.port}/13", new_queue()
    env = agent_env(
        tmp_path,
        oap_server.grpc,
        service=service,
        instance=base,
        extra={
            "CELERY_BROKER_URL": broker,
            "CELERY_QUEUE": queue,
            "SW_AGENT_PROFILE_ACTIVE": "true",
            "SW_AGENT_COLLECTOR_GET_PROFILE_TASK_INTERVAL": "1",
        },
    )
    app = Celery("profile-publisher", broker=broker, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = True
    send = original(Celery, "send_task")  # this test process publishes without the agent
    q = oap_server.query
    names = {f"{base}-w{i}" for i in range(WORKERS)}

    def publish(n: int, iterations: int) -> None:
        for i in range(n):
            send(app, "examples.work", (i, iterations), queue=queue)

    with run_celery(tmp_path, env, worker_command("prefork", WORKERS), children=WORKERS) as worker:
        publish(8, 10)
        task_id = task_notified_to(oap_server, service, "celery/examples.work", names)
        seen: dict[str, object] = {}

        def profiled_everywhere() -> list[ProfiledSegment] | None:
            publish(8, 400_000)  # ~0.2 s of hashing each
            found = seen["segments"] = profiled_segments(q, task_id)
            return found if {s.instance_name for s in found} >= names else None

        try:
            segments = wait_for(profiled_everywhere, DATA_TIMEOUT, what="profiled runs from every child")
        except AssertionError as exc:
            log = worker.proc.log()[-3000:]
            raise AssertionError(f"{exc}; found {seen.get('segments')}\n{log}") from None
    app.close()
    for seg in segments[:WORKERS]:

        def trees(seg: ProfiledSegment = seg) -> list[list[dict[str, object]]] | None:
            return analyze(q, seg.segment_id, seg.start_ms, seg.end_ms) or None

        found = wait_for(trees, DATA_TIMEOUT, what=f"stack trees of segment {seg.segment_id}")
        signatures = [str(e["codeSignature"]) for tree in found for e in tree]
        assert any(".work:" in s for s in signatures), signatures[:20]
