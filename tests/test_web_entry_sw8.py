"""A web request's entry span made straight from its incoming ``sw8`` parts (wsgi.c and
asgi.c through asgi.c's ``swmp_sw8_span``: no ``from_headers`` call and no ContextCarrier
for an sw8 alone from a known caller) records what the Python forms record: the caller's
trace continued, the same cross-process reference field by field, and the same decisions
for every value the shortcut declines (not sampled, an unknown caller, malformed, ignored
paths, a profiling board), and the requests with correlation or extension headers still
decoded by ``from_headers``. WSGI (``wsgi_call`` against ``_py_trace_wsgi``) and ASGI
(``asgi_entry`` against ``_py_entry``) alike; the broad shapes of environs and scopes:
test_wsgi_entry.py, test_asgi_entry.py."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from swmp import _sink, propagation, tracing
from swmp.config import load
from swmp.instrument import asgi, wsgi
from swmp.profiling.gate import gate
from swmp.propagation import decode_sw8
from swmp.tracing import stats
from swmp.tracing.context import new_entry_span, new_exit_span
from swmp.tracing.segment import cross_process_ref
from swmp.tracing.span import NATIVE, current_span, native_core
from tests.native_forms import PLACES, new_caller, producer_sw8, recording, sw8_variants

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")

ROOT = Path(__file__).resolve().parent.parent
PLAIN = producer_sw8()
FLAG, TID, SID, _SPAN_ID, _TAIL = PLAIN.split("-", 4)
VARIANTS = sw8_variants(PLAIN)
CORRELATION = f"{propagation.b64('k')}:{propagation.b64('v')}"


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with recording() as memory:
        yield memory


def _records(sink: _sink.MemorySink) -> list[Any]:
    """Each segment's trace id ("new" for a new trace), service, instance, skip flag and
    spans without their times."""
    out = []
    for _rtype, payload in sink.records:
        seg = orjson.loads(payload)
        trace = seg[0] if seg[0] != seg[1] else "new"
        out.append([trace, *seg[2:5], [[*s[:2], *s[4:12], s[13]] for s in seg[5]]])
    sink.clear()
    return out


def _shape(span: Any) -> Any:
    """A span's class and, for a recorded one, its fields (not its ids and times) and the
    correlation and skip flag its segment passes on."""
    if span is None or not hasattr(span, "kind"):
        return None if span is None else type(span).__name__
    seg = span.segment
    return (
        span.op,
        span.kind,
        list(span.refs),
        list(span.tags),
        span.peer,
        seg.correlation,
        seg.skip_analysis,
    )


def _app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    environ["seen"] = _shape(current_span.get())
    start_response("200 OK", [])
    return [b"ok"]


def _wsgi(form: Any, environ: dict[str, Any]) -> Any:
    body = form(_app, environ, lambda *a: None, 7000, False, 1024)
    chunks = list(body)
    getattr(body, "close", lambda: None)()
    return chunks, environ.get("seen")


def _asgi(form: Any, scope: dict[str, Any]) -> Any:
    span = form(scope, 7001, False, 1024)
    if span is None:
        return None
    shape = _shape(span)
    with span:
        pass
    return shape


def _environ(**headers: Any) -> dict[str, Any]:
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/users/7",
        "HTTP_HOST": "h:1",
        "REMOTE_ADDR": "10.0.0.2",
    }
    return {**environ, "wsgi.url_scheme": "http", **headers}


def _scope(headers: list[Any]) -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": "/users/7", "headers": [(b"host", b"h:1"), *headers]}


# name: (run, the request carrying sw8 value v, native form, Python form)
FORMS: dict[str, tuple[Callable[[Any, Any], Any], Callable[[str], Any], Any, Any]] = {
    "wsgi": (_wsgi, lambda v: _environ(HTTP_SW8=v), native_core.wsgi_call, wsgi._py_trace_wsgi),
    "wsgi-others-none": (
        _wsgi,
        lambda v: _environ(HTTP_SW8=v, HTTP_SW8_CORRELATION=None, HTTP_SW8_X=None),
        native_core.wsgi_call,
        wsgi._py_trace_wsgi,
    ),
    "wsgi-correlation": (
        _wsgi,
        lambda v: _environ(HTTP_SW8=v, HTTP_SW8_CORRELATION=CORRELATION),
        native_core.wsgi_call,
        wsgi._py_trace_wsgi,
    ),
    "wsgi-x": (
        _wsgi,
        lambda v: _environ(HTTP_SW8=v, HTTP_SW8_X="1"),
        native_core.wsgi_call,
        wsgi._py_trace_wsgi,
    ),
    "wsgi-bytes": (
        _wsgi,
        lambda v: _environ(HTTP_SW8=v.encode()),
        native_core.wsgi_call,
        wsgi._py_trace_wsgi,
    ),
    "asgi": (_asgi, lambda v: _scope([(b"sw8", v.encode())]), native_core.asgi_entry, asgi._py_entry),
    "asgi-str": (_asgi, lambda v: _scope([(b"SW8", v)]), native_core.asgi_entry, asgi._py_entry),
    "asgi-bytearray": (
        _asgi,
        lambda v: _scope([(b"sw8", bytearray(v.encode()))]),
        native_core.asgi_entry,
        asgi._py_entry,
    ),
    "asgi-others-none": (
        _asgi,
        lambda v: _scope([(b"sw8", v.encode()), (b"sw8-correlation", None), (b"sw8-x", None)]),
        native_core.asgi_entry,
        asgi._py_entry,
    ),
    "asgi-correlation": (
        _asgi,
        lambda v: _scope([(b"sw8", v.encode()), (b"sw8-correlation", CORRELATION.encode())]),
        native_core.asgi_entry,
        asgi._py_entry,
    ),
    "asgi-x": (
        _asgi,
        lambda v: _scope([(b"sw8-x", b"1"), (b"sw8", v.encode())]),
        native_core.asgi_entry,
        asgi._py_entry,
    ),
}


def _request(client: str, form: Any, value: str, sink: _sink.MemorySink, place: str) -> Any:
    """What the request gave, recorded and counted, made in ``place`` (one of PLACES)."""
    run, request, _native, _python = FORMS[client]
    before = (stats.ignored, stats.sampled_out)
    if place == "none":
        outcome = run(form, request(value))
    else:
        with new_entry_span("/outer"):
            if place == "exit":
                with new_exit_span("outer", "db:1", 1, 1):
                    outcome = run(form, request(value))
            else:
                outcome = run(form, request(value))
    after = current_span.get()
    counts = (stats.ignored - before[0], stats.sampled_out - before[1])
    return outcome, None if after is None else after.op, _records(sink), counts


def _both(client: str, value: str, sink: _sink.MemorySink, place: str = "none") -> tuple[Any, Any]:
    _run, _request_of, native, python = FORMS[client]
    return _request(client, native, value, sink, place), _request(client, python, value, sink, place)


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("client", FORMS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_header_records_what_the_python_form_records(
    sink: _sink.MemorySink, place: str, client: str, variant: str
) -> None:
    for _ in range(2):  # the second time the decoder knows what the first taught it
        mine, python = _both(client, VARIANTS[variant], sink, place)
        assert mine == python


@pytest.mark.parametrize("client", ["wsgi", "asgi", "asgi-str"])
def test_the_reference_is_the_callers_field_by_field(sink: _sink.MemorySink, client: str) -> None:
    for value in (PLAIN, VARIANTS["segment id of its own"], VARIANTS["largest span id"]):
        _outcome, _after, records, counts = _request(client, FORMS[client][2], value, sink, "none")
        carrier = decode_sw8(value)
        assert carrier is not None
        (seg,) = records
        assert seg[0] == carrier.trace_id  # the caller's trace continued
        assert seg[4][0][-1] == [cross_process_ref(carrier)]
        assert counts == (0, 0)


@pytest.mark.parametrize("client", ["wsgi", "asgi"])
def test_a_caller_never_seen_before(sink: _sink.MemorySink, client: str) -> None:
    """The first request of a new caller goes to from_headers (decode_sw8 checks and caches
    its fields); the next one is made from its parts. Both as the Python form records them."""
    value = "-".join((FLAG, TID, SID, "3", new_caller()))
    first = _request(client, FORMS[client][2], value, sink, "none")
    again = _request(client, FORMS[client][2], value, sink, "none")
    assert first == again == _request(client, FORMS[client][3], value, sink, "none")
    carrier = decode_sw8(value)
    assert carrier is not None and first[2][0][4][0][-1] == [cross_process_ref(carrier)]


@pytest.mark.parametrize("client", ["wsgi", "asgi"])
def test_not_sampled_ignored_and_profiled_go_the_python_way(sink: _sink.MemorySink, client: str) -> None:
    mine, python = _both(client, VARIANTS["not sampled"], sink)
    assert mine == python
    assert mine[2] == [] and mine[3] == (0, 1)  # counted as sampled out, nothing recorded
    tracing.configure(load({"SW_AGENT_TRACE_IGNORE_PATH": "/users/**"}))
    for _ in range(2):
        mine, python = _both(client, PLAIN, sink)
        assert mine == python
        assert mine[2] == [] and mine[3] == (1, 0)
    tracing.configure(load({"SW_AGENT_TRACE_IGNORE_PATH": "/health"}))  # rules, not matching
    for _ in range(2):
        mine, python = _both(client, PLAIN, sink)
        assert mine == python
        assert len(mine[2]) == 1
    seen: list[Any] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gate, "board", object())
        patch.setattr(gate, "first_span", seen.append)
        mine, python = _both(client, PLAIN, sink)
        assert mine == python
    assert len(seen) == 2  # the profiling board saw each form's first span


@pytest.mark.parametrize("client", ["wsgi", "asgi"])
def test_an_sw8_alone_is_not_decoded_by_python_code(sink: _sink.MemorySink, client: str) -> None:
    """The shortcut is taken: for a plain sw8 alone no function of propagation.py runs (the
    Python from_headers did before); with a correlation header from_headers still does."""
    called: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename == propagation.__file__:
            called.append(frame.f_code.co_name)

    run, request, native, _python = FORMS[client]
    run(native, request(PLAIN))  # the caller known, the reference's kind learnt
    for name, expected in ((client, []), (f"{client}-correlation", ["from_headers"])):
        run, request, native, _python = FORMS[name]
        called.clear()
        sys.setprofile(profile)
        try:
            run(native, request(PLAIN))
        finally:
            sys.setprofile(None)
        assert called[:1] == expected, name
    assert len(_records(sink)) == 3


def test_no_growth_over_many_requests(sink: _sink.MemorySink) -> None:
    """Each path's references released: the plain header, the declined ones (not sampled,
    ignored), the carrier made of the parts, ASGI's decoded text."""
    values = [PLAIN, VARIANTS["not sampled"], VARIANTS["flag 2"], VARIANTS["not ASCII"]]

    def round_() -> None:
        for v in values:
            _wsgi(native_core.wsgi_call, _environ(HTTP_SW8=v))
            _asgi(native_core.asgi_entry, _scope([(b"sw8", v.encode())]))
        with new_entry_span("/outer"):  # inside a span: swmp_entry_sw8 declines
            _asgi(native_core.asgi_entry, _scope([(b"sw8", PLAIN.encode())]))
        sink.records.clear()

    for _ in range(300):
        round_()
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(3000):
        round_()
    gc.collect()
    assert sys.getallocatedblocks() - before < 1000  # a leak per request would be >= 3000


