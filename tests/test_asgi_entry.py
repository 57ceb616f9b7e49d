"""The native ASGI entry (``asgi_entry``, swmp/_native/asgi.c) makes the span the Python
entry (``swmp.instrument.asgi._py_entry``) makes, for every scope: the plain ones it builds
itself and the others it hands over. Each scope is run through both; the spans' fields,
tags, peer, references and trace are compared, and both spans are then finished."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from swmp import _sink, propagation, tracing
from swmp.config import load
from swmp.instrument import asgi
from swmp.tracing.limits import limits
from swmp.tracing.span import NATIVE, current_span, native_core

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")

SW8 = propagation.encode_sw8(
    "trace-up", "seg-up", 4, propagation.b64("up"), propagation.b64("up-1"), "/up", "me:1"
)


@pytest.fixture()
def configured() -> Iterator[_sink.MemorySink]:
    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    tracing.configure(load({}, agent_trace_ignore_path="/health"))
    yield sink
    tracing.configure(load({}))
    _sink.set_sink(None)


def _shape(span: Any, scope: Any) -> Any:
    if span is None:
        return None
    if span.__class__ is not asgi.Span:
        return span.__class__.__name__
    seg = span.segment
    traced_in = seg.trace_id if span.refs else None  # a new trace's id is drawn anew
    shape = (
        span.op,
        span.component,
        span.layer,
        span.kind,
        list(span.tags),
        span.peer,
        list(span.refs),
        traced_in,
        dict(seg.correlation or {}),
        seg.skip_analysis,
        span.parent_id,
    )
    span.__enter__()
    span.__exit__(None, None, None)
    return shape


def _both(scope: Any, collect: bool = False, limit: int = 1024, component: int = 7001) -> tuple[Any, Any]:
    native = _shape(native_core.asgi_entry(scope, component, collect, limit), scope)
    python = _shape(asgi._py_entry(scope, component, collect, limit), scope)
    return native, python


def _scope(**fields: Any) -> dict[str, Any]:
    scope: dict[str, Any] = {
        "type": "http",
        "method": "GET",
        "path": "/users/7",
        "scheme": "http",
        "root_path": "",
        "server": ("10.0.0.1", 8000),
        "client": ("10.0.0.2", 40123),
        "headers": [(b"host", b"example.com:8000"), (b"accept", b"*/*")],
        "query_string": b"a=1&b=2",
    }
    for key, value in fields.items():
        if value is _DROP:
            scope.pop(key, None)
        else:
            scope[key] = value
    return scope


_DROP = object()

CASES: list[dict[str, Any]] = [
    {},
    {"type": "websocket"},
    {"type": "lifespan"},
    {"type": _DROP},
    {"type": b"http"},
    {"method": "post"},
    {"method": ""},
    {"method": None},
    {"method": b"GET"},
    {"path": ""},
    {"path": _DROP},
    {"path": "/health"},  # ignored: nothing recorded
    {"path": b"/bytes"},
    {"headers": _DROP},
    {"headers": None},
    {"headers": []},
    {"headers": ((b"host", b"h:1"),)},
    {"headers": [[b"host", b"h:1"]]},
    {"headers": [(b"Host", b"H:2"), (b"HOST", b"last:3")]},
    {"headers": [(b"host", b"")]},
    {"headers": [(b"host", bytearray(b"ba:4"))]},
    {"headers": [(b"host", "text:5")]},
    {"headers": [("host", b"strname:6")]},
    {"headers": [(bytearray(b"host"), b"baname:7")]},
    {"headers": [(b"host", b"h", b"extra")]},
    {"headers": [(b"host",)]},
    {"headers": {b"host": b"dict"}},
    {"headers": [(b"hosts", b"no"), (b"hos", b"no"), (b"sw8x", b"no")]},
    {"headers": [(b"host", b"h:1"), (b"sw8", SW8.encode())]},
    {
        "headers": [
            (b"host", b"h:1"),
            (b"SW8", SW8.encode()),
            (b"Sw8-Correlation", b"a:YQ=="),
            (b"sw8-X", b"1"),
        ]
    },
    {"headers": [(b"host", b"h:1"), (b"sw8", b"1-bad")]},
    {"headers": [(b"host", b"h:1"), (b"sw8", SW8)]},
    {"headers": [(b"host", b"h:1")], "server": None},
    {"headers": [], "server": None},
    {"headers": [], "server": ["list", 1]},
    {"headers": [], "server": ("only",)},
    {"headers": [], "server": (None, None)},
    {"headers": [], "server": _DROP},
    {"scheme": "https", "root_path": "/api"},
    {"scheme": None},
    {"scheme": _DROP, "root_path": _DROP},
    {"root_path": b"/bytes"},
    # The root path already in the path (the ASGI spec; Uvicorn): in the URL once.
    {"root_path": "/api", "path": "/api/users/7"},
    {"root_path": "/api", "path": "/api"},
    {"root_path": "/api/", "path": "/api/users/7"},
    {"root_path": "/api", "path": "/apix/users/7"},  # not under /api: both, as before
    {"root_path": "/"},
    {"root_path": "/api", "path": b"/api/bytes"},
    {"client": None},
    {"client": ()},
    {"client": ["c", 1]},
    {"client": ("c",)},
    {"client": ("::1", 0)},
    {"client": {0: "mapping", 1: 80}},
    {"client": {"host": "no index"}},
    {"path": "/" + "é" * 2000},
]


@pytest.mark.parametrize("fields", CASES, ids=[repr(c)[:60] for c in CASES])
def test_each_scope_gives_the_python_span(configured: Any, fields: dict[str, Any]) -> None:
    scope = _scope(**fields)
    native, python = _both(scope)
    assert native == python
    native, python = _both(scope, collect=True, limit=3)
    assert native == python


def test_a_scope_that_is_not_a_dict_and_a_span_already_current(configured: Any) -> None:
    class Scope(dict[str, Any]):
        pass

    native, python = _both(Scope(_scope()))
    assert native == python and native is not None
    outer = native_core.asgi_entry(_scope(), 1, False, 10)
    with outer:  # an entry span inside another: what decide_entry_span answers
        native, python = _both(_scope())
        assert native == python
    assert current_span.get() is None


def test_ignored_methods_and_short_tag_limits(configured: Any) -> None:
    tracing.configure(load({}, plugin_http_ignore_method="OPTIONS"))
    for method in ("OPTIONS", "options", "GET"):
        native, python = _both(_scope(method=method))
        assert native == python
    assert _both(_scope(method="OPTIONS")) == (None, None)
    tracing.configure(load({}))
    saved = limits.tag_value_max
    limits.tag_value_max = 8  # the URL is clipped by Span.tag, not set as one list
    try:
        native, python = _both(_scope())
        assert native == python and native is not None
    finally:
        limits.tag_value_max = saved


def test_a_plain_request_runs_no_python_code_of_the_entry(configured: Any) -> None:
    import sys

    called: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename == asgi.__file__:
            called.append(frame.f_code.co_name)

    for scope in (_scope(), _scope(headers=[(b"host", b"h:1"), (b"sw8", SW8.encode())]), _scope(client=None)):
        sys.setprofile(profile)
        try:
            span = native_core.asgi_entry(scope, 7001, False, 1024)
        finally:
            sys.setprofile(None)
        assert span is not None and span.tags and called == []
        with span:
            pass
    sys.setprofile(profile)
    try:
        handed = native_core.asgi_entry(_scope(headers=[("host", b"str-name")]), 7001, False, 1024)
        handed.__enter__().__exit__(None, None, None)
    finally:
        sys.setprofile(None)
    assert called[:1] == ["_py_entry"]  # handed over


def test_random_scopes(configured: Any) -> None:
    rng = random.Random(20261127)
    names = [
        b"host",
        b"HOST",
        b"Host",
        b"sw8",
        b"SW8",
        b"sw8-correlation",
        b"SW8-CORRELATION",
        b"sw8-x",
        b"Sw8-X",
        b"accept",
        b"hosT",
        b"x" * 15,
        b"sw9",
        b"hostt",
    ]
    values: list[Any] = [b"a:1", b"", SW8.encode(), b"1-x", b"k:dg==", b"1", bytearray(b"b:2"), "s", None, 5]
    recorded = 0
    for _ in range(1500):
        headers = [(rng.choice(names), rng.choice(values)) for _ in range(rng.randrange(0, 6))]
        shapes = [headers, tuple(headers), [list(h) for h in headers]]
        fields: dict[str, Any] = {"headers": rng.choice(shapes)}
        if rng.random() < 0.2:
            fields["client"] = rng.choice([None, (), ("c", 2), ["d", "e"], ("f",)])
        if rng.random() < 0.2:
            fields["server"] = rng.choice([None, ("s", 1), ["t", 2], ()])
        if rng.random() < 0.2:
            fields["method"] = rng.choice(["PUT", "", None, b"GET"])
        native, python = _both(_scope(**fields), collect=rng.random() < 0.2)
        assert native == python, fields
        recorded += native is not None
    assert recorded > 1000


@pytest.mark.parametrize(
    ("root", "path", "url"),
    [
        ("", "/users/7", "http://example.com:8000/users/7"),
        ("/api", "/users/7", "http://example.com:8000/api/users/7"),  # servers that leave it out
        ("/api", "/api/users/7", "http://example.com:8000/api/users/7"),  # the spec; Uvicorn
        ("/api", "/api", "http://example.com:8000/api"),
        ("/api/", "/api/users/7", "http://example.com:8000/api/users/7"),
        ("/api", "/apix", "http://example.com:8000/api/apix"),
    ],
)
def test_the_root_path_is_in_the_url_once(configured: Any, root: str, path: str, url: str) -> None:
    for make in (native_core.asgi_entry, asgi._py_entry):
        span = make(_scope(root_path=root, path=path), 7001, False, 1024)
        with span:
            tags = dict(zip(span.tags[::2], span.tags[1::2], strict=True))
        assert tags["http.url"] == url, make
