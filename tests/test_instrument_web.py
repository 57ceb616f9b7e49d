"""Web frameworks in process: each framework's own WSGI/ASGI callable (or a real
``http.server``) driven directly, the segments read from an in-memory sink.

What every framework must give: its component id, the route template as the operation
name (many ids -> one name), method/url/status tags, the caller's ``sw8`` continued, and
an exception the framework turns into a 500 logged on the span with its stack while the
framework's own answer is unchanged. The same frameworks under their production servers
(Gunicorn, Uvicorn, ``swmp run``) are in ``test_web_servers.py``.
"""

from __future__ import annotations

import asyncio
import http.client
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest

from reporter_proc import records as R
from swmp import _sink, instrument, propagation, tracing
from swmp.config import load
from swmp.tracing import Component
from swmp.tracing.context import new_exit_span
from tests.instrumented import instrumented
from tests.test_instrument_frameworks import SW8, segments, tags_of


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    # The tests' own http.client requests are not traced: only the servers' spans count.
    with instrumented(agent_disable_plugins="http.client") as (memory, _):
        yield memory


def entry(seg: list[Any]) -> list[Any]:
    (span,) = [s for s in seg[R.SEG_SPANS] if s[R.SPAN_PARENT_ID] == -1]
    return span  # type: ignore[no-any-return]


def error_logs(span: list[Any]) -> list[dict[str, str]]:
    out = []
    for _, data in span[R.SPAN_LOGS]:
        fields = dict(zip(data[::2], data[1::2], strict=True))
        if fields.get("event") == "error":
            out.append(fields)
    return out


def wsgi_get(app: Any, path: str, headers: dict[str, str] | None = None) -> tuple[str, bytes]:
    path, _, qs = path.partition("?")
    environ: dict[str, Any] = {"PATH_INFO": path, "QUERY_STRING": qs, "REQUEST_METHOD": "GET"}
    for k, v in (headers or {}).items():
        environ["HTTP_" + k.upper().replace("-", "_")] = v
    setup_testing_defaults(environ)
    status: list[str] = []
    body = app(environ, lambda s, h, exc=None: status.append(s))
    try:
        data = b"".join(body)
    finally:
        close = getattr(body, "close", None)
        if close is not None:
            close()
    return status[0], data


async def asgi_get(app: Any, path: str, headers: list[tuple[bytes, bytes]] = ()) -> list[dict[str, Any]]:  # type: ignore[assignment]
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "headers": [(b"host", b"example:80"), *headers],
        "query_string": b"",
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 5000),
        "root_path": "",
        "http_version": "1.1",
    }
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # the client never disconnects during the test
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def check_routes(sink: _sink.MemorySink, template: str, component: int, n: int) -> list[list[Any]]:
    """``n`` segments, one entry span each, all named ``template``; returns the segments."""
    segs = segments(sink)
    assert len(segs) == n
    for seg in segs:
        span = entry(seg)
        assert span[R.SPAN_OPERATION] == template
        assert span[R.SPAN_COMPONENT] == component
    return segs


def check_500(seg: list[Any], exc_name: str, message: str) -> None:
    span = entry(seg)
    assert span[R.SPAN_IS_ERROR] is True
    assert tags_of(span)["http.status_code"] == "500"
    (log,) = error_logs(span)
    assert log["error.kind"] == exc_name and log["message"] == message
    assert "Traceback (most recent call last)" in log["stack"] and exc_name in log["stack"]


# -- Flask ----------------------------------------------------------------------------------------
def test_flask_rule_names_and_500_stack(sink: _sink.MemorySink) -> None:
    import flask

    app = flask.Flask("web")

    @app.route("/users/<int:uid>")
    def user(uid: int) -> str:
        return str(uid)

    @app.route("/boom")
    def boom() -> str:
        raise ValueError("kaput")

    for i in range(5):
        assert wsgi_get(app, f"/users/{i}", {"sw8": SW8}) == ("200 OK", str(i).encode())
    segs = check_routes(sink, "/users/<int:uid>", Component.FLASK, 5)
    assert all(s[R.SEG_TRACE_ID] == "trace-up" for s in segs)
    assert tags_of(entry(segs[0]))["http.url"].endswith("/users/0")
    sink.records.clear()

    status, _ = wsgi_get(app, "/boom")
    assert status.startswith("500")
    check_500(segments(sink)[0], "ValueError", "kaput")
    sink.records.clear()

    # Flask re-raises when testing: the same exception reaches the WSGI entry too, one log.
    app.testing = True
    with pytest.raises(ValueError, match="kaput"):
        wsgi_get(app, "/boom")
    (seg,) = segments(sink)
    assert len(error_logs(entry(seg))) == 1


