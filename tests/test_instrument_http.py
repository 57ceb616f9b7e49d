"""HTTP instrumentation against real servers on 127.0.0.1: propagation between services,
one exit span per client call, framework auto-install."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson
import pytest

from reporter_proc import records as R
from swmp import _sink, tracing
from swmp.config import load
from swmp.instrument.wsgi import WSGIMiddleware
from swmp.tracing import Component, Kind
from swmp.tracing.context import new_entry_span, new_local_span
from tests.instrumented import instrumented


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


class Server:
    """A WSGI app served by wsgiref in a thread on a free 127.0.0.1 port."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.httpd: WSGIServer = make_server("127.0.0.1", 0, app, handler_class=_Quiet)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    # Imported first so install_all patches them at once (deferred installation on first
    # import is proven in test_instrument_lazy.py).
    import httpx  # noqa: F401
    import requests  # noqa: F401

    with instrumented() as (memory, status):
        assert (
            status["requests"] == status["urllib3"] == status["http.client"] == status["httpx"] == "installed"
        )
        yield memory


@pytest.fixture()
def echo() -> Iterator[tuple[Server, list[dict[str, Any]]]]:
    """A plain (uninstrumented) server that records the headers it received."""
    seen: list[dict[str, Any]] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.append({k: v for k, v in environ.items() if k.startswith("HTTP_")})
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    srv = Server(app)
    yield srv, seen
    srv.close()


def segments(sink: _sink.MemorySink) -> list[list[Any]]:
    return [orjson.loads(p) for t, p in list(sink.records) if t == R.SEGMENT]


def all_spans(sink: _sink.MemorySink) -> list[tuple[list[Any], list[Any]]]:
    return [(seg, s) for seg in segments(sink) for s in seg[R.SEG_SPANS]]


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def test_propagation_between_two_instrumented_services(sink: _sink.MemorySink) -> None:
    import flask
    import requests

    downstream_seen: dict[str, Any] = {}

    def service_b(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        downstream_seen["sw8"] = environ.get("HTTP_SW8")
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"stock: 3"]

    srv_b = Server(WSGIMiddleware(service_b))
    app_a = flask.Flask("service_a")

    @app_a.route("/orders")
    def orders() -> str:
        return requests.get(f"{srv_b.url}/stock", timeout=5).text

    srv_a = Server(app_a)  # Flask's wsgi_app is patched by install_all: no wrapping needed
    try:
        with new_local_span("client"):
            body = urllib.request.urlopen(f"{srv_a.url}/orders?x=1", timeout=5).read()
        assert body == b"stock: 3"
        wait_for(lambda: len(segments(sink)) == 3)
    finally:
        srv_a.close()
        srv_b.close()

    client_seg, client_exit = next(
        (seg, s)
        for seg, s in all_spans(sink)
        if s[R.SPAN_TYPE] == Kind.EXIT and s[R.SPAN_OPERATION] == "/orders"
    )
    entries = [(seg, s) for seg, s in all_spans(sink) if s[R.SPAN_TYPE] == Kind.ENTRY]
    a_seg, a_entry = next((seg, s) for seg, s in entries if s[R.SPAN_OPERATION] == "/orders")
    b_seg, b_entry = next((seg, s) for seg, s in entries if s[R.SPAN_OPERATION] == "/stock")
    a_exit = next(s for s in a_seg[R.SEG_SPANS] if s[R.SPAN_TYPE] == Kind.EXIT)

    # One trace across three segments.
    assert len({a_seg[R.SEG_TRACE_ID], b_seg[R.SEG_TRACE_ID]}) == 1
    assert client_seg[R.SEG_TRACE_ID] == a_seg[R.SEG_TRACE_ID]
    # A's entry span refers to the client's exit span (http.client, component 7000).
    assert client_exit[R.SPAN_COMPONENT] == Component.PYTHON
    ref_a = a_entry[R.SPAN_REFS][0]
    assert ref_a[:4] == [
        R.REF_CROSS_PROCESS,
        client_seg[R.SEG_TRACE_ID],
        client_seg[R.SEG_SEGMENT_ID],
        client_exit[R.SPAN_ID],
    ]
    # The child segment's ref points at the parent span: B's entry -> A's requests exit span.
    ref_b = b_entry[R.SPAN_REFS][0]
    assert ref_b[R.REF_CROSS_PROCESS] == R.REF_CROSS_PROCESS
    assert ref_b[1:4] == [a_seg[R.SEG_TRACE_ID], a_seg[R.SEG_SEGMENT_ID], a_exit[R.SPAN_ID]]
    assert ref_b[6] == "/orders"  # parent endpoint: A's entry operation
    assert ref_b[7] == f"127.0.0.1:{srv_b.port}"  # address used at the client
    assert a_exit[R.SPAN_PEER] == f"127.0.0.1:{srv_b.port}"
    assert downstream_seen["sw8"].startswith("1-")
    # Exactly one exit span in A for requests -> urllib3 -> http.client.
    assert [s[R.SPAN_COMPONENT] for s in a_seg[R.SEG_SPANS] if s[R.SPAN_TYPE] == Kind.EXIT] == [
        Component.REQUESTS
    ]
    assert a_entry[R.SPAN_COMPONENT] == Component.FLASK
    tags = dict(zip(a_entry[R.SPAN_TAGS][::2], a_entry[R.SPAN_TAGS][1::2], strict=True))
    assert tags["http.method"] == "GET" and tags["http.status_code"] == "200"
    assert tags["http.url"] == f"http://127.0.0.1:{srv_a.port}/orders"


