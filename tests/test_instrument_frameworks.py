"""Framework auto-install (Flask, Django, Starlette/FastAPI), the middlewares, the registry,
and the log reporter."""

from __future__ import annotations

import asyncio
import logging
import sys
import types
from collections.abc import Iterator
from typing import Any
from wsgiref.util import setup_testing_defaults

import orjson
import pytest

from reporter_proc import records as R
from swmp import _sink, instrument, propagation, tracing
from swmp.config import load
from swmp.instrument.asgi import ASGIMiddleware
from swmp.instrument.log_reporter import SkyWalkingLogHandler
from swmp.instrument.wsgi import WSGIMiddleware
from swmp.tracing import Component, Kind
from swmp.tracing.context import new_entry_span
from tests.instrumented import instrumented

SW8 = propagation.encode_sw8(
    "trace-up", "seg-up", 4, propagation.b64("up"), propagation.b64("up-1"), "/up", "me:1"
)


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with instrumented(plugin_flask_collect_http_params=True) as (memory, _):
        yield memory


def segments(sink: _sink.MemorySink) -> list[list[Any]]:
    return [orjson.loads(p) for t, p in sink.records if t == R.SEGMENT]


def tags_of(span: list[Any]) -> dict[str, str]:
    t = span[R.SPAN_TAGS]
    return dict(zip(t[::2], t[1::2], strict=True))


def test_flask_auto_install(sink: _sink.MemorySink) -> None:
    import flask

    app = flask.Flask("t")

    @app.route("/items/<int:n>")
    def item(n: int) -> str:
        return str(n)

    @app.route("/fail")
    def fail() -> str:
        raise RuntimeError("bad")

    client = app.test_client()
    # The span ends when the server closes the response iterable, as PEP 3333 requires.
    with client.get("/items/3?a=b", headers={"sw8": SW8}) as resp:
        assert resp.data == b"3"
    with client.get("/fail") as resp:
        assert resp.status_code == 500
    ok, failed = segments(sink)
    (span,) = ok[R.SEG_SPANS]
    assert span[R.SPAN_OPERATION] == "/items/<int:n>"  # the rule, not the path
    assert span[R.SPAN_COMPONENT] == Component.FLASK and span[R.SPAN_TYPE] == Kind.ENTRY
    assert ok[R.SEG_TRACE_ID] == "trace-up"
    assert span[R.SPAN_REFS][0][1:4] == ["trace-up", "seg-up", 4]
    assert tags_of(span)["http.params"] == "a=b"
    assert failed[R.SEG_SPANS][0][R.SPAN_IS_ERROR] is True
    assert tags_of(failed[R.SEG_SPANS][0])["http.status_code"] == "500"


def test_wsgi_middleware_with_streamed_body_and_nesting(sink: _sink.MemorySink) -> None:
    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [])
        yield b"a"
        yield b"b"

    wrapped = WSGIMiddleware(WSGIMiddleware(app))  # nested: still one entry span
    environ: dict[str, Any] = {"PATH_INFO": "/stream", "REQUEST_METHOD": "POST"}
    setup_testing_defaults(environ)
    body = wrapped(environ, lambda status, headers, exc=None: None)
    assert sink.records == []  # not finished before the server closes the body
    assert b"".join(body) == b"ab"
    body.close()  # type: ignore[attr-defined]
    (seg,) = segments(sink)
    assert len(seg[R.SEG_SPANS]) == 1
    assert tags_of(seg[R.SEG_SPANS][0])["http.method"] == "POST"


def test_wsgi_status_lines(sink: _sink.MemorySink) -> None:
    """The status tag and error flag from the status line: text and bytes, 2xx and 4xx; a line
    that is not a status is passed on untouched and leaves no tag."""
    statuses: list[Any] = ["201 Created", b"404 Not Found", "abc", None]
    seen: list[Any] = []
    for status in statuses:

        def app(environ: dict[str, Any], start_response: Any, status: Any = status) -> Iterator[bytes]:
            start_response(status, [])
            yield b"x"

        environ: dict[str, Any] = {"PATH_INFO": "/s"}
        setup_testing_defaults(environ)
        body = WSGIMiddleware(app)(environ, lambda s, h, exc=None: seen.append(s))
        assert b"".join(body) == b"x"
        body.close()  # type: ignore[attr-defined]
    assert seen == statuses
    spans = [seg[R.SEG_SPANS][0] for seg in segments(sink)]
    assert [tags_of(s).get("http.status_code") for s in spans] == ["201", "404", None, None]
    assert [s[R.SPAN_IS_ERROR] for s in spans] == [False, True, False, False]