def test_unmatched_path_keeps_the_path_and_404_has_no_stack(sink: _sink.MemorySink) -> None:
    import flask

    app = flask.Flask("web404")
    status, _ = wsgi_get(app, "/nowhere/1")
    assert status.startswith("404")
    (seg,) = segments(sink)
    assert entry(seg)[R.SPAN_OPERATION] == "/nowhere/1"
    assert entry(seg)[R.SPAN_IS_ERROR] is True and error_logs(entry(seg)) == []


def test_route_templates_can_be_turned_off() -> None:
    import flask

    s = _sink.MemorySink()
    _sink.set_sink(s)
    cfg = load({}, agent_log_reporter_active=False, plugin_http_route_templates=False)
    tracing.configure(cfg)
    instrument.install_all(cfg)
    try:
        app = flask.Flask("off")
        app.add_url_rule("/users/<int:uid>", "u", lambda uid: "x")
        wsgi_get(app, "/users/7")
        assert entry(segments(s)[0])[R.SPAN_OPERATION] == "/users/7"
    finally:
        instrument.uninstall_all()
        _sink.set_sink(None)


def test_late_name_is_the_endpoint_of_injected_headers_and_ignore_sees_the_path() -> None:
    """A span renamed after an ``sw8`` was already injected: later injections carry the new
    endpoint. Ignore rules decide on the name the span started with (the path)."""
    import flask

    s = _sink.MemorySink()
    _sink.set_sink(s)
    cfg = load({}, agent_log_reporter_active=False, agent_trace_ignore_path="/health/**")
    tracing.configure(cfg)
    instrument.install_all(cfg)
    seen: list[str] = []
    try:
        app = flask.Flask("late")

        @app.before_request
        def early_call() -> None:  # an outgoing call before routing is known to the agent
            with new_exit_span("/early", "peer:1") as ex:
                seen.append(ex.inject()["sw8"])

        @app.route("/orders/<oid>")
        def order(oid: str) -> str:
            with new_exit_span("/later", "peer:1") as ex:
                seen.append(ex.inject()["sw8"])
            return oid

        app.add_url_rule("/health/<part>", "h", lambda part: "ok")
        wsgi_get(app, "/orders/9")
        wsgi_get(app, "/health/live")
    finally:
        instrument.uninstall_all()
        _sink.set_sink(None)
    endpoints = [propagation.decode_sw8(h).endpoint for h in seen]
    # before_request runs after Flask matched the URL: both carry the rule.
    assert endpoints == ["/orders/<oid>", "/orders/<oid>"]
    (seg,) = segments(s)  # /health/live was ignored by its path
    assert entry(seg)[R.SPAN_OPERATION] == "/orders/<oid>"


# -- Django ---------------------------------------------------------------------------------------
def _django_urls() -> str:
    import django
    from django.conf import settings
    from django.http import HttpResponse
    from django.urls import include, path, re_path

    name = "swmp_test_web_urls"
    if name not in sys.modules:

        def user(request: Any, pk: int) -> HttpResponse:
            return HttpResponse(str(pk))

        def boom(request: Any) -> HttpResponse:
            raise ZeroDivisionError("django kaput")

        async def async_user(request: Any, pk: int) -> HttpResponse:
            return HttpResponse(f"a{pk}")

        inner = types.ModuleType(name + "_inner")
        inner.urlpatterns = [path("items/<int:pk>/", user)]  # type: ignore[attr-defined]
        sys.modules[inner.__name__] = inner
        mod = types.ModuleType(name)
        mod.urlpatterns = [  # type: ignore[attr-defined]
            path("users/<int:pk>/", user),
            path("ausers/<int:pk>/", async_user),
            path("shop/", include(inner.__name__)),
            re_path(r"^old/(?P<pk>[0-9]+)/$", user),
            path("boom/", boom),
        ]
        sys.modules[name] = mod
    if not settings.configured:
        settings.configure(
            ROOT_URLCONF=name,
            ALLOWED_HOSTS=["*"],
            DEBUG=False,
            SECRET_KEY="x",
            MIDDLEWARE=[],
            INSTALLED_APPS=[],
        )
        django.setup()
    return name


