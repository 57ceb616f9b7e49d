"""The native WSGI request (``wsgi_call``, swmp/_native/wsgi.c) does what the Python
``swmp.instrument.wsgi._py_trace_wsgi`` does, for every environ and application: the plain
requests it runs itself, the others it hands over. Each request runs through both; what the
application saw, what the server got back (body, status line, exception) and the segment
each recorded are compared."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from swmp import _sink, propagation, tracing
from swmp.config import load
from swmp.instrument import wsgi
from swmp.tracing.context import new_entry_span
from swmp.tracing.limits import limits
from swmp.tracing.span import NATIVE, current_span, native_core
from tests.native_forms import segments

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")

SW8 = propagation.encode_sw8(
    "trace-up", "seg-up", 4, propagation.b64("up"), propagation.b64("up-1"), "/up", "me:1"
)
_DROP = object()


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    memory = _sink.MemorySink()
    _sink.set_sink(memory)
    tracing.configure(load({}, agent_trace_ignore_path="/health"))
    yield memory
    tracing.configure(load({}))
    _sink.set_sink(None)


def _environ(**fields: Any) -> dict[str, Any]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/users/7",
        "SCRIPT_NAME": "",
        "QUERY_STRING": "a=1&b=2",
        "SERVER_NAME": "10.0.0.1",
        "SERVER_PORT": "8000",
        "HTTP_HOST": "example.com:8000",
        "REMOTE_ADDR": "10.0.0.2",
        "REMOTE_PORT": "40123",
        "wsgi.url_scheme": "http",
    }
    for key, value in fields.items():
        if value is _DROP:
            environ.pop(key, None)
        else:
            environ[key] = value
    return environ


def _app(kind: str) -> Callable[..., Any]:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        seen = current_span.get()
        environ["seen"] = None if seen is None else (seen.op, seen.kind)
        if kind == "raise-first":
            raise ValueError("before the status")
        start_response("500 Oops" if kind == "error" else "200 OK", [("Content-Type", "text/plain")])
        if kind == "raise":
            raise KeyError("after the status")
        if kind == "tuple":
            return (b"a", b"b")
        if kind == "list-subclass":
            return type("Body", (list,), {})([b"c"])
        if kind == "generator":
            return (chunk for chunk in (b"d", b"e"))
        return [b"ok"]

    return app


def _run(
    fn: Callable[..., Any], environ: dict[str, Any], kind: str, sink: _sink.MemorySink, *extra: Any
) -> Any:
    statuses: list[Any] = []

    def start_response(status: str, headers: Any, exc_info: Any = None) -> Any:
        statuses.append((status, headers))
        return None

    args = extra or (1, False, 1024)
    try:
        body = fn(_app(kind), environ, start_response, *args)
        after = current_span.get()
        chunks = list(body)
        close = getattr(body, "close", None)
        if close is not None:
            close()
        shape = type(body).__name__ if isinstance(body, (list, tuple)) else "iter"
        outcome: Any = ("returned", shape, chunks)
    except Exception as e:
        after = current_span.get()
        outcome = ("raised", type(e).__name__, str(e), e.__traceback__ is not None)
    records = segments(sink.records)
    sink.clear()
    return outcome, statuses, environ.get("seen"), after, records


def _both(
    environ: dict[str, Any], sink: _sink.MemorySink, kind: str = "list", *extra: Any
) -> tuple[Any, Any]:
    native = _run(native_core.wsgi_call, dict(environ), kind, sink, *extra)
    python = _run(wsgi._py_trace_wsgi, dict(environ), kind, sink, *extra)
    return native, python


CASES: list[dict[str, Any]] = [
    {},
    {"REQUEST_METHOD": "post"},
    {"REQUEST_METHOD": ""},
    {"REQUEST_METHOD": None},
    {"REQUEST_METHOD": _DROP},
    {"REQUEST_METHOD": b"GET"},
    {"PATH_INFO": ""},
    {"PATH_INFO": _DROP},
    {"PATH_INFO": None},
    {"PATH_INFO": "/health"},  # ignored: run unrecorded
    {"PATH_INFO": b"/bytes"},
    {"PATH_INFO": "/caf\u00e9/\U0001f600"},
    {"HTTP_HOST": _DROP},
    {"HTTP_HOST": ""},
    {"HTTP_HOST": None},
    {"HTTP_HOST": b"bytes:1"},
    {"HTTP_HOST": 7},
    {"HTTP_HOST": _DROP, "SERVER_NAME": None},
    {"HTTP_HOST": _DROP, "SERVER_NAME": _DROP, "SERVER_PORT": _DROP},
    {"HTTP_HOST": _DROP, "SERVER_PORT": 8000},
    {"HTTP_HOST": "", "SERVER_NAME": "s\u00e9rver"},
    {"wsgi.url_scheme": _DROP},
    {"wsgi.url_scheme": "https"},
    {"wsgi.url_scheme": None},
    {"wsgi.url_scheme": b"http"},
    {"SCRIPT_NAME": "/app"},
    {"SCRIPT_NAME": _DROP},
    {"SCRIPT_NAME": None},
    {"REMOTE_ADDR": _DROP},
    {"REMOTE_ADDR": ""},
    {"REMOTE_ADDR": None},
    {"REMOTE_ADDR": b"10.0.0.3"},
    {"REMOTE_ADDR": 0},
    {"REMOTE_PORT": _DROP},
    {"REMOTE_PORT": ""},
    {"REMOTE_PORT": None},
    {"REMOTE_PORT": 40123},
    {"REMOTE_PORT": 0},
    {"REMOTE_PORT": "0"},
    {"HTTP_SW8": SW8},
    {"HTTP_SW8": SW8, "HTTP_SW8_CORRELATION": "a:YQ==", "HTTP_SW8_X": "1"},
    {"HTTP_SW8": "1-bad"},
    {"HTTP_SW8": None},
    {"HTTP_SW8": SW8.encode()},
    {"HTTP_SW8": SW8, "HTTP_SW8_CORRELATION": 5},
]


@pytest.mark.parametrize("fields", CASES, ids=[repr(c)[:60] for c in CASES])
def test_each_environ_gives_the_python_request(sink: _sink.MemorySink, fields: dict[str, Any]) -> None:
    environ = _environ(**fields)
    native, python = _both(environ, sink)
    assert native == python
    assert _both(environ, sink, "list", 1, True, 3) == _both(environ, sink, "list", 1, True, 3)
    native, python = _both(environ, sink, "list", 1, True, 3)
    assert native == python


KINDS = ["list", "tuple", "list-subclass", "generator", "error", "raise", "raise-first"]


@pytest.mark.parametrize("kind", KINDS)
def test_each_application_outcome(sink: _sink.MemorySink, kind: str) -> None:
    native, python = _both(_environ(), sink, kind)
    assert native == python
    assert native[3] is None  # the context given back (or never taken) once the call returned
    if kind.startswith("raise"):
        assert native[0][0] == "raised" and native[0][3]
        (segment,) = native[4]
        assert segment[3][0][7] is True  # is_error, with the exception's log
        (log,) = segment[3][0][10]
        fields = dict(zip(log[0][::2], log[0][1::2], strict=True))
        assert fields["error.kind"] == native[0][1] and fields["message"] == native[0][2]


def test_the_exception_reaches_the_server_unchanged(sink: _sink.MemorySink) -> None:
    boom = RuntimeError("as raised")

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        raise boom

    with pytest.raises(RuntimeError) as caught:
        native_core.wsgi_call(app, _environ(), lambda *a: None, 1, False, 1024)
    assert caught.value is boom and current_span.get() is None
    assert len(sink.records) == 1


def test_calls_of_other_shapes_are_handed_over(sink: _sink.MemorySink) -> None:
    class Environ(dict[str, Any]):
        pass

    app = _app("list")
    body = native_core.wsgi_call(app, Environ(_environ()), lambda *a: None)  # defaults: Python's
    assert list(body) == [b"ok"] and len(sink.records) == 1
    body = native_core.wsgi_call(app, _environ(), lambda *a: None, component=1, collect_params=True)
    assert list(body) == [b"ok"] and len(sink.records) == 2
    with pytest.raises(TypeError):
        native_core.wsgi_call(app)


def test_ignored_methods_short_tag_limits_and_a_span_already_current(sink: _sink.MemorySink) -> None:
    tracing.configure(load({}, plugin_http_ignore_method="OPTIONS"))
    for method in ("OPTIONS", "options", "GET"):
        native, python = _both(_environ(REQUEST_METHOD=method), sink)
        assert native == python
    assert _both(_environ(REQUEST_METHOD="OPTIONS"), sink)[0][4] == []
    tracing.configure(load({}, agent_trace_ignore_path="/health"))
    saved = limits.tag_value_max
    limits.tag_value_max = 8  # the URL is clipped by Span.tag, not set as one list
    try:
        native, python = _both(_environ(), sink)
        assert native == python and native[4]
    finally:
        limits.tag_value_max = saved
    with new_entry_span("/outer"):  # a request inside another entry span: what decide_entry_span answers
        native, python = _both(_environ(), sink)
        assert native == python
    assert current_span.get() is None


def test_a_plain_request_runs_no_python_code_of_the_instrumentation(sink: _sink.MemorySink) -> None:
    called: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename == wsgi.__file__:
            called.append(frame.f_code.co_name)

    app = _app("list")
    for environ in (_environ(), _environ(HTTP_SW8=SW8), _environ(REMOTE_ADDR=_DROP, HTTP_HOST=_DROP)):
        sys.setprofile(profile)
        try:
            body = native_core.wsgi_call(app, environ, lambda *a: None, 1, False, 1024)
        finally:
            sys.setprofile(None)
        assert list(body) == [b"ok"] and called == []
    sys.setprofile(profile)
    try:
        native_core.wsgi_call(app, _environ(REMOTE_PORT=1), lambda *a: None, 1, False, 1024)
    finally:
        sys.setprofile(None)
    assert called == ["_tag_request"]  # the peer of an int port: the Python tagging
    assert len(sink.records) == 4


def test_random_environs(sink: _sink.MemorySink) -> None:
    rng = random.Random(20261127)
    choices: dict[str, list[Any]] = {
        "REQUEST_METHOD": ["GET", "post", "", None, b"GET", _DROP],
        "PATH_INFO": ["/a", "", None, "/health", b"/b", "/\u00e9", _DROP],
        "HTTP_HOST": ["h:1", "", None, b"h", _DROP],
        "SERVER_NAME": ["s", None, 5, _DROP],
        "SERVER_PORT": ["80", 80, None, _DROP],
        "wsgi.url_scheme": ["http", "https", None, _DROP],
        "SCRIPT_NAME": ["", "/app", None, _DROP],
        "REMOTE_ADDR": ["10.0.0.2", "", None, b"x", _DROP],
        "REMOTE_PORT": ["1", "", None, 2, 0, _DROP],
        "HTTP_SW8": [SW8, "1-bad", None, _DROP, _DROP],
        "HTTP_SW8_CORRELATION": ["a:YQ==", "", None, _DROP],
    }
    kinds = ["list", "tuple", "generator", "error", "raise", "raise-first"]
    recorded = 0
    for _ in range(600):
        fields = {key: rng.choice(values) for key, values in choices.items()}
        kind = rng.choice(kinds)
        extra = rng.choice([(1, False, 1024), (7000, True, 4), (1, False, -1)])
        native, python = _both(_environ(**fields), sink, kind, *extra)
        assert native == python, (fields, kind, extra)
        recorded += bool(native[4])
    assert recorded > 300  # most requests were traced, not handed over untraced


def test_a_framework_entry_method_binds_and_runs_as_the_python_method(sink: _sink.MemorySink) -> None:
    class App:
        app: Callable[..., Any]

        def wsgi_app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            return self.app(environ, start_response)

    orig = App.wsgi_app
    native = wsgi.traced_wsgi_method(1, False, 1024)(orig)
    assert type(native) is native_core.WSGIMethod

    def python(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
        return wsgi._py_trace_wsgi(orig.__get__(self), environ, start_response, 1, False, 1024)

    instance = App()
    ways: dict[str, Callable[[Any, Any], Any]] = {
        # Looked up at each call (the class attribute changes below); ``obj.m(...)`` skips
        # the bound method, getattr() makes one.
        "instance": lambda e, s: instance.wsgi_app(e, s),  # noqa: PLW0108
        "bound": lambda e, s: getattr(instance, "wsgi_app")(e, s),  # noqa: B009, PLW0108
        "class": lambda e, s: App.wsgi_app(instance, e, s),
        "keywords": lambda e, s: instance.wsgi_app(environ=e, start_response=s),
    }

    def through(call: Callable[[Any, Any], Any]) -> Callable[..., Any]:
        def run(app: Any, environ: dict[str, Any], start_response: Any, *rest: Any) -> Any:
            instance.app = app
            return call(environ, start_response)

        return run

    for kind in ("list", "generator", "raise"):
        App.wsgi_app = native  # type: ignore[method-assign]
        assert App.__dict__["wsgi_app"].__get__(None, App) is native
        bound = instance.wsgi_app
        assert bound.__self__ is instance and bound.__func__ is native  # type: ignore[attr-defined]
        got = {name: _run(through(call), _environ(), kind, sink) for name, call in ways.items()}
        App.wsgi_app = python  # type: ignore[method-assign]
        expected = _run(through(ways["instance"]), _environ(), kind, sink)
        assert all(outcome == expected for outcome in got.values()), got
        assert expected[4]  # a segment was recorded
    with pytest.raises(TypeError):
        native(App())  # as the Python method: a missing argument is the caller's error


def _setup_wsgi(decide: Any) -> None:
    """The native request's set-up as swmp.instrument.wsgi makes it, ``decide_entry_span``
    replaced."""
    native_core.setup_wsgi(
        wsgi._py_trace_wsgi, wsgi._tag_request, wsgi._run_unrecorded, decide, wsgi.from_headers,
        wsgi.request_tags, wsgi.NOOP, wsgi.Span, wsgi._ctx.policy, limits, wsgi._HTTP,
        wsgi.TAG_HTTP_METHOD, wsgi.TAG_HTTP_URL, wsgi.NO_TAGS, current_span,
    )  # fmt: skip


def test_an_interrupt_while_the_span_is_made_is_raised_an_error_is_not(sink: _sink.MemorySink) -> None:
    """The agent failing to make the span lets the request run untraced; a KeyboardInterrupt
    arriving meanwhile is the process's and reaches the server, as from the Python form."""
    ran: list[str] = []

    def app(environ: Any, start_response: Any) -> list[bytes]:
        ran.append(environ["PATH_INFO"])
        start_response("200 OK", [])
        return [b"ok"]

    def failing(*args: Any) -> Any:
        raise RuntimeError("the agent's own failure")

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    try:
        with new_entry_span("/outer"):  # a span current: the native path asks decide_entry_span
            _setup_wsgi(failing)
            assert list(native_core.wsgi_call(app, _environ(), lambda *a: None, 7001, False, 0)) == [b"ok"]
            _setup_wsgi(interrupted)
            with pytest.raises(KeyboardInterrupt):
                native_core.wsgi_call(app, _environ(PATH_INFO="/never"), lambda *a: None, 7001, False, 0)
    finally:
        _setup_wsgi(wsgi._ctx.decide_entry_span)
    assert ran == ["/users/7"]