@pytest.mark.parametrize("client", ["requests", "urllib3", "http.client", "httpx", "httpx-async"])
def test_each_client_makes_one_exit_span_and_injects(
    sink: _sink.MemorySink, echo: tuple[Server, list[dict[str, Any]]], client: str
) -> None:
    srv, seen = echo
    url = f"{srv.url}/path?q=1"
    with new_local_span("caller"):
        if client == "requests":
            import requests

            assert requests.get(url, timeout=5).status_code == 200
            expected = Component.REQUESTS
        elif client == "urllib3":
            import urllib3

            with urllib3.PoolManager(headers={"X-Pool": "kept"}) as pm:
                assert pm.request("GET", url).status == 200
            expected = Component.URLLIB3
        elif client == "http.client":
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
            conn.request("GET", "/path?q=1", headers={"X-Own": "1"})
            assert conn.getresponse().read() == b"ok"
            conn.close()
            expected = Component.PYTHON
        elif client == "httpx":
            import httpx

            with httpx.Client() as c:
                assert c.get(url).status_code == 200
            expected = Component.HTTPX
        else:
            import httpx

            async def go() -> int:
                async with httpx.AsyncClient() as c:
                    return (await c.get(url)).status_code

            assert asyncio.run(go()) == 200
            expected = Component.HTTPX
    (seg,) = segments(sink)
    exits = [s for s in seg[R.SEG_SPANS] if s[R.SPAN_TYPE] == Kind.EXIT]
    assert len(exits) == 1, exits
    (ex,) = exits
    assert ex[R.SPAN_COMPONENT] == expected
    assert ex[R.SPAN_OPERATION] == "/path"
    assert ex[R.SPAN_PEER] == f"127.0.0.1:{srv.port}"
    assert "http.status_code" in ex[R.SPAN_TAGS]
    (headers,) = seen
    assert headers["HTTP_SW8"].split("-")[3] == str(ex[R.SPAN_ID])
    if client == "urllib3":
        assert headers["HTTP_X_POOL"] == "kept"  # the pool's default headers survive injection
    if client == "http.client":
        assert headers["HTTP_X_OWN"] == "1"


