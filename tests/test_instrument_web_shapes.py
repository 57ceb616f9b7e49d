"""Entry spans of request shapes off the common path: what the span records for a path beyond
ASCII and for an application's error answer (``start_response`` with ``exc_info``), in the
native request (swmp/_native/wsgi.c, status.c) and its Python form alike, and through a real
framework and a real server."""

from __future__ import annotations

import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson
import pytest

from reporter_proc import records as R
from swmp import _sink
from swmp.instrument import wsgi
from swmp.tracing import Kind
from swmp.tracing.span import native_core
from tests.instrumented import instrumented

FORMS = ["python"] + (["native"] if native_core is not None else [])


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with instrumented() as (memory, _):
        yield memory


def spans(sink: _sink.MemorySink) -> list[list[Any]]:
    return [orjson.loads(p)[R.SEG_SPANS][0] for t, p in sink.records if t == R.SEGMENT]


def tags_of(span: list[Any]) -> list[tuple[str, str]]:
    t = span[R.SPAN_TAGS]
    return list(zip(t[::2], t[1::2], strict=True))


def _run(form: str, app: Any, environ: dict[str, Any], start_response: Any) -> Any:
    call = native_core.wsgi_call if form == "native" else wsgi._py_trace_wsgi
    return call(app, environ, start_response, 7001, False, 0)


def _environ(**fields: Any) -> dict[str, Any]:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "SCRIPT_NAME": "", "HTTP_HOST": "h:80"}
    environ.update(fields)
    return environ


@pytest.mark.parametrize("form", FORMS)
def test_a_path_beyond_ascii_is_the_text_the_client_sent(sink: _sink.MemorySink, form: str) -> None:
    """PEP 3333 hands the path's UTF-8 bytes over as latin-1 characters (``/café`` is
    ``/cafÃ©``): the operation name and ``http.url`` are ``/café``, as under ASGI; a path
    whose bytes are not UTF-8 is kept as the server gave it. The application sees its
    environ unchanged."""
    seen: list[str] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.append(environ["PATH_INFO"])
        start_response("404 Not Found", [])
        return [b""]

    utf8 = "/caf\u00e9/\u65e5".encode().decode("latin-1")
    _run(form, app, _environ(PATH_INFO=utf8, SCRIPT_NAME="/\u00c3\u00bc"), lambda *a: None)
    _run(form, app, _environ(PATH_INFO="/\xff"), lambda *a: None)
    assert seen == [utf8, "/\xff"]
    first, second = spans(sink)
    assert first[R.SPAN_OPERATION] == "/caf\u00e9/\u65e5"
    assert ("http.url", "http://h:80/\u00fc/caf\u00e9/\u65e5") in tags_of(first)
    assert second[R.SPAN_OPERATION] == "/\xff"


def test_flask_404_beyond_ascii_is_named_after_the_path(sink: _sink.MemorySink) -> None:
    import flask

    app = flask.Flask("shapes")
    with app.test_client().get("/caf%C3%A9") as resp:
        assert resp.status_code == 404
    (span,) = spans(sink)
    assert span[R.SPAN_OPERATION] == "/caf\u00e9"
    assert ("http.url", "http://localhost/caf\u00e9") in tags_of(span)


class _Server:
    """A server's start_response as PEP 3333 has it: an error answer replaces the status
    while no header was sent, else re-raises the exception."""

    def __init__(self) -> None:
        self.status: str | None = None
        self.sent = False

    def __call__(self, status: str, headers: Any, exc_info: Any = None) -> Any:
        if exc_info is not None:
            if self.sent:
                raise exc_info[1].with_traceback(exc_info[2])
        elif self.status is not None:
            raise AssertionError("headers already set")
        self.status = status
        return lambda data: None


def _failing_app(after_first_chunk: bool) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [])
        if after_first_chunk:
            yield b"part"
        try:
            raise ValueError("late failure")
        except ValueError:
            start_response("500 Internal Server Error", [], sys.exc_info())
        yield b"error page"

    return app


