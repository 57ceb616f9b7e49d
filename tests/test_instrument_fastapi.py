"""FastAPI (through the Starlette instrumentation), under the servers it is deployed with:
Uvicorn alone (``uvicorn app:app``, what ``fastapi run`` starts) and Gunicorn with Uvicorn
workers, both started by ``swmp run``; segments checked at the test collector
(tests/e2e_apps/fastapi_app.py). Then the same application in process, for what needs
no server: a mounted sub-application, a subclass of FastAPI, and installing the agent
after FastAPI was imported.

Checked: the route template as the operation name (``/users/{uid}`` for many ids; an
``APIRouter`` prefix and a router included in a router; a typed path parameter), component
FastAPI (7014), method/url/status tags, the caller's ``sw8`` continued (and sent on from a
sync endpoint's ``http.client`` call), an ``HTTPException(404)`` and a validation error
(422) as error statuses without a log, an unhandled exception as a 500 with its stack, and
the framework's answers unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reporter_proc import records as R
from swmp import _sink
from swmp.tracing import Component
from tests.collector import CollectorProcess, free_port
from tests.servers import GUNICORN, agent_env, collector_process, request, segments_of
from tests.test_instrument_frameworks import SW8, segments, tags_of
from tests.test_instrument_web import asgi_get, check_500, entry, error_logs, sink
from tests.web_checks import log_text, new_trace, running, segments_of_trace, tags, the_span

pytest.importorskip("fastapi")

pytestmark = [pytest.mark.timeout(180)]

APP = "tests.e2e_apps.fastapi_app:app"
SERVERS = ("uvicorn", "gunicorn-uvicorn")
FASTAPI = 7014

__all__ = ["sink"]  # the in-process tests' fixture (tests/test_instrument_web.py)


# -- under real servers ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fastapi")


@pytest.fixture(scope="module")
def col(workdir: Path) -> Iterator[CollectorProcess]:
    with collector_process(workdir) as c:
        yield c


def server_argv(name: str, port: int) -> list[str]:
    if name == "uvicorn":
        return [sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1", "--port", str(port)]
    return [
        *GUNICORN,
        "-k",
        "uvicorn.workers.UvicornWorker",
        "-w",
        "2",
        "-b",
        f"127.0.0.1:{port}",
        APP,
    ]


@pytest.fixture(scope="module")
def servers(workdir: Path, col: CollectorProcess) -> Iterator[dict[str, int]]:
    ports = {name: free_port() for name in SERVERS}
    with contextlib.ExitStack() as stack:
        for name, port in ports.items():
            env = agent_env(workdir / name, col.grpc_address, service=name)
            stack.enter_context(running(workdir, name, server_argv(name, port), env, port))
        yield ports


def get_json(port: int, path: str, trace: str = "") -> tuple[int, Any]:
    res = request(port, path, trace)
    return res.status, json.loads(res.body) if res.body else None


def entry_of(col: CollectorProcess, trace: str, template: str) -> dict[str, Any]:
    return the_span(segments_of_trace(col, trace), operationName=template)


def check_http(span: dict[str, Any], port: int, path: str, status: int, server: str) -> None:
    assert span["componentId"] == FASTAPI and span["spanLayer"] == "Http"
    t = tags(span)
    assert t["http.method"] == "GET"
    assert t["http.url"] == f"http://127.0.0.1:{port}{path}"
    assert t["http.status_code"] == str(status)
    assert span["_segment"]["service"] == server
    (ref,) = span["refs"]  # continues the caller's trace
    assert ref["parentTraceSegmentId"] == "client-segment" and ref["parentService"] == "load-client"


@pytest.mark.servers
@pytest.mark.parametrize("server", SERVERS)
def test_many_ids_one_template_and_sw8(servers: dict[str, int], col: CollectorProcess, server: str) -> None:
    port = servers[server]
    traces = [new_trace() for _ in range(6)]
    for i, trace in enumerate(traces):
        status, body = get_json(port, f"/users/{i}", trace)
        assert status == 200 and body["uid"] == i
    for i, trace in enumerate(traces):
        span = entry_of(col, trace, "/users/{uid}")
        check_http(span, port, f"/users/{i}", 200, server)
        assert span["_segment"]["traceId"] == trace
        assert not span["isError"] and not span.get("logs")
    # Without sw8: a new trace, same operation name.
    assert get_json(port, "/users/918273")[0] == 200
    url = f"http://127.0.0.1:{port}/users/918273"

    def fresh() -> list[dict[str, Any]]:
        return [s for s in segments_of(col, server) if tags(s["spans"][-1]).get("http.url") == url]

    from tests.servers import wait_until

    wait_until(lambda: len(fresh()) == 1, 20, "the segment of the request without sw8")
    (seg,) = fresh()
    assert seg["traceId"] not in traces
    assert seg["spans"][-1]["operationName"] == "/users/{uid}" and not seg["spans"][-1].get("refs")


@pytest.mark.servers
@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize(
    ("path", "template", "answer"),
    [
        pytest.param("/files/docs/a.txt", "/files/{file_path}", {"path": "docs/a.txt"}, id="typed-path"),
        pytest.param("/api/v1/items/5", "/api/v1/items/{item_id}", {"item": 5}, id="router-prefix"),
        pytest.param(
            "/api/v1/orgs/acme/members/3",
            "/api/v1/orgs/{org}/members/{uid}",
            {"org": "acme", "uid": 3},
            id="nested-routers",
        ),
    ],
)
def test_router_prefixes_and_typed_parameters(  # noqa: PLR0917
    servers: dict[str, int], col: CollectorProcess, server: str, path: str, template: str, answer: Any
) -> None:
    port = servers[server]
    trace = new_trace()
    assert get_json(port, path, trace) == (200, answer)
    span = entry_of(col, trace, template)
    check_http(span, port, path, 200, server)
    assert not span["isError"]


@pytest.mark.servers
@pytest.mark.parametrize("server", SERVERS)
def test_http_exception_404(servers: dict[str, int], col: CollectorProcess, server: str) -> None:
    port = servers[server]
    trace = new_trace()
    assert get_json(port, "/missing/k1", trace) == (404, {"detail": "no k1"})
    span = entry_of(col, trace, "/missing/{key}")
    check_http(span, port, "/missing/k1", 404, server)
    assert span["isError"] and not span.get("logs")  # an answer, not an exception to log


@pytest.mark.servers
@pytest.mark.parametrize("server", SERVERS)
def test_validation_error_422(servers: dict[str, int], col: CollectorProcess, server: str) -> None:
    port = servers[server]
    trace = new_trace()
    status, body = get_json(port, "/users/not-a-number", trace)
    assert status == 422 and body["detail"][0]["loc"] == ["path", "uid"]
    span = entry_of(col, trace, "/users/{uid}")
    check_http(span, port, "/users/not-a-number", 422, server)
    assert span["isError"] and not span.get("logs")


@pytest.mark.servers
@pytest.mark.parametrize("server", SERVERS)
def test_unhandled_exception_500_with_stack(
    servers: dict[str, int], col: CollectorProcess, server: str
) -> None:
    port = servers[server]
    trace = new_trace()
    res = request(port, "/boom", trace)
    assert (res.status, res.body) == (500, b"Internal Server Error")  # FastAPI's own answer
    span = entry_of(col, trace, "/boom")
    check_http(span, port, "/boom", 500, server)
    assert span["isError"]
    (log,) = [lg for lg in span["logs"] if any(d.get("value") == "error" for d in lg["data"])]
    fields = {d["key"]: d.get("value", "") for d in log["data"]}
    assert fields["error.kind"] == "RuntimeError" and fields["message"] == "fastapi failed on purpose"
    # The stack keeps the innermost SW_AGENT_CAUSE_EXCEPTION_DEPTH (10) frames: the handler
    # that raised is among them (some twenty frames below the server under FastAPI).
    assert fields["stack"].startswith("Traceback (most recent call last)")
    assert fields["stack"].endswith("RuntimeError: fastapi failed on purpose\n")
    assert "fastapi_app.py" in fields["stack"] and ", in boom\n" in fields["stack"]


@pytest.mark.servers
@pytest.mark.parametrize("server", SERVERS)
def test_unmatched_path_keeps_the_path(servers: dict[str, int], col: CollectorProcess, server: str) -> None:
    port = servers[server]
    trace = new_trace()
    assert get_json(port, "/nope/42", trace) == (404, {"detail": "Not Found"})
    span = entry_of(col, trace, "/nope/42")
    assert tags(span)["http.status_code"] == "404" and span["isError"]
    assert "Traceback" not in log_text(span)


@pytest.mark.servers
@pytest.mark.parametrize("server", SERVERS)
def test_sync_endpoint_call_continues_the_trace(
    servers: dict[str, int], col: CollectorProcess, server: str
) -> None:
    """A ``def`` endpoint runs in FastAPI's thread pool: its ``http.client`` call is an
    exit span of the request's segment, and the called endpoint's entry refers to it."""
    port = servers[server]
    trace = new_trace()
    assert get_json(port, "/sync/users/4", trace) == (200, {"via": "sync", "downstream": 4})
    segs = segments_of_trace(col, trace, n=2)
    caller = the_span(segs, operationName="/sync/users/{uid}")
    check_http(caller, port, "/sync/users/4", 200, server)
    seg = caller["_segment"]
    exit_span = the_span([seg], spanType="Exit")
    assert exit_span["operationName"] == "/users/4" and exit_span["peer"] == f"127.0.0.1:{port}"
    assert exit_span.get("parentSpanId", 0) == caller["spanId"]  # 0 is left out of the JSON
    callee = the_span(segs, operationName="/users/{uid}")
    (ref,) = callee["refs"]
    assert ref["parentTraceSegmentId"] == seg["traceSegmentId"]
    assert ref["parentSpanId"] == exit_span["spanId"]
    assert ref["parentEndpoint"] == "/sync/users/{uid}"


# -- in process -----------------------------------------------------------------------------------
def test_mounted_app_subclass_and_router(sink: _sink.MemorySink) -> None:
    from fastapi import APIRouter, FastAPI

    class MyAPI(FastAPI):  # an application's own subclass, defined after the agent installed
        pass

    app = MyAPI()
    sub = FastAPI()
    router = APIRouter(prefix="/v2")

    @router.get("/things/{tid}")
    async def thing(tid: int) -> dict[str, int]:
        return {"tid": tid}

    @sub.get("/s/{k}")
    def subk(k: str) -> str:
        return k

    app.include_router(router)
    app.mount("/sub/{tenant}", sub)

    async def run() -> list[list[dict[str, Any]]]:
        return [
            await asgi_get(app, "/v2/things/1", [(b"sw8", SW8.encode())]),
            await asgi_get(app, "/sub/t1/s/abc"),
        ]

    answers = asyncio.run(run())
    assert [a[0]["status"] for a in answers] == [200, 200]
    assert answers[0][1]["body"] == b'{"tid":1}' and answers[1][1]["body"] == b'"abc"'
    segs = segments(sink)
    assert len(segs) == 2  # the mounted app's own middleware records nothing more
    assert [entry(s)[R.SPAN_OPERATION] for s in segs] == ["/v2/things/{tid}", "/sub/{tenant}/s/{k}"]
    assert all(len(s[R.SEG_SPANS]) == 1 for s in segs)
    assert segs[0][R.SEG_TRACE_ID] == "trace-up"
    assert entry(segs[0])[R.SPAN_COMPONENT] == Component.FASTAPI


def test_unhandled_exception_in_process(sink: _sink.MemorySink) -> None:
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/kaput/{n}")
    async def kaput(n: int) -> None:
        raise LookupError("fastapi kaput")

    sent: list[dict[str, Any]] = []

    async def run() -> None:
        sent.extend(await asgi_get(app, "/kaput/1"))

    with pytest.raises(LookupError):  # ServerErrorMiddleware answers 500, then re-raises
        asyncio.run(run())
    (seg,) = segments(sink)
    check_500(seg, "LookupError", "fastapi kaput")
    assert entry(seg)[R.SPAN_OPERATION] == "/kaput/{n}"
    assert len(error_logs(entry(seg))) == 1


def test_installed_after_fastapi_was_imported() -> None:
    """The agent started after the application imported FastAPI (``swmp.start()`` late):
    the existing FastAPI class is found and patched; uninstall puts everything back."""
    import fastapi.routing
    from fastapi import FastAPI
    from starlette.applications import Starlette

    from swmp import instrument, tracing
    from swmp.config import load
    from swmp.instrument._patch import is_patched

    s = _sink.MemorySink()
    _sink.set_sink(s)
    cfg = load({}, agent_log_reporter_active=False)
    tracing.configure(cfg)
    try:
        instrument.install_all(cfg)
        assert is_patched(FastAPI, "build_middleware_stack")
        assert is_patched(fastapi.routing.APIRoute, "handle")
        app = FastAPI()

        @app.get("/late/{x}")
        async def late(x: int) -> int:
            return x

        assert asyncio.run(asgi_get(app, "/late/3"))[0]["status"] == 200
        (seg,) = segments(s)
        assert entry(seg)[R.SPAN_OPERATION] == "/late/{x}"
        assert tags_of(entry(seg))["http.status_code"] == "200"
    finally:
        instrument.uninstall_all()
        _sink.set_sink(None)
    assert not is_patched(FastAPI, "build_middleware_stack")
    assert not is_patched(fastapi.routing.APIRoute, "handle")
    assert "__init_subclass__" not in Starlette.__dict__
    s.records.clear()
    app = FastAPI()  # built after uninstall: untraced

    @app.get("/after")
    async def after() -> int:
        return 1

    assert asyncio.run(asgi_get(app, "/after"))[0]["status"] == 200
    assert not segments(s)


def test_starlette_subclasses_built_stack_wrapped_once(sink: _sink.MemorySink) -> None:
    """A subclass overriding ``build_middleware_stack`` (and calling ``super()``) is traced
    with one middleware; class keywords still reach a mixin's ``__init_subclass__``."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from swmp.instrument.starlette import _Traced

    seen: list[Any] = []

    class Mixin:
        def __init_subclass__(cls, **kwargs: Any) -> None:
            seen.append(kwargs)
            super().__init_subclass__()

    class Custom(Starlette, Mixin, flavour="x"):  # type: ignore[call-arg]
        def build_middleware_stack(self) -> Any:
            return super().build_middleware_stack()

    assert seen == [{"flavour": "x"}]
    with pytest.raises(TypeError):  # what Python says without the agent too

        class Bad(Starlette, flavour="y"):  # type: ignore[call-arg]
            pass

    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse("hi")

    app = Custom(routes=[Route("/hi/{who}", hello)])
    sent = asyncio.run(asgi_get(app, "/hi/you"))
    assert sent[0]["status"] == 200
    assert app.middleware_stack.__class__ is _Traced
    assert app.middleware_stack.app.__class__ is not _Traced  # type: ignore[attr-defined]
    (seg,) = segments(sink)
    assert entry(seg)[R.SPAN_OPERATION] == "/hi/{who}"