def test_error_status_marks_exit_span(sink: _sink.MemorySink) -> None:
    import requests

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("503 Service Unavailable", [])
        return [b""]

    srv = Server(app)
    try:
        with new_local_span("c"):
            assert requests.get(srv.url, timeout=5).status_code == 503
    finally:
        srv.close()
    (seg,) = segments(sink)
    ex = next(s for s in seg[R.SEG_SPANS] if s[R.SPAN_TYPE] == Kind.EXIT)
    assert ex[R.SPAN_IS_ERROR] is True


def test_client_error_is_recorded_and_reraised(sink: _sink.MemorySink) -> None:
    import requests

    srv = Server(lambda e, s: [])
    port = srv.port
    srv.close()  # nothing listens there now
    with new_local_span("c"), pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/", timeout=2)
    (seg,) = segments(sink)
    ex = next(s for s in seg[R.SEG_SPANS] if s[R.SPAN_TYPE] == Kind.EXIT)
    assert ex[R.SPAN_IS_ERROR] is True
    assert any("error.kind" in log[1] for log in ex[R.SPAN_LOGS])


def test_no_trace_no_headers(sink: _sink.MemorySink, echo: tuple[Server, list[dict[str, Any]]]) -> None:
    """A client call outside any trace starts its own (exit-only) trace; an ignored trace sends nothing."""
    import requests

    srv, seen = echo
    tracing.configure(load({}, sample_n_per_3_secs=1))
    requests.get(srv.url, timeout=5)  # takes the one sample of this window
    requests.get(srv.url, timeout=5)  # not sampled: no header
    assert "HTTP_SW8" in seen[0] and "HTTP_SW8" not in seen[1]
    assert len(segments(sink)) == 1


@pytest.mark.parametrize("client", ["requests", "httpx", "httpx-async"])
def test_a_request_object_sent_in_a_trace_is_given_back_as_it_was(
    sink: _sink.MemorySink, echo: tuple[Server, list[dict[str, Any]]], client: str
) -> None:
    """The application's own request object (a prepared request, an httpx Request) carries
    the span's sw8 while it is sent, and not after: sent again later (with no trace to
    continue), it must not carry a finished span's sw8."""
    srv, seen = echo
    if client == "requests":
        import requests

        session = requests.Session()
        prepared = session.prepare_request(requests.Request("GET", srv.url, headers={"X-App": "1"}))
        with new_entry_span("/outer"):
            assert session.send(prepared, timeout=5).status_code == 200
        headers: Any = prepared.headers
    else:
        import httpx

        if client == "httpx":
            with httpx.Client() as hc:
                request = hc.build_request("GET", srv.url, headers={"X-App": "1"})
                with new_entry_span("/outer"):
                    assert hc.send(request).status_code == 200
        else:

            async def main() -> httpx.Request:
                async with httpx.AsyncClient() as ac:
                    request = ac.build_request("GET", srv.url, headers={"X-App": "1"})
                    with new_entry_span("/outer"):
                        assert (await ac.send(request)).status_code == 200
                    return request

            request = asyncio.run(main())
        headers = request.headers
    assert "HTTP_SW8" in seen[0] and seen[0]["HTTP_X_APP"] == "1"
    assert "sw8" not in headers and headers["X-App"] == "1"


def test_http_client_headers_none_is_refused_as_without_the_agent(
    sink: _sink.MemorySink, echo: tuple[Server, list[dict[str, Any]]]
) -> None:
    """``HTTPConnection.request(..., headers=None)`` fails in http.client itself; the agent
    neither hides that nor sends the request, in a trace or outside one."""
    import http.client

    srv, seen = echo
    port = int(srv.url.rsplit(":", 1)[1].split("/", 1)[0])
    for traced in (False, True):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            with contextlib.ExitStack() as stack:
                if traced:
                    stack.enter_context(new_entry_span("/outer"))
                with pytest.raises((TypeError, AttributeError)):
                    conn.request("GET", "/", headers=None)
        finally:
            conn.close()
    assert seen == []