def test_django_wsgi_routes_and_500_stack(sink: _sink.MemorySink) -> None:
    from django.test.utils import override_settings

    urls = _django_urls()
    from django.core.handlers.wsgi import WSGIHandler

    with override_settings(ROOT_URLCONF=urls):
        handler = WSGIHandler()
        for i in range(3):
            assert wsgi_get(handler, f"/users/{i}/", {"sw8": SW8})[0] == "200 OK"
        segs = check_routes(sink, "/users/<int:pk>/", Component.DJANGO, 3)
        assert segs[0][R.SEG_TRACE_ID] == "trace-up"
        sink.records.clear()
        wsgi_get(handler, "/shop/items/5/")
        wsgi_get(handler, "/old/12/")
        nested, regex = segments(sink)
        assert entry(nested)[R.SPAN_OPERATION] == "/shop/items/<int:pk>/"
        assert entry(regex)[R.SPAN_OPERATION] == "/old/(?P<pk>[0-9]+)/$"
        sink.records.clear()
        status, _ = wsgi_get(handler, "/boom/")
        assert status.startswith("500")
        check_500(segments(sink)[0], "ZeroDivisionError", "django kaput")


def test_django_asgi_is_traced_automatically(sink: _sink.MemorySink) -> None:
    from django.test.utils import override_settings

    urls = _django_urls()
    from django.core.handlers.asgi import ASGIHandler

    with override_settings(ROOT_URLCONF=urls):
        app = ASGIHandler()

        async def run() -> list[list[dict[str, Any]]]:
            return [
                await asgi_get(app, "/users/1/", [(b"sw8", SW8.encode())]),
                await asgi_get(app, "/ausers/2/"),
                await asgi_get(app, "/boom/"),
            ]

        sync_view, async_view, boom = asyncio.run(run())
    assert sync_view[0]["status"] == 200 and async_view[0]["status"] == 200 and boom[0]["status"] == 500
    s1, s2, s3 = segments(sink)
    assert entry(s1)[R.SPAN_OPERATION] == "/users/<int:pk>/" and s1[R.SEG_TRACE_ID] == "trace-up"
    assert entry(s1)[R.SPAN_COMPONENT] == Component.DJANGO
    assert tags_of(entry(s1))["http.status_code"] == "200"
    assert tags_of(entry(s1))["http.url"] == "http://example:80/users/1/"
    assert entry(s2)[R.SPAN_OPERATION] == "/ausers/<int:pk>/"
    check_500(s3, "ZeroDivisionError", "django kaput")


def test_django_asgi_entry_point_stays_a_coroutine_function(sink: _sink.MemorySink) -> None:
    """Servers (Uvicorn's interface detection) ask whether the application is a coroutine
    function: Django's ``__call__`` is left as it is; with the native core the span is
    opened in ``handle``, which ``__call__`` awaits, without a coroutine of swmp's."""
    import inspect

    from django.core.handlers.asgi import ASGIHandler

    from swmp.instrument._patch import ORIGINAL
    from swmp.tracing.span import NATIVE

    assert inspect.iscoroutinefunction(ASGIHandler.__call__)
    patched = "handle" if NATIVE else "__call__"
    assert hasattr(ASGIHandler.__dict__[patched], ORIGINAL)


# -- Starlette ------------------------------------------------------------------------------------
def test_starlette_route_and_mount_templates_and_500_stack(sink: _sink.MemorySink) -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    async def user(request: Any) -> PlainTextResponse:
        return PlainTextResponse(str(request.path_params["uid"]))

    async def boom(request: Any) -> PlainTextResponse:
        raise LookupError("starlette kaput")

    app = Starlette(
        routes=[
            Route("/users/{uid:int}", user),
            Mount("/orgs/{org}", routes=[Route("/members/{uid}", user)]),
            Route("/boom", boom),
        ]
    )

    async def run() -> None:
        for i in range(3):
            await asgi_get(app, f"/users/{i}", [(b"sw8", SW8.encode())])
        await asgi_get(app, "/orgs/acme/members/3")

    asyncio.run(run())
    segs = segments(sink)
    assert [entry(s)[R.SPAN_OPERATION] for s in segs] == ["/users/{uid}"] * 3 + ["/orgs/{org}/members/{uid}"]
    assert segs[0][R.SEG_TRACE_ID] == "trace-up"
    sink.records.clear()
    with pytest.raises(LookupError):  # Starlette's ServerErrorMiddleware answers 500, then re-raises
        asyncio.run(asgi_get(app, "/boom"))
    check_500(segments(sink)[0], "LookupError", "starlette kaput")


# -- Falcon ---------------------------------------------------------------------------------------
class _FalconUser:
    def on_get(self, req: Any, resp: Any, uid: int) -> None:
        resp.text = str(uid)


class _FalconBoom:
    def on_get(self, req: Any, resp: Any) -> None:
        raise KeyError("falcon kaput")


