"""aiohttp, Tornado and Sanic under their own servers with ``swmp run``, segments checked at
the test collector: route templates as operation names, ``sw8`` continued, status and
error stacks on the entry span, aiohttp-client and websockets exit spans with ``sw8``
reaching the next service. One collector and one server per framework for the module.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import ipc
from ipc import Arena
from tests.collector import CollectorProcess, free_port
from tests.servers import (
    GUNICORN,
    Proc,
    agent_env,
    belongs,
    collector_process,
    is_swmp,
    request,
    wait_until,
)
from tests.web_checks import log_text, new_trace, running, segments_of_trace, tags, the_span

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]

APP = "tests.e2e_apps.async_web"
TEMPLATES = {"aiohttp": "/users/{id}", "tornado": "/users/([0-9]+)", "sanic": "/users/<uid:int>"}
COMPONENTS = {"aiohttp": 7008, "tornado": 7005, "sanic": 7007}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("async-web")


@pytest.fixture(scope="module")
def col(workdir: Path) -> Iterator[CollectorProcess]:
    with collector_process(workdir) as c:
        yield c


def serve(
    workdir: Path,
    col: CollectorProcess,
    name: str,
    argv: list[str],
    port: int,
    *,
    extra: dict[str, str] | None = None,
) -> contextlib.AbstractContextManager[Proc]:
    env = agent_env(workdir / name, col.grpc_address, service=name, extra=extra)
    return running(workdir, name, argv, env, port)


@pytest.fixture(scope="module")
def servers(workdir: Path, col: CollectorProcess) -> Iterator[dict[str, int]]:
    ports = {name: free_port() for name in COMPONENTS}
    with contextlib.ExitStack() as stack:
        a = ports["aiohttp"]
        stack.enter_context(
            serve(
                workdir,
                col,
                "aiohttp",
                [sys.executable, "-m", "aiohttp.web", "-H", "127.0.0.1", "-P", str(a), f"{APP}:aiohttp_main"],
                a,
            )
        )
        t = ports["tornado"]
        stack.enter_context(serve(workdir, col, "tornado", [sys.executable, "-m", APP, "tornado", str(t)], t))
        s = ports["sanic"]
        stack.enter_context(
            serve(
                workdir,
                col,
                "sanic",
                [
                    sys.executable,
                    "-m",
                    "sanic",
                    f"{APP}:sanic_app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(s),
                    "--workers",
                    "2",
                    "--no-motd",
                ],
                s,
                extra={"SWMP_TEST_SANIC": "1"},
            )
        )
        yield ports


@pytest.mark.parametrize("framework", list(COMPONENTS))
def test_route_template_status_and_sw8(
    servers: dict[str, int], col: CollectorProcess, framework: str
) -> None:
    trace = new_trace()
    res = request(servers[framework], "/users/7", trace)
    assert (res.status, res.body) == (200, b"7")
    span = the_span(segments_of_trace(col, trace), operationName=TEMPLATES[framework])
    assert span["componentId"] == COMPONENTS[framework]
    assert span["spanLayer"] == "Http"
    t = tags(span)
    assert t["http.method"] == "GET"
    assert t["http.url"].endswith("/users/7")
    assert t["http.status_code"] == "200"
    assert not span["isError"]
    (ref,) = span["refs"]  # continues the caller's trace
    assert ref["parentTraceSegmentId"] == "client-segment"
    assert ref["parentService"] == "load-client"
    assert span["_segment"]["service"] == framework


@pytest.mark.parametrize("framework", list(COMPONENTS))
def test_error_500_carries_the_stack(servers: dict[str, int], col: CollectorProcess, framework: str) -> None:
    trace = new_trace()
    assert request(servers[framework], "/boom", trace).status == 500
    span = the_span(segments_of_trace(col, trace), operationName="/boom")
    assert span["isError"]
    assert tags(span)["http.status_code"] == "500"
    logs = log_text(span)
    assert f"boom-{framework}" in logs
    assert "Traceback" in logs and "ValueError" in logs


@pytest.mark.parametrize("framework", list(COMPONENTS))
def test_client_exit_spans_reach_the_next_service(
    servers: dict[str, int], col: CollectorProcess, framework: str
) -> None:
    trace = new_trace()
    res = request(servers[framework], f"/call?port={servers['aiohttp']}", trace)
    assert (res.status, res.body) == (200, b"9|ping")
    # The framework's segment, and the aiohttp service's /users/{id} and /ws segments.
    segs = segments_of_trace(col, trace, n=3)
    assert len(segs) == 3
    caller = the_span(segs, operationName="/call")
    seg = caller["_segment"]
    http_exit = the_span([seg], spanType="Exit", componentId=7008)
    assert http_exit["operationName"] == "/users/9"
    assert http_exit["peer"] == f"127.0.0.1:{servers['aiohttp']}"
    assert tags(http_exit)["http.status_code"] == "200"
    ws_exit = the_span([seg], spanType="Exit", componentId=7018)
    assert ws_exit["operationName"] == "/ws"
    assert tags(ws_exit)["http.method"] == "websocket.connect"
    assert tags(ws_exit)["http.status_code"] == "101"
    for op, exit_span in (("/users/{id}", http_exit), ("/ws", ws_exit)):
        downstream = the_span(segs, operationName=op, spanType="Entry")
        assert downstream["_segment"]["service"] == "aiohttp"
        (ref,) = downstream["refs"]
        assert ref["parentTraceSegmentId"] == seg["traceSegmentId"]
        assert ref["parentSpanId"] == exit_span["spanId"]
        assert ref["parentEndpoint"] == "/call"


def test_aiohttp_under_gunicorn_worker(workdir: Path, col: CollectorProcess) -> None:
    port = free_port()
    argv = [
        *GUNICORN,
        "-k",
        "aiohttp.GunicornWebWorker",
        "-w",
        "2",
        "-b",
        f"127.0.0.1:{port}",
        f"{APP}:aiohttp_factory",
    ]
    with serve(workdir, col, "aiohttp-gunicorn", argv, port):
        traces = [new_trace() for _ in range(6)]
        for trace in traces:
            assert request(port, "/users/3", trace).status == 200
        for trace in traces:
            span = the_span(segments_of_trace(col, trace), operationName="/users/{id}")
            assert span["_segment"]["service"] == "aiohttp-gunicorn"
            assert tags(span)["http.status_code"] == "200"


def test_sanic_workers_are_distinct_instances(servers: dict[str, int], col: CollectorProcess) -> None:
    """``--workers 2``: Sanic spawns its workers (new interpreters, each starting an agent);
    they join the main process's arena as Gunicorn workers do, one slot and instance each."""
    seen: set[str] = set()
    for _ in range(60):  # the kernel spreads the connections over the two workers
        trace = new_trace()
        assert request(servers["sanic"], "/users/5", trace).status == 200
        span = the_span(segments_of_trace(col, trace), operationName=TEMPLATES["sanic"])
        seen.add(span["_segment"]["serviceInstance"])
        if len(seen) == 2:
            break
    assert seen == {"sanic-w0", "sanic-w1"}