def test_flask_inside_the_wsgi_middleware_names_the_outer_span(sink: _sink.MemorySink) -> None:
    import flask

    app = flask.Flask("nested")

    @app.route("/users/<int:uid>")
    def user(uid: int) -> str:
        return str(uid)

    environ: dict[str, Any] = {"PATH_INFO": "/users/3"}
    setup_testing_defaults(environ)
    body = WSGIMiddleware(app.wsgi_app)(environ, lambda s, h, exc=None: None)
    assert b"".join(body) == b"3"
    body.close()  # type: ignore[attr-defined]
    (seg,) = segments(sink)
    (span,) = seg[R.SEG_SPANS]  # Flask's own entry span is not opened inside the middleware's
    assert span[R.SPAN_OPERATION] == "/users/<int:uid>" and span[R.SPAN_COMPONENT] == Component.PYTHON
    assert tags_of(span)["http.status_code"] == "200"


def test_ignored_method_is_not_traced(sink: _sink.MemorySink) -> None:
    tracing.configure(load({}, plugin_http_ignore_method="OPTIONS"))

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("204 No Content", [])
        return []

    environ: dict[str, Any] = {"REQUEST_METHOD": "OPTIONS"}
    setup_testing_defaults(environ)
    WSGIMiddleware(app)(environ, lambda *a: None)
    assert sink.records == []


