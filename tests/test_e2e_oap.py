"""One instrumented process against a real SkyWalking OAP 10.1.0, over gRPC, HTTP and Kafka.

Each case starts ``tests/e2e_apps/one_shot.py`` as its own Python process, the way a user
would (``swmp run -- python ...``, or a script that calls ``swmp.start()``), sends it one
HTTP request and lets it exit. The request's handler calls a second local endpoint, tags
its span, logs one line and fails. Then the OAP's GraphQL API must show exactly that: one
trace with the entry and exit spans (names, types, layer, components, tags, error flags,
peer), the service, the worker instance with its pid, and the log line linked to the
trace. The process exits right after answering, so whatever the agent still held must
survive that exit: the reporter drains it, then leaves and removes the arena.

Needs Java (the fixtures start the OAP and Kafka; see tests/realpeers.py and docs/e2e.md).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e_apps.one_shot import LOG_MARKER, TAG_KEY, TAG_VALUE
from tests.oap_graphql import LogRecord, Span, wait_for
from tests.realpeers import OapServer, free_ports, unique_name
from tests.servers import REPO_ROOT, SWMP_RUN, Proc, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

APP = REPO_ROOT / "tests" / "e2e_apps" / "one_shot.py"
# Component names as the OAP resolves the ids the agent sends (component-libraries.yml).
COMPONENT_NAMES = {"flask": ("Flask", "Requests"), "wsgi": ("Python", "Python")}
DATA_TIMEOUT = 90.0  # seconds for data to show in GraphQL (Kafka adds a consumer hop)


@dataclass(frozen=True)
class Case:
    protocol: str
    start: str  # "swmp-run": under the launcher; "swmp-start": the script calls swmp.start()
    framework: str  # "flask" (requests outbound) | "wsgi" (WSGIMiddleware, urllib outbound)

    @property
    def id(self) -> str:
        return f"{self.protocol}-{self.start}-{self.framework}"


CASES = [
    Case("grpc", "swmp-run", "flask"),
    Case("http", "swmp-start", "wsgi"),
    Case("kafka", "swmp-run", "flask"),
]


def agent_env(tmp: Path, case: Case, oap: OapServer, service: str, instance: str) -> dict[str, str]:
    """The application's environment: the user's SW_* settings and nothing of ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SW_", "SWMP_", "UWSGI_"))}
    arena_dir = tmp / "shm"
    arena_dir.mkdir()
    env.update(
        SW_AGENT_NAME=service,
        SW_AGENT_INSTANCE_NAME=instance,
        SW_AGENT_PROTOCOL=case.protocol,
        SW_AGENT_ARENA_DIR=str(arena_dir),
        PYTHONUNBUFFERED="1",
        # The app's downstream is an http.server in the same process standing in for another
        # service; the trace checked here is the app's own two spans.
        SW_AGENT_DISABLE_PLUGINS="http_server",
        PYTHONPATH=os.pathsep.join(
            [str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        ),
    )
    if case.protocol == "grpc":
        env["SW_AGENT_COLLECTOR_BACKEND_SERVICES"] = oap.grpc
    elif case.protocol == "http":
        env["SW_AGENT_COLLECTOR_BACKEND_SERVICES"] = oap.rest.removeprefix("http://")
    else:
        assert oap.kafka_bootstrap
        env["SW_KAFKA_BOOTSTRAP_SERVERS"] = oap.kafka_bootstrap
        if oap.namespace:
            env["SW_KAFKA_NAMESPACE"] = oap.namespace
        # Kafka must not need the gRPC address: point it where nothing listens.
        env["SW_AGENT_COLLECTOR_BACKEND_SERVICES"] = f"127.0.0.1:{free_ports(1)[0]}"
    return env


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def b64d(s: str) -> str:
    return base64.b64decode(s).decode()


@dataclass
class Run:
    """What the one-shot process did, as it and its client saw it."""

    pid: int
    port: int
    downstream_port: int
    status: int
    exit_code: int | None
    trace_id: str
    downstream_status: int
    downstream_headers: dict[str, str]
    stray: list[str]  # our processes (the reporter) still alive after the app exited
    arena_files: list[str]  # arena files left behind


def running(procs: list[psutil.Process]) -> list[str]:
    """``"pid name"`` of those still running (a process may vanish while we look)."""
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {p.name()}")
    return out


def run_one_shot(tmp: Path, case: Case, env: dict[str, str]) -> Run:
    out = tmp / "out"
    out.mkdir()
    script = [sys.executable, str(APP), "--out", str(out), "--framework", case.framework]
    argv = [*SWMP_RUN, *script] if case.start == "swmp-run" else [*script, "--start"]
    proc = Proc(argv, env, tmp / "app.log", marker=env["SW_AGENT_ARENA_DIR"])
    proc.start()
    try:

        def ready() -> bool:
            if (out / "ready.json").exists():
                return True
            assert proc.alive(), f"one_shot exited early:\n{proc.tail()}"
            return False

        wait_until(ready, 60, "one_shot ready.json")
        info = read_json(out / "ready.json")
        conn = http.client.HTTPConnection("127.0.0.1", info["port"], timeout=30)
        try:
            conn.request("GET", "/e2e/order")
            status = conn.getresponse().status
        finally:
            conn.close()
        exit_code = proc.wait_exit(60)
        assert exit_code is not None, f"one_shot did not exit after its request:\n{proc.tail()}"
        result = read_json(out / "result.json")

        # The reporter outlives the app by its drain; it must then be gone, arena and all.
        arena_dir = Path(env["SW_AGENT_ARENA_DIR"])

        def left() -> tuple[list[str], list[str]]:
            return running(proc.family()), sorted(p.name for p in arena_dir.glob("*/*.arena"))

        try:
            wait_until(lambda: left() == ([], []), 30, "the reporter to exit and remove the arena")
        except AssertionError:
            pass  # reported through Run.stray / Run.arena_files below
        stray, arenas = left()
        return Run(
            pid=info["pid"],
            port=info["port"],
            downstream_port=info["downstream_port"],
            status=status,
            exit_code=exit_code,
            trace_id=result["trace_id"],
            downstream_status=result["downstream_status"],
            downstream_headers=result["downstream_headers"],
            stray=stray,
            arena_files=arenas,
        )
    finally:
        proc.kill_all()


@dataclass
class Shot:
    """One case, run once per module: the process's own view, and where to look in the OAP."""

    case: Case
    oap: OapServer
    service: str
    instance: str  # the worker instance the agent names the process (its ring slot is 0)
    run: Run
    log_tail: str

    @property
    def sw8(self) -> list[str]:
        return self.run.downstream_headers.get("sw8", "").split("-")

    def service_id(self) -> str:
        q = self.oap.query
        return wait_for(lambda: q.service_id(self.service), DATA_TIMEOUT, what=f"service {self.service}")

    def spans(self) -> list[Span]:
        q = self.oap.query

        def both() -> list[Span] | None:
            spans = q.trace(self.run.trace_id)
            return spans if len(spans) >= 2 else None

        return wait_for(both, DATA_TIMEOUT, what="both spans")


@pytest.fixture(scope="module", params=CASES, ids=[c.id for c in CASES])
def shot(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Shot:
    case: Case = request.param
    oap: OapServer = request.getfixturevalue("oap_with_kafka" if case.protocol == "kafka" else "oap_server")
    tmp = tmp_path_factory.mktemp(f"one-shot-{case.id}")
    service = unique_name(f"e2e-{case.protocol}")
    base = f"{service}-inst"
    run = run_one_shot(tmp, case, agent_env(tmp, case, oap, service, base))
    tail = (tmp / "app.log").read_text(errors="replace")[-3000:]
    return Shot(case, oap, service, f"{base}-w0", run, tail)


def test_process_served_one_request_and_left_cleanly(shot: Shot) -> None:
    run = shot.run
    assert run.status == 500, shot.log_tail
    assert run.exit_code == 0, shot.log_tail
    assert run.trace_id and run.downstream_status == 200, shot.log_tail
    # The reporter drained what the app left at exit, then went away with its arena.
    assert run.stray == [] and run.arena_files == [], (run.stray, run.arena_files, shot.log_tail)


def test_outbound_call_carries_sw8(shot: Shot) -> None:
    sw8, run = shot.sw8, shot.run
    assert len(sw8) == 8 and sw8[0] == "1", run.downstream_headers
    assert b64d(sw8[1]) == run.trace_id
    assert (b64d(sw8[4]), b64d(sw8[6]), b64d(sw8[7])) == (
        shot.service,
        "/e2e/order",
        f"127.0.0.1:{run.downstream_port}",
    )


def test_oap_stores_the_trace(shot: Shot) -> None:
    q, run, case = shot.oap.query, shot.run, shot.case
    spans = shot.spans()
    assert len(spans) == 2, spans
    entry = next(s for s in spans if s.type == "Entry")
    exit_ = next(s for s in spans if s.type == "Exit")
    entry_component, exit_component = COMPONENT_NAMES[case.framework]

    assert (entry.operation_name, entry.layer, entry.component) == ("/e2e/order", "Http", entry_component)
    assert entry.is_error and entry.parent_span_id == -1 and entry.refs == ()
    expected_tags = {
        "http.method": "GET",
        "http.url": f"http://127.0.0.1:{run.port}/e2e/order",
        TAG_KEY: TAG_VALUE,
    }
    # Flask turns the exception into a 500 answer; a bare WSGI app's exception leaves it before
    # any header was sent, so the server answers 500: either way the span has that status.
    expected_tags["http.status_code"] = "500"
    if case.framework != "flask":
        # The exception leaves the WSGI app through the middleware, which logs it on the span.
        assert [lg.data.get("error.kind") for lg in entry.logs] == ["RuntimeError"], entry.logs
        assert entry.logs[0].data.get("message") == "e2e order failed on purpose"
        assert "Traceback" in entry.logs[0].data.get("stack", "")
    assert entry.tags == expected_tags

    assert (exit_.operation_name, exit_.layer, exit_.component, exit_.peer) == (
        "/downstream",
        "Http",
        exit_component,
        f"127.0.0.1:{run.downstream_port}",
    )
    assert not exit_.is_error and exit_.parent_span_id == entry.span_id
    assert exit_.tags == {
        "http.method": "GET",
        "http.url": f"http://127.0.0.1:{run.downstream_port}/downstream",
        "http.status_code": "200",
    }
    for s in spans:
        assert (s.trace_id, s.service_code, s.service_instance_name) == (
            run.trace_id,
            shot.service,
            shot.instance,
        )
        assert s.segment_id == entry.segment_id and s.start_time <= s.end_time
    # The header the downstream received names this very exit span as its parent.
    assert (b64d(shot.sw8[2]), int(shot.sw8[3])) == (exit_.segment_id, exit_.span_id)

    briefs = wait_for(lambda: q.traces(shot.service_id()), DATA_TIMEOUT, what="the segment listed")
    assert [(b.segment_id, b.trace_ids, b.endpoint_names, b.is_error) for b in briefs] == [
        (entry.segment_id, (run.trace_id,), ("/e2e/order",), True)
    ]


def test_oap_stores_the_log_line_with_its_trace(shot: Shot) -> None:
    q, run = shot.oap.query, shot.run
    service_id = shot.service_id()

    def our_log() -> LogRecord | None:
        logs = q.logs(service_id, trace_id=run.trace_id)
        return next((lg for lg in logs if LOG_MARKER in lg.content), None)

    log = wait_for(our_log, DATA_TIMEOUT, what="the log line in queryLogs")
    assert log.content.endswith(f"WARNING e2e.app - {LOG_MARKER} trace={run.trace_id}"), log
    assert (log.trace_id, log.service_name, log.service_instance_name, log.endpoint_name) == (
        run.trace_id,
        shot.service,
        shot.instance,
        "/e2e/order",
    )
    assert log.content_type == "TEXT"
    assert (log.tags.get("level"), log.tags.get("logger")) == ("WARNING", "e2e.app"), log.tags


def test_oap_lists_the_instance(shot: Shot) -> None:
    q = shot.oap.query
    service_id = shot.service_id()
    instances = wait_for(lambda: q.instances(service_id), DATA_TIMEOUT, what="the instance")
    assert [i.name for i in instances] == [shot.instance]


def test_oap_has_the_instance_properties(shot: Shot) -> None:
    """A process that lived about a second is still announced (language, pid, slot)."""
    q = shot.oap.query
    service_id = shot.service_id()
    try:
        instance = wait_for(
            lambda: next((i for i in q.instances(service_id) if i.attributes.get("Process No.")), None),
            DATA_TIMEOUT,
            what="the instance's properties",
        )
    except AssertionError as e:  # what the OAP has and what the process logged, to tell why
        raise AssertionError(f"{e}\ninstances: {q.instances(service_id)!r}\n{shot.log_tail}") from None
    assert instance.name == shot.instance
    assert instance.language == "PYTHON"
    assert (instance.attributes["Process No."], instance.attributes.get("slot")) == (str(shot.run.pid), "0")


# The first request of a process that was never forked: its outbound sw8 must already carry
# the instance name the process reports under (the first segment binds the ring).
def test_sw8_names_the_reporting_instance(shot: Shot) -> None:
    assert b64d(shot.sw8[5]) == shot.instance