def test_the_first_caller_reference_of_a_process() -> None:
    """In a new process the reference's kind is learnt from the Python cross_process_ref's
    first answer: until then the span is made from a carrier, as before."""
    script = textwrap.dedent(
        """
        import orjson
        from swmp.instrument import asgi, wsgi
        from swmp.propagation import decode_sw8
        from swmp.tracing.span import native_core
        from tests.native_forms import producer_sw8, recording

        value = producer_sw8()
        assert decode_sw8(value) is not None  # the caller known: only the kind is not
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/u", "HTTP_HOST": "h", "HTTP_SW8": value}
        scope = {"type": "http", "method": "GET", "path": "/u", "headers": [(b"sw8", value.encode())]}
        app, start = lambda e, s: [b""], lambda *a: None
        forms = [
            lambda: list(native_core.wsgi_call(app, dict(environ), start, 1, False, 9)),
            lambda: list(native_core.wsgi_call(app, dict(environ), start, 1, False, 9)),
            lambda: list(wsgi._py_trace_wsgi(app, dict(environ), start, 1, False, 9)),
            lambda: native_core.asgi_entry(dict(scope), 1, False, 9).__enter__().__exit__(None, None, None),
            lambda: asgi._py_entry(dict(scope), 1, False, 9).__enter__().__exit__(None, None, None),
        ]
        out = []
        with recording() as sink:
            for form in forms:
                form()
                (payload,) = [p for _t, p in sink.records]
                seg = orjson.loads(payload)
                out.append([seg[0], seg[5][0][:2], seg[5][0][4:12], seg[5][0][13]])
                sink.clear()
        assert out[0] == out[1] == out[2], out
        assert out[3] == out[4] and out[3][3] == out[0][3], out
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr
