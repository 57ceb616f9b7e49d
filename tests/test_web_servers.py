"""Web frameworks under the servers they are deployed with, started by ``swmp run``, their
segments checked at the test collector.

* WSGI (Flask, Django, Falcon, Pyramid, Bottle): one Gunicorn serving all five behind a
  path-prefix dispatcher, with sync workers and with gthread workers.
* ASGI (Starlette, Django, Falcon): one Gunicorn with Uvicorn workers.
* ``http.server``: its own process.

For each framework: many distinct ids give one operation name (the route template), the
framework's component id, method/url/status tags, the caller's ``sw8`` continued, and a
handler exception the framework answers with 500 is on the span with its stack.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.collector import CollectorProcess, free_port
from tests.servers import (
    SWMP_RUN,
    Proc,
    Result,
    agent_env,
    collector_process,
    entry_span,
    gunicorn_command,
    port_open,
    quiet_for,
    request,
    run_server,
    segments_of,
    wait_segments,
    wait_until,
)

pytestmark = [pytest.mark.servers, pytest.mark.timeout(180)]

IDS = 12  # distinct ids per framework: all must land on one operation name

# The route each framework must report for /<framework>/users/<id> (tests/e2e_apps/web_*.py).
WSGI_TEMPLATES = {
    "flask": "/flask/users/<int:uid>",
    "django": "/django/users/<int:pk>/",
    "falcon": "/falcon/users/{uid:int}",
    "pyramid": "/pyramid/users/{uid}",
    "bottle": "/bottle/users/<uid:int>",
}
ASGI_TEMPLATES = {
    "starlette": "/starlette/users/{uid}",
    "django": "/django/users/<int:pk>/",
    "falcon": "/falcon/users/{uid:int}",
}
COMPONENTS = {
    "flask": 7001,
    "django": 7004,
    "pyramid": 7009,
    "falcon": 7012,
    "starlette": 7014,
    "bottle": 7015,
}


def users_path(fw: str, i: int) -> str:
    return f"/{fw}/users/{i}/" if fw == "django" else f"/{fw}/users/{i}"  # Django's route has the slash


def drive(port: int, frameworks: list[str]) -> dict[str, list[Result]]:
    """``IDS`` user requests (every other one with sw8) and one failing request per framework."""
    out: dict[str, list[Result]] = {}
    for fw in frameworks:
        results = [
            request(port, users_path(fw, i), trace_id=f"{fw}-trace-{i}" if i % 2 == 0 else "")
            for i in range(IDS)
        ]
        results.append(request(port, f"/{fw}/fail", trace_id=f"{fw}-trace-fail"))
        out[fw] = results
    return out


def tags_of(span: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t.get("value", "") for t in span.get("tags", [])}


def error_logs(span: dict[str, Any]) -> list[dict[str, str]]:
    logs = []
    for log in span.get("logs", []):
        fields = {d["key"]: d.get("value", "") for d in log.get("data", [])}
        if fields.get("event") == "error":
            logs.append(fields)
    return logs


def check_framework(
    segs: list[dict[str, Any]],
    results: list[Result],
    *,
    template: str,
    component: int,
    port: int,
    fail_message: str,
) -> None:
    """The segments of one framework's requests (matched by trace id or operation name)."""
    ok, fail = results[:-1], results[-1]
    assert all(r.status == 200 for r in ok), Counter((r.status, r.error) for r in ok)
    assert fail.status == 500, fail
    by_trace = {s["traceId"]: s for s in segs}
    users = [s for s in segs if entry_span(s)["operationName"] == template]
    assert len(users) == len(ok), Counter(entry_span(s)["operationName"] for s in segs)
    for seg in users:
        span = entry_span(seg)
        assert int(span["componentId"]) == component
        assert span.get("spanLayer") == "Http" and not span.get("isError", False)
        tags = tags_of(span)
        assert tags["http.method"] == "GET" and tags["http.status_code"] == "200"
        assert tags["http.url"].startswith(f"http://127.0.0.1:{port}/")
    for r in ok:
        if r.trace_id:  # the caller's trace continued, with a reference to its span
            span = entry_span(by_trace[r.trace_id])
            assert span["refs"][0]["parentTraceSegmentId"] == "client-segment"
    failed = entry_span(by_trace[fail.trace_id])
    assert failed.get("isError") is True and tags_of(failed)["http.status_code"] == "500"
    (log,) = error_logs(failed)
    assert log["error.kind"] == "RuntimeError" and log["message"] == fail_message
    assert "Traceback (most recent call last)" in log["stack"] and fail_message in log["stack"]