class FileWrapper:
    """A server's ``wsgi.file_wrapper`` (wsgiref's and Gunicorn's shape)."""

    def __init__(self, filelike: Any, blksize: int = 8192) -> None:
        self.filelike = filelike
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        yield self.filelike

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("form", ["native", "python"])
def test_a_servers_file_wrapper_goes_back_to_it_as_it_is(sink: _sink.MemorySink, form: str) -> None:
    """A response made with the server's ``wsgi.file_wrapper`` (send_file, FileResponse) is
    handed back as the same object, so the server still recognises it and sends the file
    its own way (sendfile); the span ends when the server closes it."""
    made: list[Any] = []

    def app(environ: Any, start_response: Any) -> Any:
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        made.append(environ["wsgi.file_wrapper"](b"file bytes"))
        return made[-1]

    run = native_core.wsgi_call if form == "native" else wsgi._py_trace_wsgi
    result = run(app, _environ(**{"wsgi.file_wrapper": FileWrapper}), lambda *a: None, 7001, False, 0)
    assert result is made[0] and isinstance(result, FileWrapper)
    assert segments(sink.records) == []  # the span is open until the server closes it
    assert list(result) == [b"file bytes"]
    result.close()
    assert made[0].closed
    ((seg_spans),) = [seg[3] for seg in segments(sink.records)]
    assert seg_spans[0][2] == "/users/7"
