"""HTTP clients called in unusual but valid (or invalid) shapes behave as without the agent:
the caller's request objects and the responses' requests read as without it, errors are the
library's own. Against a real server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from swmp.tracing.context import new_local_span
from tests.instrumented import instrumented


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[list[tuple[str, str]]] = []  # the header lines of each request (no sw8)

    def do_GET(self) -> None:
        _Handler.seen.append([(k, v) for k, v in self.headers.items() if k.lower() != "sw8"])
        if self.path.startswith(("/redirect", "/loop")):
            self.send_response(302)
            self.send_header("Location", "/loop" if self.path == "/loop" else "/ok")
        else:
            self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def url() -> Iterator[str]:
    _Handler.seen.clear()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def _outcome(call: Any) -> Any:
    """What ``call`` returned, or the type and text of what it raised."""
    try:
        return ("returned", call())
    except Exception as e:
        return ("raised", type(e), str(e))


def _both(call: Any) -> tuple[Any, Any]:
    """``call``'s outcome without the agent, then with it inside a trace."""
    off = _outcome(call)
    with instrumented(), new_local_span("caller"):
        on = _outcome(call)
    return off, on


def test_requests_redirected_request_keeps_no_sw8(url: str) -> None:
    """The redirect's copy of the request (``resp.request``) was given the span's sw8: left
    there, it showed in its headers and went out again when the application resent it."""
    import requests

    def call() -> Any:
        resp = requests.get(f"{url}/redirect", headers={"SW8": "mine"})
        return [list(r.request.headers.items()) for r in (*resp.history, resp)]

    off, on = _both(call)
    assert on == off


def test_requests_too_many_redirects_leaves_no_sw8(url: str) -> None:
    import requests

    def call() -> Any:
        s = requests.Session()
        s.max_redirects = 1  # the error's response is the first redirect's
        try:
            s.get(f"{url}/loop")
        except requests.TooManyRedirects as e:
            assert e.response is not None and e.request is not None
            return list(e.response.request.headers.items()), list(e.request.headers.items())
        raise AssertionError("no TooManyRedirects")

    off, on = _both(call)
    assert on == off


def test_requests_own_sw8_keeps_its_spelling(url: str) -> None:
    import requests

    def call() -> Any:
        prepared = requests.Request(
            "GET", f"{url}/ok", headers={"X-A": "1", "SW8": "mine", "X-B": "2"}
        ).prepare()
        requests.Session().send(prepared)
        return list(prepared.headers.items())

    off, on = _both(call)
    assert on == off == ("returned", [("X-A", "1"), ("SW8", "mine"), ("X-B", "2")])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_httpx_redirected_request_keeps_no_sw8(url: str, mode: str) -> None:
    import httpx

    def call() -> Any:
        if mode == "sync":
            with httpx.Client(follow_redirects=True) as c:
                resp = c.get(f"{url}/redirect", headers={"SW8": "mine"})
        else:

            async def run() -> Any:
                async with httpx.AsyncClient(follow_redirects=True) as c:
                    return await c.get(f"{url}/redirect", headers={"SW8": "mine"})

            resp = asyncio.run(run())
        return [r.request.headers.raw for r in (*resp.history, resp)]

    off, on = _both(call)
    assert on == off


def test_httpx_too_many_redirects_leaves_no_sw8(url: str) -> None:
    import httpx

    def call() -> Any:
        with httpx.Client(follow_redirects=True, max_redirects=1) as c:
            try:
                c.get(f"{url}/loop")
            except httpx.TooManyRedirects as e:
                return e.request.headers.raw
        raise AssertionError("no TooManyRedirects")

    off, on = _both(call)
    assert on == off


def test_httpx_own_sw8_keeps_its_spelling(url: str) -> None:
    import httpx

    def call() -> Any:
        with httpx.Client() as c:
            request = c.build_request("GET", f"{url}/ok", headers={"X-A": "1", "SW8": "mine", "X-B": "2"})
            c.send(request)
            return request.headers.raw

    off, on = _both(call)
    assert on == off


