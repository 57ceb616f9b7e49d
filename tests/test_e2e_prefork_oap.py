"""Prefork servers under ``swmp run`` against a real SkyWalking OAP 10.1.0.

Gunicorn (4 sync workers, reporting over gRPC) and uWSGI (master + 4 workers, reporting
over HTTP) serve a small Flask app (``tests/e2e_apps/prefork_app.py``) under real HTTP
load, spread so that every worker serves some of it. The server is then stopped the way an
operator does (Gunicorn: SIGTERM to the master; uWSGI 2.0: SIGINT, as its SIGTERM reloads),
and the test checks that nothing of the agent is left (no reporter or supervisor process
for that master, no arena file) and that the OAP's GraphQL shows the service, one instance
per worker named ``<base>-w0..w3`` with that worker's pid, and one trace per request.
"""

from __future__ import annotations

import signal
from collections import Counter
from functools import partial
from pathlib import Path

import pytest

from tests.oap_graphql import BasicTrace, Instance, wait_for
from tests.realpeers import OapServer, free_ports, unique_name
from tests.servers import (
    Result,
    Server,
    agent_env,
    gunicorn_command,
    load,
    run_server,
    uwsgi_command,
    wait_until,
)
from tests.test_e2e_oap import running

pytestmark = [pytest.mark.e2e, pytest.mark.servers, pytest.mark.timeout(240)]

APP = "tests.e2e_apps.prefork_app:app"
WORKERS = 4
TOTAL = 200  # requests in the first round
MORE = 50  # requests per extra round, should a worker not have served yet
MAX_ROUNDS = 6
DATA_TIMEOUT = 90.0

SERVERS = [
    pytest.param("gunicorn", "grpc", signal.SIGTERM, id="gunicorn-grpc"),
    pytest.param("uwsgi", "http", signal.SIGINT, id="uwsgi-http"),
]


def backend_of(oap: OapServer, protocol: str) -> str:
    return oap.grpc if protocol == "grpc" else oap.rest.removeprefix("http://")


def load_every_worker(srv: Server, workers: set[int]) -> list[Result]:
    """``TOTAL`` requests 8 at a time, plus bounded extra rounds until every worker served some.

    Eight concurrent clients against four sync workers that each sleep 10 ms per request
    spread the load in practice; the extra rounds keep the test deterministic anyway.
    """
    results = load(srv.port, ["/pid"], TOTAL, concurrency=8, traced_every=0)
    for _ in range(MAX_ROUNDS):
        if {r.worker_pid for r in results} >= workers:
            break
        results += load(srv.port, ["/pid"], MORE, concurrency=8, traced_every=0)
    return results


def stop_and_check_cleanup(srv: Server, sig: int) -> None:
    """Stop the master with ``sig``; the agent's processes and arena must go with it."""
    srv.proc.send(sig)
    code = srv.proc.wait_exit(60)
    assert code is not None, f"{srv.kind} master did not exit on {sig!r}:\n{srv.proc.tail()}"
    wait_until(
        lambda: not srv.named_processes("swmp-"), 30, "no swmp reporter/supervisor left for the master"
    )
    wait_until(lambda: not srv.arena_path().exists(), 30, f"the arena {srv.arena_path()} removed")
    assert srv.arena_files() == []
    left = running(srv.proc.family())
    assert left == [], f"processes of the stopped {srv.kind} still running: {left}"


@pytest.mark.parametrize(("kind", "protocol", "stop_signal"), SERVERS)
def test_prefork_workers_report_to_the_oap(
    kind: str, protocol: str, stop_signal: int, oap_server: OapServer, tmp_path: Path
) -> None:
    service = unique_name(f"e2e-{kind}")
    base = f"{service}-inst"
    env = agent_env(
        tmp_path,
        backend_of(oap_server, protocol),
        service=service,
        instance=base,
        extra={"SW_AGENT_PROTOCOL": protocol},
    )
    port = free_ports(1)[0]
    if kind == "gunicorn":
        cmd = gunicorn_command(port, app=APP, workers=WORKERS, worker_class="sync")
    else:
        cmd = uwsgi_command(port, module=APP, workers=WORKERS)
    q = oap_server.query
    names = {f"{base}-w{i}" for i in range(WORKERS)}
    with run_server(kind, tmp_path, cmd, env, port=port, workers=WORKERS, name=service) as srv:
        workers = set(srv.worker_pids())
        assert len(workers) == WORKERS, srv.proc.tail()
        assert len(srv.reporters()) == 1, srv.proc.tail()
        results = load_every_worker(srv, workers)

        # While the workers live: one instance per worker, named after its ring slot and
        # announced with its pid and slot.
        service_id = wait_for(lambda: q.service_id(service), DATA_TIMEOUT, what=f"service {service}")

        def announced() -> list[Instance] | None:
            found = q.instances(service_id)
            done = {i.name for i in found} == names and all(i.attributes.get("Process No.") for i in found)
            return found if done else None

        instances = wait_for(announced, DATA_TIMEOUT, what=f"instances {sorted(names)} with their properties")

        # A last burst right before the stop: its segments can only arrive through the
        # shutdown path (workers' exit, the reporter's final drain).
        results += load(srv.port, ["/pid"], MORE, concurrency=8, traced_every=0)
        stop_and_check_cleanup(srv, stop_signal)

    # Every request answered by one of the four workers, each with its own trace.
    assert all(r.status == 200 for r in results), Counter((r.status, r.error) for r in results)
    served: dict[str, int] = {}  # trace id -> pid of the worker that served it
    for r in results:
        body_pid, trace_id = r.body.decode().split()
        assert int(body_pid) == r.worker_pid
        served[trace_id] = r.worker_pid
    assert len(served) == len(results)  # trace ids unique across the forked workers
    assert set(served.values()) == workers, Counter(served.values())

    by_pid = {int(i.attributes["Process No."]): i for i in instances}
    assert set(by_pid) == workers, {i.name: i.attributes for i in instances}
    for inst in instances:
        assert inst.language == "PYTHON"
        assert inst.name == f"{base}-w{inst.attributes.get('slot')}", inst

    # Every request's segment is stored, and nothing else.
    def all_stored() -> list[BasicTrace] | None:
        found = q.traces(service_id, page_size=len(results) + 50)
        return found if len(found) >= len(results) else None

    briefs = wait_for(all_stored, DATA_TIMEOUT, what=f"{len(results)} segments")
    assert len(briefs) == len(results)
    assert len({b.segment_id for b in briefs}) == len(briefs)
    assert {t for b in briefs for t in b.trace_ids} == set(served)
    assert {(b.endpoint_names, b.is_error) for b in briefs} == {(("/pid",), False)}

    # A request's span carries the instance of the worker that served it (one per worker).
    for pid in sorted(workers):
        trace_id = next(t for t, p in served.items() if p == pid)
        spans = wait_for(partial(q.trace, trace_id), DATA_TIMEOUT, what=f"trace {trace_id}")
        assert [(s.type, s.layer, s.component, s.operation_name) for s in spans] == [
            ("Entry", "Http", "Flask", "/pid")
        ]
        assert spans[0].service_instance_name == by_pid[pid].name
        assert spans[0].tags.get("http.status_code") == "200"