def test_ignored_method_is_not_traced_under_asgi(sink: _sink.MemorySink) -> None:
    """The ASGI entry asks the rules only when some method is ignored (as the WSGI one)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    tracing.configure(load({}, plugin_http_ignore_method="OPTIONS"))
    try:
        asyncio.run(_asgi_call(ASGIMiddleware(app), "/pre", [], method="OPTIONS"))
        assert sink.records == []
        asyncio.run(_asgi_call(ASGIMiddleware(app), "/get", [], method="get"))
        asyncio.run(_asgi_call(ASGIMiddleware(app), "/opt", [], method="options"))  # any case
        assert [s[R.SEG_SPANS][0][R.SPAN_OPERATION] for s in segments(sink)] == ["/get"]
    finally:
        tracing.configure(load({}))
    asyncio.run(_asgi_call(ASGIMiddleware(app), "/opt", [], method="OPTIONS"))  # none ignored now
    assert len(segments(sink)) == 2


def test_django_auto_install(sink: _sink.MemorySink) -> None:
    import django
    from django.conf import settings
    from django.http import HttpResponse
    from django.test.utils import override_settings
    from django.urls import path

    mod = types.ModuleType("swmp_test_django_urls")
    mod.urlpatterns = [path("hello/", lambda request: HttpResponse("hi"))]  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    if not settings.configured:  # other test modules may have configured Django already
        settings.configure(
            ROOT_URLCONF=mod.__name__,
            ALLOWED_HOSTS=["*"],
            DEBUG=False,
            SECRET_KEY="x",
            MIDDLEWARE=[],
            INSTALLED_APPS=[],
        )
        django.setup()
    from django.core.handlers.wsgi import WSGIHandler

    environ: dict[str, Any] = {"PATH_INFO": "/hello/", "HTTP_SW8": SW8}
    setup_testing_defaults(environ)
    statuses: list[str] = []
    with override_settings(ROOT_URLCONF=mod.__name__):
        result = WSGIHandler()(environ, lambda status, headers, exc=None: statuses.append(status))
        b"".join(result)
        result.close()
    assert statuses == ["200 OK"]
    (seg,) = segments(sink)
    (span,) = seg[R.SEG_SPANS]
    assert span[R.SPAN_COMPONENT] == Component.DJANGO and span[R.SPAN_OPERATION] == "/hello/"
    assert seg[R.SEG_TRACE_ID] == "trace-up"


async def _asgi_call(
    app: Any, path: str, headers: list[tuple[bytes, bytes]], method: str = "GET"
) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": headers,
        "query_string": b"",
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 5000),
        "root_path": "",
        "http_version": "1.1",
        "raw_path": path.encode(),
    }
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def test_starlette_auto_install(sink: _sink.MemorySink) -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def hello(request: Any) -> PlainTextResponse:
        with new_entry_span("/inner-entry") as nested:  # an entry inside the entry: not recorded
            assert not nested.recording
        return PlainTextResponse("hi", status_code=201)

    app = Starlette(routes=[Route("/hello", hello)])
    sent = asyncio.run(_asgi_call(app, "/hello", [(b"sw8", SW8.encode()), (b"host", b"example:80")]))
    assert sent[0]["status"] == 201
    (seg,) = segments(sink)
    (span,) = seg[R.SEG_SPANS]
    assert span[R.SPAN_COMPONENT] == Component.FASTAPI and span[R.SPAN_OPERATION] == "/hello"
    assert seg[R.SEG_TRACE_ID] == "trace-up"
    assert tags_of(span)["http.status_code"] == "201"
    assert tags_of(span)["http.url"] == "http://example:80/hello"
    assert span[R.SPAN_PEER] == "127.0.0.1:5000"


def test_asgi_middleware_error(sink: _sink.MemorySink) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        asyncio.run(_asgi_call(ASGIMiddleware(app), "/e", []))
    (seg,) = segments(sink)
    assert seg[R.SEG_SPANS][0][R.SPAN_IS_ERROR] is True


@pytest.mark.parametrize(
    ("headers", "trace", "url"),
    [
        # The spec's spelling: lowercased bytes; sw8 continued, host from the header.
        ([(b"x-a", b"1"), (b"sw8", SW8.encode()), (b"host", b"h:8")], "trace-up", "http://h:8/p"),
        # Other spellings some servers and tests use: still found, in one pass.
        ([(b"Host", b"H:9"), (b"SW8", SW8.encode())], "trace-up", "http://H:9/p"),
        ([("host", "s:1"), ("sw8", SW8)], "trace-up", "http://s:1/p"),
        # No host header: the server address; no sw8: a new trace.
        ([(b"x-b", b"2")], None, "http://127.0.0.1:80/p"),
        # Not a header list at all: traced, no continuation, the server address.
        (17, None, "http://127.0.0.1:80/p"),
    ],
)
def test_asgi_headers_are_found_in_any_spelling(
    sink: _sink.MemorySink, headers: Any, trace: str | None, url: str
) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent = asyncio.run(_asgi_call(ASGIMiddleware(app), "/p", headers))
    assert sent[0]["status"] == 204
    (seg,) = segments(sink)
    (span,) = seg[R.SEG_SPANS]
    assert (seg[R.SEG_TRACE_ID] == "trace-up") is (trace is not None)
    assert tags_of(span) == {"http.method": "GET", "http.url": url, "http.status_code": "204"}


def test_registry_disable_failure_version_and_absent(caplog: pytest.LogCaptureFixture) -> None:
    def fake(name: str, package: str | None, supported: tuple[str, str], fail: bool) -> str:
        mod = types.ModuleType(f"swmp_test_plugin_{name}")
        mod.NAME = name  # type: ignore[attr-defined]
        mod.PACKAGE = package  # type: ignore[attr-defined]
        mod.SUPPORTED = supported  # type: ignore[attr-defined]
        calls: list[str] = []
        mod.calls = calls  # type: ignore[attr-defined]

        def install(config: Any) -> None:
            if fail:
                raise RuntimeError("cannot patch")
            calls.append("installed")

        mod.install = install  # type: ignore[attr-defined]
        mod.uninstall = lambda: calls.append("uninstalled")  # type: ignore[attr-defined]
        sys.modules[mod.__name__] = mod
        return mod.__name__

    cfg = load({}, agent_disable_plugins="off*")
    with caplog.at_level(logging.WARNING, logger="swmp.instrument"):
        assert instrument.install_one(fake("ok", None, ("", ""), False), cfg) == ("ok", "installed")
        assert instrument.install_one(fake("off-one", None, ("", ""), False), cfg) == ("off-one", "disabled")
        _, status = instrument.install_one(fake("broken", None, ("", ""), True), cfg)
        assert status.startswith("failed")
        _, status = instrument.install_one(fake("old", "pytest", ("999", ""), False), cfg)
        assert status.startswith("unsupported version")
        assert instrument.install_one(fake("gone", "swmp_no_such_pkg", ("", ""), False), cfg)[1] == "absent"
    assert any("broken" in r.getMessage() for r in caplog.records)
    assert any("outside the supported range" in r.getMessage() for r in caplog.records)
    assert sys.modules["swmp_test_plugin_ok"].calls == ["installed"]  # type: ignore[attr-defined]
    instrument.uninstall_all()
    assert sys.modules["swmp_test_plugin_ok"].calls == ["installed", "uninstalled"]  # type: ignore[attr-defined]
    assert instrument.supported("2.31.0", ("2.20", "3")) and not instrument.supported("3.0", ("2.20", "3"))


def test_log_reporter_links_logs_to_traces(sink: _sink.MemorySink) -> None:
    handler = SkyWalkingLogHandler(level=logging.INFO, layout="%(levelname)s %(message)s")
    logger = logging.getLogger("app.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        with new_entry_span("/checkout") as span:
            logger.warning("paid %s", 42)
        logger.info("outside")
        logging.getLogger("swmp.whatever").addHandler(handler)
        logging.getLogger("swmp.whatever").error("own logs are never reported")
    finally:
        logger.removeHandler(handler)
        logging.getLogger("swmp.whatever").removeHandler(handler)
    logs = [orjson.loads(p) for t, p in sink.records if t == R.LOG]
    assert len(logs) == 2
    inside, outside = logs
    assert inside[5] == "WARNING paid 42" and inside[4] == "text"
    assert inside[6] == span.segment.trace_id and inside[7] == span.segment.segment_id and inside[8] == 0
    assert inside[3] == "/checkout"
    assert inside[9][:2] == ["level", "WARNING"]
    assert outside[6] == "" and outside[8] == -1


@pytest.mark.parametrize(
    ("pattern", "disabled"),
    [
        ("flask", True),  # swmp's own name
        ("fla*", True),  # a glob of it
        ("sw_flask", True),  # the peer agent's module name
        ("sw_(flask|django)", True),  # the peer agent's regular-expression form
        ("sw_fl.*", True),
        ("sw_django", False),
        ("django", False),
        ("[", False),  # neither a valid regex nor a matching glob: ignored, never raises
        ("", False),
    ],
)
def test_disable_plugins_accepts_swmp_and_peer_agent_names(pattern: str, disabled: bool) -> None:
    assert instrument.is_disabled("flask", (pattern,), ("sw_flask",)) is disabled


def test_every_builtin_instrumentation_can_be_disabled_by_its_peer_agent_name() -> None:
    import importlib

    cfg = load({"SW_AGENT_DISABLE_PLUGINS": "sw_requests, sw_urllib3"})
    for path in ("swmp.instrument.requests", "swmp.instrument.urllib3"):
        mod = importlib.import_module(path)
        assert instrument.is_disabled(mod.NAME, cfg.agent_disable_plugins, mod.PEER_NAMES)
    flask_mod = importlib.import_module("swmp.instrument.flask")
    assert not instrument.is_disabled(flask_mod.NAME, cfg.agent_disable_plugins, flask_mod.PEER_NAMES)


@pytest.mark.parametrize("pure", [False, True])
def test_uvicorn_root_path_is_in_the_url_once(
    sink: _sink.MemorySink, monkeypatch: pytest.MonkeyPatch, pure: bool
) -> None:
    """Uvicorn behind a proxy that strips a prefix (``--root-path /api``) gives the
    application a ``path`` that already starts with ``root_path``, as the ASGI spec says:
    ``http.url`` is the URL the application sees (Starlette's ``request.url``), not one
    with the root path twice. Both the native entry and the Python one (``pure``)."""
    import socket
    import threading
    import urllib.request

    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from swmp.instrument import asgi

    if pure:
        monkeypatch.setattr(asgi, "_entry", asgi._py_entry)

    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse(str(request.url))

    app = Starlette(routes=[Route("/hello/{x}", hello)])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, root_path="/api", log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait = threading.Event()
        while not server.started and thread.is_alive():
            wait.wait(0.01)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/hello/1", timeout=10) as resp:
            seen_by_app = resp.read().decode()
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    assert seen_by_app == f"http://127.0.0.1:{port}/api/hello/1"
    (span,) = [s for seg in segments(sink) for s in seg[R.SEG_SPANS] if s[R.SPAN_TYPE] == Kind.ENTRY]
    assert span[R.SPAN_COMPONENT] == Component.FASTAPI
    assert tags_of(span)["http.url"] == seen_by_app


@pytest.mark.parametrize("pure", [False, True])
def test_uvicorn_500_for_an_application_that_raised_before_answering(
    sink: _sink.MemorySink, monkeypatch: pytest.MonkeyPatch, pure: bool
) -> None:
    """An ASGI application that raises before ``http.response.start``: Uvicorn answers 500
    and the entry span says so (``http.status_code`` 500 beside the error log); one that
    raises after starting its response keeps the status it sent (Uvicorn only closes the
    connection). With the native status sender and the Python one (``pure``)."""
    import http.client
    import socket
    import threading
    import urllib.error
    import urllib.request

    import uvicorn

    from swmp.instrument import asgi

    if pure:
        monkeypatch.setattr(asgi, "_status_sender", asgi._py_status_sender)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/after":
            await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("raised on purpose")

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(ASGIMiddleware(app), log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait = threading.Event()
        while not server.started and thread.is_alive():
            wait.wait(0.01)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/before", timeout=10)
        assert e.value.code == 500  # what Uvicorn answered
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/after", timeout=10) as resp:
            assert resp.status == 200
            with pytest.raises(http.client.IncompleteRead):  # the server closed mid-answer
                resp.read()
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    spans = [s for seg in segments(sink) for s in seg[R.SEG_SPANS]]
    entries = {s[R.SPAN_OPERATION]: s for s in spans if s[R.SPAN_TYPE] == Kind.ENTRY}
    assert tags_of(entries["/before"])["http.status_code"] == "500"
    assert tags_of(entries["/after"])["http.status_code"] == "200"
    for span in entries.values():
        assert span[R.SPAN_IS_ERROR] and len(span[R.SPAN_LOGS]) == 1