def segments_by_framework(
    col: CollectorProcess, service: str, results: dict[str, list[Result]]
) -> dict[str, list[dict[str, Any]]]:
    total = sum(len(r) for r in results.values())
    wait_segments(col, total, service)
    quiet_for(col, 0.5)
    segs = segments_of(col, service)
    assert len(segs) == total  # one segment per request, nothing else
    out: dict[str, list[dict[str, Any]]] = {fw: [] for fw in results}
    for seg in segs:
        url = tags_of(entry_span(seg))["http.url"]
        out[url.split("/")[3]].append(seg)
    return out


def serve_and_check(
    tmp_path: Path, app: str, templates: dict[str, str], worker_class: str, threads: int
) -> None:
    """Run ``app`` under Gunicorn with ``swmp run``, drive every framework, check each."""
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(tmp_path, col.grpc_address, service="web")
        cmd = gunicorn_command(port, app=app, workers=2, worker_class=worker_class, threads=threads)
        with run_server("gunicorn", tmp_path, cmd, env, port=port, workers=2):
            results = drive(port, list(templates))
            segs = segments_by_framework(col, "web", results)
        for fw, template in templates.items():
            check_framework(
                segs[fw],
                results[fw],
                template=template,
                component=COMPONENTS[fw],
                port=port,
                fail_message=f"{fw} failed on purpose",
            )


@pytest.mark.parametrize(
    ("worker_class", "threads"),
    [pytest.param("sync", 0, id="sync"), pytest.param("gthread", 4, id="gthread")],
)
def test_wsgi_frameworks_under_gunicorn(tmp_path: Path, worker_class: str, threads: int) -> None:
    serve_and_check(tmp_path, "tests.e2e_apps.web_wsgi:app", WSGI_TEMPLATES, worker_class, threads)


def test_asgi_frameworks_under_gunicorn_uvicorn(tmp_path: Path) -> None:
    uvicorn = "uvicorn.workers.UvicornWorker"
    serve_and_check(tmp_path, "tests.e2e_apps.web_asgi:app", ASGI_TEMPLATES, uvicorn, 0)


def test_http_server_process(tmp_path: Path) -> None:
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(tmp_path, col.grpc_address, service="plain")
        argv = [*SWMP_RUN, "python", "-m", "tests.e2e_apps.web_http_server", str(port)]
        proc = Proc(argv, env, tmp_path / "http_server.log", marker=env["SW_AGENT_ARENA_DIR"])
        proc.start()
        try:
            proc.wait_log("serving")
            wait_until(lambda: port_open(port), 30, f"port {port}")
            ok = [request(port, f"/items/{i}", trace_id=f"hs-{i}" if i % 2 == 0 else "") for i in range(6)]
            fail = request(port, "/fail", trace_id="hs-fail")
            assert all(r.status == 200 for r in ok), ok
            assert fail.status == 0  # http.server answers nothing when the handler raises
            wait_segments(col, 7, "plain")
            quiet_for(col, 0.5)
        finally:
            proc.stop()
    segs = segments_of(col, "plain")
    assert len(segs) == 7
    by_op = {entry_span(s)["operationName"]: s for s in segs}
    assert set(by_op) == {f"/items/{i}" for i in range(6)} | {"/fail"}  # no templates: the path
    for i in range(6):
        span = entry_span(by_op[f"/items/{i}"])
        assert int(span["componentId"]) == 7000
        assert tags_of(span)["http.status_code"] == "200"
        assert tags_of(span)["http.url"] == f"http://127.0.0.1:{port}/items/{i}"
    assert by_op["/items/0"]["traceId"] == "hs-0"
    failed = entry_span(by_op["/fail"])
    assert failed.get("isError") is True
    (log,) = error_logs(failed)
    assert log["error.kind"] == "RuntimeError" and "failed on purpose" in log["stack"]