class _FalconAsyncUser:
    async def on_get(self, req: Any, resp: Any, uid: int) -> None:
        resp.text = str(uid)


class _FalconAsyncBoom:
    async def on_get(self, req: Any, resp: Any) -> None:
        raise KeyError("falcon kaput")


def test_falcon_wsgi_template_and_500_stack(sink: _sink.MemorySink) -> None:
    import falcon

    app = falcon.App()
    app.add_route("/users/{uid:int}", _FalconUser())
    app.add_route("/boom", _FalconBoom())
    for i in range(3):
        assert wsgi_get(app, f"/users/{i}", {"sw8": SW8}) == ("200 OK", str(i).encode())
    segs = check_routes(sink, "/users/{uid:int}", Component.FALCON, 3)
    assert segs[0][R.SEG_TRACE_ID] == "trace-up"
    assert tags_of(entry(segs[0]))["http.method"] == "GET"
    sink.records.clear()
    status, _ = wsgi_get(app, "/boom")
    assert status.startswith("500")
    check_500(segments(sink)[0], "KeyError", "'falcon kaput'")


def test_falcon_asgi_template_and_500_stack(sink: _sink.MemorySink) -> None:
    import falcon.asgi

    app = falcon.asgi.App()
    app.add_route("/users/{uid:int}", _FalconAsyncUser())
    app.add_route("/boom", _FalconAsyncBoom())

    async def run() -> list[list[dict[str, Any]]]:
        return [await asgi_get(app, f"/users/{i}", [(b"sw8", SW8.encode())]) for i in range(3)] + [
            await asgi_get(app, "/boom")
        ]

    *ok, boom = asyncio.run(run())
    assert all(sent[0]["status"] == 200 for sent in ok) and boom[0]["status"] == 500
    segs = segments(sink)
    for seg in segs[:3]:
        assert entry(seg)[R.SPAN_OPERATION] == "/users/{uid:int}"
        assert entry(seg)[R.SPAN_COMPONENT] == Component.FALCON and seg[R.SEG_TRACE_ID] == "trace-up"
    check_500(segs[3], "KeyError", "'falcon kaput'")


# -- Pyramid --------------------------------------------------------------------------------------
def _pyramid_app(exception_view: bool) -> Any:
    from pyramid.config import Configurator
    from pyramid.response import Response

    def user(request: Any) -> Response:
        return Response(request.matchdict["uid"])

    def boom(request: Any) -> Response:
        raise OSError("pyramid kaput")

    def failed(exc: Exception, request: Any) -> Response:
        return Response("sorry", status=500)

    with Configurator() as config:
        config.add_route("user", "/users/{uid}")
        config.add_view(user, route_name="user")
        config.add_route("boom", "/boom")
        config.add_view(boom, route_name="boom")
        if exception_view:
            config.add_exception_view(failed, context=OSError)
        return config.make_wsgi_app()


def test_pyramid_pattern_and_500_stack(sink: _sink.MemorySink) -> None:
    app = _pyramid_app(exception_view=True)
    for i in range(3):
        assert wsgi_get(app, f"/users/{i}", {"sw8": SW8}) == ("200 OK", str(i).encode())
    segs = check_routes(sink, "/users/{uid}", Component.PYRAMID, 3)
    assert segs[0][R.SEG_TRACE_ID] == "trace-up"
    sink.records.clear()
    assert wsgi_get(app, "/boom") == ("500 Internal Server Error", b"sorry")  # the app's own view
    check_500(segments(sink)[0], "OSError", "pyramid kaput")


def test_pyramid_unhandled_exception_propagates_and_is_logged_once(sink: _sink.MemorySink) -> None:
    app = _pyramid_app(exception_view=False)
    with pytest.raises(OSError, match="pyramid kaput"):
        wsgi_get(app, "/boom")
    (seg,) = segments(sink)
    span = entry(seg)
    assert span[R.SPAN_OPERATION] == "/boom" and span[R.SPAN_IS_ERROR] is True
    assert len(error_logs(span)) == 1


# -- Bottle ---------------------------------------------------------------------------------------
def test_bottle_rule_and_500_stack(sink: _sink.MemorySink) -> None:
    import bottle

    app = bottle.Bottle()

    @app.route("/users/<uid:int>")
    def user(uid: int) -> str:
        return str(uid)

    @app.route("/boom")
    def boom() -> str:
        raise AttributeError("bottle kaput")

    for i in range(3):
        assert wsgi_get(app, f"/users/{i}", {"sw8": SW8}) == ("200 OK", str(i).encode())
    segs = check_routes(sink, "/users/<uid:int>", Component.BOTTLE, 3)
    assert segs[0][R.SEG_TRACE_ID] == "trace-up"
    sink.records.clear()
    status, body = wsgi_get(app, "/boom")
    assert status.startswith("500") and b"Internal Server Error" in body  # Bottle's own page
    check_500(segments(sink)[0], "AttributeError", "bottle kaput")