def _exit_span(sink: _sink.MemorySink) -> list[Any]:
    (ex,) = [s for _, s in all_spans(sink) if s[R.SPAN_TYPE] == Kind.EXIT]
    return ex


def _recorded_text(span: list[Any]) -> str:
    return " ".join(str(v) for v in [span[R.SPAN_OPERATION], span[R.SPAN_PEER], *span[R.SPAN_TAGS]])


@pytest.mark.parametrize("client", ["requests", "urllib3", "httpx"])
def test_credentials_and_query_of_a_url_are_not_recorded(
    sink: _sink.MemorySink, echo: tuple[Server, list[dict[str, Any]]], client: str
) -> None:
    """``user:password@`` and the query string of the URL the application calls are sent
    as before, and recorded nowhere (requests keeps the credentials in its prepared URL)."""
    srv, seen = echo
    url = f"http://alice:s3cret@127.0.0.1:{srv.port}/path?token=t0ken"
    with new_local_span("caller"):
        if client == "requests":
            import requests

            assert requests.get(url, timeout=5).status_code == 200
        elif client == "urllib3":
            import urllib3

            assert urllib3.request("GET", url).status == 200
        else:
            import httpx

            assert httpx.get(url).status_code == 200
    ex = _exit_span(sink)
    text = _recorded_text(ex)
    assert "s3cret" not in text and "alice" not in text and "t0ken" not in text, text
    assert tags_of(ex)["http.url"] == f"http://127.0.0.1:{srv.port}/path"
    if client != "urllib3":  # both send the credentials as basic authentication
        assert seen[0]["HTTP_AUTHORIZATION"].startswith("Basic ")


def test_urllib3_absolute_url_keeps_its_query_out_of_the_span(
    sink: _sink.MemorySink, echo: tuple[Server, list[dict[str, Any]]]
) -> None:
    """An absolute URL given to a pool (what urllib3's ProxyManager sends to an HTTP proxy;
    here the server itself answers it) names the span after its path, without the query
    string; the peer and ``http.url`` are the target's, not the proxy's."""
    import urllib3

    srv, seen = echo
    with new_local_span("caller"), urllib3.ProxyManager(srv.url) as proxy:
        assert proxy.request("GET", "http://example.invalid/items?token=t0ken").status == 200
    ex = _exit_span(sink)
    assert ex[R.SPAN_OPERATION] == "/items", ex
    assert ex[R.SPAN_PEER] == "example.invalid:80"
    assert tags_of(ex)["http.url"] == "http://example.invalid/items"
    assert "t0ken" not in _recorded_text(ex)
    assert "HTTP_SW8" in seen[0]  # the request went through the "proxy" with its sw8