@pytest.mark.parametrize("form", FORMS)
def test_an_error_answer_leaves_one_status_the_servers(sink: _sink.MemorySink, form: str) -> None:
    """``start_response(..., exc_info)`` before any byte was sent replaces the status: the
    span has the new one only (not 200 and 500 side by side). Once a byte was sent the
    server refuses it (re-raises): the span keeps the status that went out."""
    server = _Server()
    body = _run(form, _failing_app(False), _environ(), server)
    assert list(body) == [b"error page"]
    body.close()
    assert server.status == "500 Internal Server Error"

    server = _Server()
    body = _run(form, _failing_app(True), _environ(), server)
    it = iter(body)
    assert next(it) == b"part"
    server.sent = True
    with pytest.raises(ValueError, match="late failure"):
        next(it)
    body.close()
    assert server.status == "200 OK"
    replaced, refused = spans(sink)
    assert [v for k, v in tags_of(replaced) if k == "http.status_code"] == ["500"]
    assert replaced[R.SPAN_IS_ERROR] is True
    assert [v for k, v in tags_of(refused) if k == "http.status_code"] == ["200"]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_an_error_answer_under_wsgiref(sink: _sink.MemorySink) -> None:
    """The same through a real server (wsgiref): the client gets the 500, the span one 500."""
    server: WSGIServer = make_server(
        "127.0.0.1", 0, wsgi.WSGIMiddleware(_failing_app(False)), handler_class=_Quiet
    )
    thread = threading.Thread(target=server.handle_request)
    thread.start()
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/x", timeout=30)
        assert err.value.code == 500 and err.value.read() == b"error page"
    finally:
        thread.join(30)
        server.server_close()
    (span,) = [s for s in spans(sink) if s[R.SPAN_TYPE] == Kind.ENTRY]  # (urllib's exit too)
    assert [v for k, v in tags_of(span) if k == "http.status_code"] == ["500"]


class _PyFile:
    """A file-like object of Python's (it takes a ``close`` of the agent's)."""

    def __init__(self) -> None:
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        return b""

    def close(self) -> None:
        self.closed = True


class _ClosedSlots:
    __slots__ = ()

    def read(self, n: int = -1) -> bytes:
        return b""

    def close(self) -> None:
        pass

    def __enter__(self) -> _ClosedSlots:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.mark.parametrize("form", FORMS)
def test_uwsgi_file_wrapper_response_goes_back_as_it_is(
    sink: _sink.MemorySink, form: str, tmp_path: Any
) -> None:
    """uWSGI's ``wsgi.file_wrapper`` is a function that gives back the file itself, and uWSGI
    sends with ``sendfile`` only the very object it gave (by identity): the response goes
    back unwrapped (wrapped, uWSGI iterated the file line by line: strace showed no
    sendfile). The span ends when the server closes it, or at once for an object that takes
    no ``close`` of the agent's."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"a\nb\n")

    def uwsgi_sendfile(filelike: Any, chunk: int = 0) -> Any:
        return filelike

    def app_of(filelike: Any) -> Any:
        def app(environ: dict[str, Any], start_response: Any) -> Any:
            start_response("200 OK", [])
            return environ["wsgi.file_wrapper"](filelike, 8192)

        return app

    with open(path, "rb") as builtin:
        env = _environ(**{"wsgi.file_wrapper": uwsgi_sendfile})
        result = _run(form, app_of(builtin), env, lambda *a: None)
        assert result is builtin and spans(sink) == []
        result.close()
        assert builtin.closed and len(spans(sink)) == 1
    py_file = _PyFile()
    result = _run(form, app_of(py_file), _environ(**{"wsgi.file_wrapper": uwsgi_sendfile}), lambda *a: None)
    assert result is py_file and len(spans(sink)) == 1
    result.close()
    assert py_file.closed and len(spans(sink)) == 2
    with _ClosedSlots() as slotted:  # takes no close of ours: back as it is, the span ended
        result = _run(
            form, app_of(slotted), _environ(**{"wsgi.file_wrapper": uwsgi_sendfile}), lambda *a: None
        )
        assert result is slotted and len(spans(sink)) == 3


@pytest.mark.parametrize("pure", [False, True])
def test_asgi_second_response_start_under_uvicorn(
    sink: _sink.MemorySink, monkeypatch: pytest.MonkeyPatch, pure: bool
) -> None:
    """An ASGI application that sends ``http.response.start`` twice: Uvicorn refuses the
    second (its RuntimeError reaches the application, as without the agent) and the client
    got the first status; the span has that one status, not the refused 500 beside it. With
    the native status sender and the Python one (``pure``)."""
    import socket

    import uvicorn

    from swmp.instrument import asgi

    if pure:
        monkeypatch.setattr(asgi, "_status_sender", asgi._py_status_sender)
    refused: list[BaseException] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        try:
            await send({"type": "http.response.start", "status": 500, "headers": []})
        except RuntimeError as e:
            refused.append(e)
        await send({"type": "http.response.body", "body": b"ok"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(asgi.ASGIMiddleware(app), log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait = threading.Event()
        while not server.started and thread.is_alive():
            wait.wait(0.01)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/twice", timeout=30) as resp:
            assert resp.status == 200 and resp.read() == b"ok"
    finally:
        server.should_exit = True
        thread.join(30)
    assert len(refused) == 1
    (span,) = [s for s in spans(sink) if s[R.SPAN_TYPE] == Kind.ENTRY]
    assert [v for k, v in tags_of(span) if k == "http.status_code"] == ["200"]
    assert span[R.SPAN_IS_ERROR] is False