# -- http.server ----------------------------------------------------------------------------------
def test_http_server_request_handler(sink: _sink.MemorySink) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: several requests on one handler

        def do_GET(self) -> None:
            if self.path.startswith("/boom"):
                raise RuntimeError("handler kaput")
            body = b"ok"
            self.send_response(201)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        for i in range(2):
            conn.request("GET", f"/items/{i}?q=1", headers={"sw8": SW8})
            resp = conn.getresponse()
            assert resp.status == 201 and resp.read() == b"ok"
        conn.request("GET", "/boom")
        with pytest.raises((http.client.HTTPException, OSError)):
            conn.getresponse()
        conn.close()
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)
    segs = segments(sink)
    assert len(segs) == 3
    a, b, boom = segs
    assert entry(a)[R.SPAN_OPERATION] == "/items/0" and entry(b)[R.SPAN_OPERATION] == "/items/1"
    assert entry(a)[R.SPAN_COMPONENT] == Component.PYTHON and a[R.SEG_TRACE_ID] == "trace-up"
    tags = tags_of(entry(a))
    assert tags["http.status_code"] == "201" and tags["http.method"] == "GET"
    assert tags["http.url"] == f"http://127.0.0.1:{server.server_address[1]}/items/0"
    assert entry(a)[R.SPAN_PEER].startswith("127.0.0.1:")
    span = entry(boom)
    assert span[R.SPAN_IS_ERROR] is True
    (log,) = error_logs(span)
    assert log["error.kind"] == "RuntimeError" and "handler kaput" in log["stack"]


def test_http_server_over_tls_records_an_https_url(sink: _sink.MemorySink, tmp_path: Path) -> None:
    """A TLS-wrapped ``http.server`` (its listening socket wrapped, so each request's socket
    is an ``ssl.SSLSocket``): the entry span's ``http.url`` is ``https://``."""
    import ssl
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.tls_support import make_pki

    pki = make_pki(tmp_path / "pki")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(pki.server, pki.server_key)
    server.socket = server_ctx.wrap_socket(server.socket, server_side=True)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    port = server.server_address[1]
    try:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", port, timeout=10, context=ssl.create_default_context(cafile=str(pki.ca))
        )
        conn.request("GET", "/secure?q=1")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b"ok"
        conn.close()
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)
    (span,) = [s for g in segments(sink) for s in g[R.SEG_SPANS] if s[R.SPAN_TYPE] == R.SPAN_TYPE_ENTRY]
    assert tags_of(span)["http.url"] == f"https://127.0.0.1:{port}/secure"


def test_wsgiref_server_leaves_the_entry_span_to_the_framework(sink: _sink.MemorySink) -> None:
    """A WSGI app under ``wsgiref``'s server (built on http.server) keeps its framework's span."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    import bottle

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    app = bottle.Bottle()
    app.route("/users/<uid>", callback=lambda uid: uid)
    server = make_server("127.0.0.1", 0, app, handler_class=Quiet)
    t = threading.Thread(target=server.handle_request, daemon=True)
    t.start()
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    conn.request("GET", "/users/1")
    assert conn.getresponse().read() == b"1"
    conn.close()
    t.join(10)
    server.server_close()
    (seg,) = segments(sink)
    assert len(seg[R.SEG_SPANS]) == 1
    assert entry(seg)[R.SPAN_COMPONENT] == Component.BOTTLE
    assert entry(seg)[R.SPAN_OPERATION] == "/users/<uid>"


def test_renaming_after_an_injection_changes_the_endpoint_of_later_injections(
    sink: _sink.MemorySink,
) -> None:
    from swmp.tracing.context import new_entry_span

    with new_entry_span("/users/7") as entry_span:
        with new_exit_span("/a", "peer:1") as ex:
            before = propagation.decode_sw8(ex.inject()["sw8"])
        entry_span.set_operation("/users/{id}")
        with new_exit_span("/b", "peer:1") as ex:
            after = propagation.decode_sw8(ex.inject()["sw8"])
    assert before is not None and after is not None
    assert (before.endpoint, after.endpoint) == ("/users/7", "/users/{id}")
    assert before.segment_id == after.segment_id
    (seg,) = segments(sink)
    assert entry(seg)[R.SPAN_OPERATION] == "/users/{id}"