def test_override_wrapping_super_gets_one_layer(sink: _sink.MemorySink) -> None:
    """An override that wraps ``super().build_middleware_stack()`` in middleware of its own
    gets one traced layer, outermost (it used to get two: one around Starlette's stack, one
    around the override's)."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from swmp.instrument.starlette import _Traced

    class Outer:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            await self.app(scope, receive, send)

    class Wrapping(Starlette):
        def build_middleware_stack(self) -> Any:
            return Outer(super().build_middleware_stack())

    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse("hi")

    app = Wrapping(routes=[Route("/hi/{who}", hello)])
    sent = asyncio.run(asgi_get(app, "/hi/you"))
    assert sent[0]["status"] == 200
    layers = []
    layer: Any = app.middleware_stack
    for _ in range(50):  # down the chain of middleware (each holds the next as .app)
        if layer is None:
            break
        layers.append(layer.__class__)
        layer = getattr(layer, "app", None)
    assert layers.count(_Traced) == 1
    assert layers[:2] == [_Traced, Outer]
    (seg,) = segments(sink)
    assert entry(seg)[R.SPAN_OPERATION] == "/hi/{who}"


def test_query_string_option_reaches_fastapi() -> None:
    """``SW_PLUGIN_FASTAPI_COLLECT_HTTP_PARAMS`` tags FastAPI's spans (its own stack builder
    is patched with the same settings as Starlette's)."""
    from fastapi import FastAPI

    from swmp import instrument, tracing
    from swmp.config import load

    s = _sink.MemorySink()
    _sink.set_sink(s)
    cfg = load({}, agent_log_reporter_active=False, plugin_fastapi_collect_http_params=True)
    tracing.configure(cfg)
    try:
        instrument.install_all(cfg)
        app = FastAPI()

        @app.get("/q")
        async def q(a: int = 0) -> int:
            return a

        async def run() -> list[dict[str, Any]]:
            scope_qs = b"a=5&b=x"
            sent: list[dict[str, Any]] = []

            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)

            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "method": "GET",
                "path": "/q",
                "raw_path": b"/q",
                "headers": [(b"host", b"example:80")],
                "query_string": scope_qs,
                "scheme": "http",
                "server": ("127.0.0.1", 80),
                "client": ("127.0.0.1", 5000),
                "root_path": "",
                "http_version": "1.1",
            }
            await app(scope, receive, send)
            return sent

        sent = asyncio.run(run())
        assert sent[0]["status"] == 200 and sent[1]["body"] == b"5"
        (seg,) = segments(s)
        assert tags_of(entry(seg))["http.params"] == "a=5&b=x"
    finally:
        instrument.uninstall_all()
        _sink.set_sink(None)