def test_sanic_runs_one_reporter(servers: dict[str, int], workdir: Path) -> None:
    """``--workers 2`` starts five interpreters (main, two workers, multiprocessing's
    resource tracker and Sanic's manager server): one arena and one reporter in all. (Each
    of the last two used to own an arena and a reporter: three reporters.)"""
    arena_dir = workdir / "sanic" / "shm"
    main = _sanic_main(arena_dir)
    with Arena.open(ipc.arena_path(main.pid, str(arena_dir)), wait_s=0) as arena:
        wait_until(lambda: len(arena.live_slots()) >= 2, 30, "both workers holding a slot")
        workers = {p.pid for p in main.children() if p.cmdline()[-1:] == ["--multiprocessing-fork"]}
        assert set(arena.live_slots().values()) <= workers
    wait_until(lambda: len(_reporters(arena_dir)) >= 1, 30, "a reporter")
    assert len(_reporters(arena_dir)) == 1
    assert [p.name for p in arena_dir.glob("*/*.arena")] == [Path(arena.path).name]


def _sanic_main(arena_dir: Path) -> psutil.Process:
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.cmdline()[1:3] == ["-m", "sanic"] and belongs(p, str(arena_dir)):
                return p
    raise AssertionError("no Sanic main process")


def _reporters(arena_dir: Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if is_swmp(p, "swmp-reporter") and p.status() != "zombie" and belongs(p, str(arena_dir)):
                out.append(p)
    return out


@pytest.mark.parametrize("framework", list(COMPONENTS))
def test_unmatched_path_keeps_the_path(
    servers: dict[str, int], col: CollectorProcess, framework: str
) -> None:
    trace = new_trace()
    assert request(servers[framework], "/nope/42", trace).status == 404
    span = the_span(segments_of_trace(col, trace), operationName="/nope/42")
    assert tags(span)["http.status_code"] == "404" and span["isError"]
    assert not span.get("logs")  # a 404 is no exception to log