@pytest.fixture()
def forwarding_proxy() -> Iterator[tuple[int, list[bytes]]]:
    """A tiny HTTP forward proxy on 127.0.0.1 (plain sockets: nothing of it is traced): it
    takes an absolute-form request, sends it in origin form to the host it names, and
    relays the answer until that server closes. Yields its port and the request lines."""
    import socket
    import socketserver

    lines: list[bytes] = []

    class Forward(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = self.request.recv(65536)
                if not chunk:
                    return
                head += chunk
            first, _, rest = head.partition(b"\r\n")
            lines.append(first)
            method, target, version = first.split(b" ")
            hostport, _, path = target.split(b"://", 1)[1].partition(b"/")
            host, _, port = hostport.rpartition(b"@")[2].partition(b":")
            with socket.create_connection((host.decode(), int(port or b"80")), timeout=10) as up:
                up.sendall(b"%s /%s %s\r\n%s" % (method, path, version, rest))
                while data := up.recv(65536):
                    self.request.sendall(data)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Forward)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server.server_address[1], lines
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.mark.parametrize("client", ["urllib3", "requests"])
def test_through_a_forwarding_proxy_the_target_is_recorded(
    sink: _sink.MemorySink,
    echo: tuple[Server, list[dict[str, Any]]],
    forwarding_proxy: tuple[int, list[bytes]],
    client: str,
) -> None:
    """urllib3's ``ProxyManager`` (and requests with ``proxies``, on top of it) through a
    real forwarding proxy to a real server: the exit span's peer and ``http.url`` are the
    target server's (as the SkyWalking agent records them), without credentials nor
    query; ``sw8`` reaches the target."""
    import requests
    import urllib3

    srv, seen = echo
    proxy_port, lines = forwarding_proxy
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    target = f"http://bob:pw@127.0.0.1:{srv.port}/items/7?token=t0ken"
    with new_local_span("caller"):
        if client == "urllib3":
            with urllib3.ProxyManager(proxy_url) as proxy:
                resp = proxy.request("GET", target)
                assert (resp.status, resp.data) == (200, b"ok")
        else:
            got = requests.get(target, proxies={"http": proxy_url}, timeout=10)
            assert (got.status_code, got.content) == (200, b"ok")
    (line,) = lines
    assert line.startswith(b"GET http://") and line.endswith(b"/items/7?token=t0ken HTTP/1.1")
    ex = _exit_span(sink)
    assert ex[R.SPAN_OPERATION] == "/items/7"
    assert ex[R.SPAN_PEER] == f"127.0.0.1:{srv.port}"
    assert tags_of(ex)["http.url"] == f"http://127.0.0.1:{srv.port}/items/7"
    assert "t0ken" not in _recorded_text(ex) and "pw" not in _recorded_text(ex)
    assert seen[0]["HTTP_SW8"].split("-")[3] == str(ex[R.SPAN_ID])


def tags_of(span: list[Any]) -> dict[str, Any]:
    return dict(zip(span[R.SPAN_TAGS][::2], span[R.SPAN_TAGS][1::2], strict=True))


@pytest.fixture()
def raw_echo() -> Iterator[tuple[int, list[Any]]]:
    """An ``http.server`` on 127.0.0.1 recording each request's header lines, repeated
    names kept apart (``(name, value)`` pairs as received)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[Any] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append([(k.lower(), v) for k, v in self.headers.items()])
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd.server_address[1], seen
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


@pytest.mark.parametrize("client", ["urllib3", "urllib3-dict", "http.client"])
def test_headers_are_sent_as_given_and_a_forwarded_sw8_is_replaced(
    sink: _sink.MemorySink, raw_echo: tuple[int, list[Any]], client: str
) -> None:
    """The application's header lines go out as without the agent (a header given twice to
    urllib3 is two lines, not one joined line), and an ``sw8`` it forwards in another
    spelling (``Sw8``, as Werkzeug spells incoming headers) is replaced by the span's: one
    ``sw8`` line, the span's own."""
    port, seen = raw_echo
    with new_local_span("caller"):
        if client == "urllib3":
            import urllib3

            headers = urllib3.HTTPHeaderDict()
            headers.add("X-A", "1")
            headers.add("X-A", "2")
            headers.add("Sw8", "forwarded")
            with urllib3.PoolManager() as pm:
                assert pm.request("GET", f"http://127.0.0.1:{port}/p", headers=headers).status == 200
        elif client == "urllib3-dict":
            import urllib3

            with urllib3.PoolManager() as pm:
                plain = {"X-A": "1", "Sw8": "forwarded"}
                assert pm.request("GET", f"http://127.0.0.1:{port}/p", headers=plain).status == 200
        else:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/p", headers={"X-A": "1", "Sw8": "forwarded"})
            assert conn.getresponse().status == 200
            conn.close()
    ex = _exit_span(sink)
    (lines,) = seen
    sw8 = [v for k, v in lines if k == "sw8"]
    assert len(sw8) == 1 and sw8[0].split("-")[3] == str(ex[R.SPAN_ID]), lines
    expected_xa = ["1", "2"] if client == "urllib3" else ["1"]
    assert [v for k, v in lines if k == "x-a"] == expected_xa


