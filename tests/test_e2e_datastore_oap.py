"""Database and cache spans end to end: a Flask app under ``swmp run -- gunicorn -w 4``
queries the real PostgreSQL and Redis of ``tests/daemons.py`` on every request and reports
to a real SkyWalking OAP. Read back over GraphQL: each request's trace holds the entry span
plus a PostgreSQL exit span (layer Database, component Psycopg) and a Redis exit span
(layer Cache, component Redis), and the OAP's topology of the service shows the database
and the cache as the services it calls."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import ServerInfo
from tests.oap_graphql import wait_for
from tests.realpeers import OapServer, free_ports, unique_name
from tests.servers import agent_env, gunicorn_command, load, run_server
from tests.test_e2e_prefork_oap import stop_and_check_cleanup

pytestmark = [pytest.mark.e2e, pytest.mark.servers, pytest.mark.timeout(240)]

APP = "tests.e2e_apps.datastore_app:app"
WORKERS = 4
REQUESTS = 40
DATA_TIMEOUT = 90.0

TOPOLOGY = (
    "query($s:ID!,$d:Duration!){ getServiceTopology(serviceId:$s, duration:$d)"
    "{ nodes{ id name type isReal layers } calls{ source target detectPoints } } }"
)


def test_database_and_cache_spans_reach_the_oap(
    oap_server: OapServer, postgres_server: ServerInfo, redis_server: ServerInfo, tmp_path: Path
) -> None:
    pg, rd = postgres_server, redis_server
    service = unique_name("e2e-datastore")
    env = agent_env(
        tmp_path,
        oap_server.grpc,
        service=service,
        extra={
            "DS_PG_DSN": f"host={pg.host} port={pg.port} user={pg.user} "
            f"password={pg.password} dbname={pg.database}",
            "DS_REDIS_PORT": str(rd.port),
        },
    )
    port = free_ports(1)[0]
    cmd = gunicorn_command(port, app=APP, workers=WORKERS, worker_class="sync")
    with run_server("gunicorn", tmp_path, cmd, env, port=port, workers=WORKERS, name=service) as srv:
        results = load(srv.port, ["/order"], REQUESTS, concurrency=4, traced_every=0)
        assert all(r.status == 200 for r in results), [(r.status, r.error, r.body[:200]) for r in results]
        stop_and_check_cleanup(srv, signal.SIGTERM)

    trace_ids = [r.body.decode().split()[1] for r in results]
    q = oap_server.query
    service_id = wait_for(lambda: q.service_id(service), DATA_TIMEOUT, what=f"service {service}")

    # One request's whole trace: entry, then the two exits with the SkyWalking shape.
    spans = wait_for(lambda: q.trace(trace_ids[-1]) or None, DATA_TIMEOUT, what="the last request's trace")
    by_layer = {s.layer: s for s in spans}
    assert {s.type for s in spans} == {"Entry", "Exit"}, spans
    db, cache = by_layer["Database"], by_layer["Cache"]
    assert (db.type, db.operation_name, db.peer) == (
        "Exit",
        "PostgreSQL/Psycopg/execute",
        f"127.0.0.1:{pg.port}",
    )
    assert db.component == "Psychopg"  # component-libraries.yml's spelling of id 7010
    assert db.tags["db.type"] == "PostgreSQL"
    assert db.tags["db.instance"] == pg.database
    assert db.tags["db.statement"] == "SELECT count(*) FROM pg_class WHERE relkind = %s"
    assert (cache.type, cache.operation_name, cache.peer) == ("Exit", "Redis/INCRBY", f"127.0.0.1:{rd.port}")
    assert cache.component == "Redis"
    assert (cache.tags["cache.type"], cache.tags["cache.op"], cache.tags["cache.key"]) == (
        "Redis",
        "write",
        "e2e:orders",
    )
    entry = next(s for s in spans if s.type == "Entry")
    assert db.parent_span_id == cache.parent_span_id == entry.span_id

    # The topology: the service calls the database and the cache, both as services.
    def topology() -> dict[str, Any] | None:
        data = q.gql(TOPOLOGY, {"s": service_id, "d": q.duration(15)})["getServiceTopology"]
        layers = {n["name"]: n["layers"] for n in data["nodes"]}
        wanted = (f"127.0.0.1:{pg.port}", f"127.0.0.1:{rd.port}")
        # A node can show up (from the call metrics) before the OAP has stored the service
        # record that carries its layer: until then it reads UNDEFINED, so wait for the layer.
        known = all(layers.get(name, ["UNDEFINED"]) != ["UNDEFINED"] for name in wanted)
        return data if known and len(data["calls"]) >= 2 else None

    topo = wait_for(topology, DATA_TIMEOUT, what="database and cache nodes with their layers")
    nodes = {n["name"]: n for n in topo["nodes"]}
    db_node, cache_node = nodes[f"127.0.0.1:{pg.port}"], nodes[f"127.0.0.1:{rd.port}"]
    assert not db_node["isReal"] and not cache_node["isReal"]
    # (The servers are shared by the test session: another test's Celery may use this Redis
    # as its broker, which adds VIRTUAL_MQ to the same node.)
    assert db_node["type"] == "PostgreSQL" and "VIRTUAL_DATABASE" in db_node["layers"], db_node
    assert cache_node["type"] == "Redis" and "VIRTUAL_CACHE" in cache_node["layers"], cache_node
    own = next(n["id"] for n in topo["nodes"] if n["name"] == service)
    called = {c["target"] for c in topo["calls"] if c["source"] == own}
    assert {db_node["id"], cache_node["id"]} <= called
    assert f"127.0.0.1:{pg.port}" in {s.name for s in q.services("VIRTUAL_DATABASE")}
    assert f"127.0.0.1:{rd.port}" in {s.name for s in q.services("VIRTUAL_CACHE")}