def test_urllib3_url_of_bytes_fails_as_without_the_agent(url: str) -> None:
    import urllib3

    pool = urllib3.HTTPConnectionPool("127.0.0.1", int(url.rsplit(":", 1)[1]))
    off, on = _both(lambda: pool.urlopen("GET", b"/ok").status)
    assert off[0] == "raised" and on == off


@pytest.mark.parametrize("shape", ["bytes-url", "bytes-url-headers", "header-pairs"])
def test_http_client_invalid_shapes_fail_as_without_the_agent(url: str, shape: str) -> None:
    """A URL of bytes raised the agent's own TypeError; headers as a list of pairs (no
    ``items()``) were copied into a dict by the agent and sent, where http.client refuses them."""
    port = int(url.rsplit(":", 1)[1])

    def call() -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            if shape == "bytes-url":
                conn.request("GET", b"/ok")  # type: ignore[arg-type]
            elif shape == "bytes-url-headers":
                conn.request("GET", b"/ok", headers={"X-A": "1"})  # type: ignore[arg-type]
            else:
                conn.request("GET", "/ok", headers=[("X-A", "1")])  # type: ignore[arg-type]
            return conn.getresponse().status
        finally:
            conn.close()

    off, on = _both(call)
    assert off[0] == "raised" and on == off


def _lines_given_twice() -> Any:
    import http.client

    from multidict import CIMultiDict

    message = http.client.HTTPMessage()  # headers forwarded as a server received them
    message["X-A"] = "1"
    message["X-A"] = "2"  # a Message appends: two lines
    message["Sw8"] = "forwarded"
    multi: CIMultiDict[str] = CIMultiDict([("X-A", "1"), ("X-A", "2"), ("Sw8", "forwarded")])
    return message, multi


@pytest.mark.parametrize("client", ["http.client", "urllib3"])
def test_a_header_given_twice_is_sent_twice(url: str, client: str) -> None:
    """http.client and urllib3 send each line ``items()`` gives: the agent's copy (made to add
    sw8) was a dict, which kept one line of a header given twice (an HTTPMessage forwarded by
    a proxy, a CIMultiDict). urllib3 refuses an HTTPMessage (it has no ``copy()``): the
    agent's dict had let it through."""
    import urllib3

    port = int(url.rsplit(":", 1)[1])

    def call() -> Any:
        out = []
        for headers in _lines_given_twice():
            _Handler.seen.clear()
            if client == "http.client":
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/ok", headers=headers)
                status: Any = conn.getresponse().status
                conn.close()
            else:
                pool = urllib3.HTTPConnectionPool("127.0.0.1", port)
                status = _outcome(lambda: pool.urlopen("GET", "/ok", headers=headers).status)  # noqa: B023
                pool.close()
            out.append(
                (status, [line for line in _Handler.seen[0] if line[0] == "X-A"] if _Handler.seen else [])
            )
        return out

    off, on = _both(call)
    assert on == off
    assert off[1][-1][1] == [("X-A", "1"), ("X-A", "2")]  # the CIMultiDict, taken by both


def test_a_redirect_not_followed_leaves_no_sw8_on_the_next_request(url: str) -> None:
    """With redirects not followed, requests (``resp.next``) and httpx (``resp.next_request``)
    build the redirect's request for the caller from the one sent, sw8 included: sent later,
    outside the trace, it carried the ended span's sw8."""
    import httpx
    import requests

    def call() -> Any:
        resp = requests.get(f"{url}/redirect", allow_redirects=False, headers={"SW8": "mine"})
        assert resp.next is not None
        with httpx.Client() as c:
            hresp = c.get(f"{url}/redirect")
        assert hresp.next_request is not None
        return list(resp.next.headers.items()), hresp.next_request.headers.raw

    off, on = _both(call)
    assert on == off