def test_http_client_connection_dropped_before_its_response_still_reports_the_trace(
    sink: _sink.MemorySink, echo: tuple[Server, list[dict[str, Any]]]
) -> None:
    """An application that raises between ``request`` and ``getresponse`` and drops the
    connection: its exit span ends when the connection is collected, so the request's
    segment (its entry span too) is reported rather than held back forever."""
    import gc

    srv, _seen = echo

    def handler() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        conn.request("GET", "/dropped")
        raise LookupError("the application gave up before reading the response")

    try:
        with new_entry_span("/outer"):
            handler()
    except LookupError:
        pass
    gc.collect()
    (seg,) = segments(sink)
    assert sorted(s[R.SPAN_OPERATION] for s in seg[R.SEG_SPANS]) == ["/dropped", "/outer"]
    (entry,) = [s for s in seg[R.SEG_SPANS] if s[R.SPAN_TYPE] == Kind.ENTRY]
    assert entry[R.SPAN_IS_ERROR] is True  # the application's exception, as before


@pytest.mark.parametrize("client", ["requests", "urllib3", "http.client", "httpx"])
@pytest.mark.parametrize("under", ["entry", "dropped-local"])
def test_a_call_over_the_span_limit_still_continues_the_trace_downstream(
    sink: _sink.MemorySink, monkeypatch: pytest.MonkeyPatch, client: str, under: str
) -> None:
    """An exit span over SW_AGENT_SPAN_LIMIT is not recorded, but the call still sends sw8
    (as the Java agent's NoopExitSpan): the service called joins the same trace, its parent
    the recorded span the call is under (the entry span, also when the call is made inside a
    local span that was itself dropped over the limit), endpoint and peer as usual."""
    from swmp.tracing.limits import limits

    monkeypatch.setattr(limits, "span_limit", 2)
    downstream: list[str | None] = []

    def service_b(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        downstream.append(environ.get("HTTP_SW8"))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    srv = Server(WSGIMiddleware(service_b))
    try:
        with new_entry_span("/a") as root:
            with new_local_span("kept"):  # span 1: the last one under the limit of 2
                pass
            with contextlib.ExitStack() as stack:
                if under == "dropped-local":
                    assert not stack.enter_context(new_local_span("dropped")).recording
                url = f"{srv.url}/b"
                if client == "requests":
                    import requests

                    assert requests.get(url, timeout=5).text == "ok"
                elif client == "urllib3":
                    import urllib3

                    with urllib3.PoolManager() as pm:
                        assert pm.request("GET", url).data == b"ok"
                elif client == "http.client":
                    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
                    conn.request("GET", "/b")
                    assert conn.getresponse().read() == b"ok"
                    conn.close()
                else:
                    import httpx

                    with httpx.Client() as c:
                        assert c.get(url).text == "ok"
        wait_for(lambda: len(segments(sink)) == 2)
    finally:
        srv.close()
    (sw8,) = downstream
    assert sw8 is not None, "no sw8 sent for the call over the span limit"
    up = next(seg for seg in segments(sink) if seg[R.SEG_SEGMENT_ID] == root.segment.segment_id)
    (down,) = [seg for seg in segments(sink) if seg[R.SEG_SEGMENT_ID] != up[R.SEG_SEGMENT_ID]]
    assert up[R.SEG_SIZE_LIMITED] is True
    assert [s[R.SPAN_OPERATION] for s in up[R.SEG_SPANS]] == ["kept", "/a"]  # the call: not recorded
    assert down[R.SEG_TRACE_ID] == up[R.SEG_TRACE_ID] == root.segment.trace_id
    (entry,) = down[R.SEG_SPANS]
    ref = entry[R.SPAN_REFS][0]
    assert ref[:4] == [R.REF_CROSS_PROCESS, up[R.SEG_TRACE_ID], up[R.SEG_SEGMENT_ID], 0]
    assert ref[6] == "/a"  # parent endpoint
    assert ref[7] == f"127.0.0.1:{srv.port}"  # address used at the client
