"""The HTTP side: the OAP's HTTP receivers (POST ``/v3/...``), the JSON API and the page.

Receivers refuse, count and log once: a body over the size limit (413, not read), a content
type other than JSON (415), a body that is not what the OAP's receiver would take (400).
The page and the API answer GET only, and the page is one self-contained file: no CDN, no
fetch outside this server (its Content-Security-Policy says so to the browser as well).

Browsers are kept out of what is not theirs: the page and the API answer only requests whose
``Host`` is an IP address, ``localhost`` or a name allowed with ``--allow-host`` (a web site
that rebinds its DNS name to 127.0.0.1 cannot read the traces), and the receivers refuse a
POST that carries an ``Origin`` header (browsers send one, agents never do).

Slow clients cannot hold the connection slots (``MAX_CONNECTIONS``): a request's line,
headers and body must all be in within ``REQUEST_DEADLINE_S`` of the connection's opening
(the first request) or of the request's first byte (later ones on a kept-alive connection),
however steadily the bytes trickle; a connection idle between requests is closed after
``KEEPALIVE_IDLE_S``. A connection past its deadline is closed unanswered and counted
(``too_slow``) when a request had begun.
"""

from __future__ import annotations

import io
import ipaddress
import json
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from swmp.collector.decode import HTTP_ROUTES, BadInput, parse_json_body
from swmp.collector.intake import Intake
from swmp.collector.options import DEFAULT_MAX_BODY
from swmp.collector.store import MAX_LIMIT, StoreWriteError

_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# on every answer: no MIME sniffing of JSON into HTML, no framing, no referrer to elsewhere
_HEADERS = (
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
)


def host_name(host: str) -> str:
    """The name part of a ``Host`` header: ``[::1]:80`` -> ``::1``, ``Example.:80`` -> ``example``."""
    host = host.strip().lower()
    if host.startswith("["):
        name = host[1:].split("]", 1)[0]
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name.rstrip(".")


def host_allowed(host: str | None, allowed: frozenset[str]) -> bool:
    """Whether a browser may read the page and API under this ``Host``: an IP address,
    ``localhost`` (and ``*.localhost``, which browsers resolve to loopback themselves) or an
    allowed name. A DNS-rebinding page sends its own name, which is none of these. A request
    without ``Host`` comes from no browser (browsers always send it)."""
    if host is None:
        return True
    name = host_name(host)
    if name in allowed or name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _page() -> bytes:
    return resources.files("swmp.collector").joinpath("page.html").read_bytes()


def _int_arg(query: dict[str, list[str]], name: str, default: int = 0) -> int:
    try:
        return max(0, int(query.get(name, [str(default)])[0]))
    except ValueError:
        return default


def _limit_arg(query: dict[str, list[str]], default: int) -> int:
    """The ``limit`` parameter: ``default`` when absent or empty, at most ``MAX_LIMIT`` (a
    larger one is taken as ``MAX_LIMIT``: the answer is built in memory). ValueError for what
    is not a whole number of at least 1 (a sign, a space, a fraction, other digits than 0-9)."""
    text = query.get("limit", [""])[0]  # (parse_qs leaves out empty values: "limit=" is absent)
    if not text:
        return default
    digits = text.lstrip("0")
    if not (text.isascii() and text.isdigit()) or not digits:
        raise ValueError(f"limit {text[:20]!r} is not a whole number of at least 1")
    return MAX_LIMIT if len(digits) > len(str(MAX_LIMIT)) else min(int(digits), MAX_LIMIT)


MAX_CONNECTIONS = 64  # open HTTP connections at once; more are closed on arrival
REQUEST_DEADLINE_S = 5.0  # a whole request (line, headers, body) must be in within this
KEEPALIVE_IDLE_S = 20.0  # a kept-alive connection waits this long for its next request
# (aiohttp, the agent's HTTP client, drops its idle connections after 15 s: it closes first)


class _DeadlineReader(io.RawIOBase):
    """The connection's reads, none past the handler's current deadline: a timeout per
    read (the socket's own) lets a client that sends a byte every few seconds hold the
    connection for ever. Waits with poll, so the socket's own timeout still bounds writes."""

    def __init__(self, sock: socket.socket, handler: Handler) -> None:
        super().__init__()
        self._sock = sock
        self._handler = handler
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        h = self._handler
        while True:
            left = h.read_deadline - time.monotonic()
            if left <= 0:
                h.past_deadline()
                raise TimeoutError("past the request's deadline")
            if self._poll.poll(left * 1000 + 1):
                break
        n = self._sock.recv_into(buffer)
        h.got_bytes()
        return n


class Handler(BaseHTTPRequestHandler):
    intake: Intake
    max_body: int = DEFAULT_MAX_BODY
    allowed_hosts: frozenset[str] = frozenset()
    protocol_version = "HTTP/1.1"  # keep-alive, as the agent's pooled connections expect
    server_version = "swmp-collector"  # the whole Server header: no Python version (version_string)
    timeout = 30  # seconds the socket's writes may take (an answer the client does not read)
    read_deadline = 0.0  # (monotonic) reads end here: see _DeadlineReader
    _answered = False  # a request was answered on this connection (so the next one is kept-alive)
    _started = False  # bytes of the current request arrived

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self))

    def handle_one_request(self) -> None:
        now = time.monotonic()
        self._started = False
        self.read_deadline = now + (KEEPALIVE_IDLE_S if self._answered else REQUEST_DEADLINE_S)
        super().handle_one_request()
        self._answered = True

    def got_bytes(self) -> None:
        if not self._started:
            self._started = True
            if self._answered:  # the next request on a kept-alive connection began
                self.read_deadline = time.monotonic() + REQUEST_DEADLINE_S

    def past_deadline(self) -> None:
        """Called once the deadline passed: the connection is closed (http.server does that
        on TimeoutError). A connection that was only idle is no refusal."""
        if self._started:
            self.intake.refuse(
                "http connection", "too_slow", f"request not complete within {REQUEST_DEADLINE_S:g} s"
            )
        self._started = False

    def log_message(self, format: str, *args: Any) -> None:  # no line per request
        pass

    def version_string(self) -> str:
        return self.server_version  # not "... Python/3.x": which versions run is no client's business

    def _reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in _HEADERS:
            self.send_header(name, value)
        if content_type.startswith("text/html"):
            self.send_header("Content-Security-Policy", _CSP)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, doc: Any, status: int = 200) -> None:
        self._reply(status, json.dumps(doc, separators=(",", ":")).encode())

    def _refuse(self, status: int, reason: str, detail: str) -> None:
        self.intake.refuse(f"http POST {self.path[:100]}", reason, detail)
        self._json({"error": reason, "detail": detail}, status)

    # -- receivers -------------------------------------------------------------------------
    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        route = HTTP_ROUTES.get(path)
        try:
            length = int(self.headers.get("Content-Length") or -1)
        except ValueError:
            length = -1
        origin = self.headers.get("Origin")
        if route is None or length < 0 or length > self.max_body or origin is not None:
            # the body is not read: close the connection rather than resynchronise on it
            self.close_connection = True
            if origin is not None:  # a browser (a cross-site form, a rebinding page); agents send none
                self._refuse(403, "cross_origin", f"a POST from a web page (Origin {origin[:100]})")
            elif route is None:
                self._refuse(404, "unknown_path", f"no receiver at {path[:100]}")
            elif length < 0:
                self._refuse(411, "no_length", "a Content-Length header is required")
            else:
                self._refuse(413, "too_large", f"{length} bytes > limit {self.max_body}")
            return
        body = self.rfile.read(length)
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        self.intake.call("http", path)
        if ctype != "application/json":
            self._refuse(
                415, "wrong_content_type", f"Content-Type {ctype or 'missing'!r}, want application/json"
            )
            return
        try:
            messages = parse_json_body(body, route)
        except BadInput as exc:
            self._refuse(400, exc.reason, exc.detail)
            return
        try:
            self.intake.accept(route.kind, messages, "http")
        except StoreWriteError as exc:
            self._refuse(507, "store_failed", str(exc))  # 507 Insufficient Storage: sent again later
            return
        self._json({})

    # -- page and API ----------------------------------------------------------------------
    def do_GET(self) -> None:
        host = self.headers.get("Host")
        if not host_allowed(host, self.allowed_hosts):
            self.intake.refuse(
                f"http GET {self.path[:100]}", "bad_host", f"Host {(host or '')[:100]!r} is not allowed"
            )
            self.close_connection = True
            self._json({"error": "bad_host", "detail": "Host not allowed: see --allow-host"}, 403)
            return
        url = urlsplit(self.path)
        q = parse_qs(url.query)
        store = self.intake.store
        path = url.path
        if path in ("/", "/index.html"):
            self._reply(200, _page(), "text/html; charset=utf-8")
        elif path == "/api/stats":
            self._json(self.intake.stats())
        elif path in ("/api/traces", "/api/logs"):
            try:
                limit = _limit_arg(q, 50 if path == "/api/traces" else 200)
            except ValueError as exc:
                self.intake.refuse(f"http GET {self.path[:100]}", "bad_parameter", str(exc))
                self._json({"error": "bad_parameter", "detail": str(exc)}, 400)
                return
            if path == "/api/logs":
                self._json(store.logs(q.get("trace_id", [""])[0], limit=limit))
                return
            self._json(
                store.traces(
                    service=q.get("service", [""])[0],
                    endpoint=q.get("endpoint", [""])[0],
                    errors_only=q.get("errors", ["0"])[0] in ("1", "true", "on"),
                    min_duration_ms=_int_arg(q, "min_ms"),
                    max_duration_ms=_int_arg(q, "max_ms"),
                    limit=limit,
                )
            )
        elif path.startswith("/api/trace/"):
            trace_id = unquote(path[len("/api/trace/") :])
            segments = store.trace(trace_id)
            if not segments:
                self._json({"error": "no such trace", "trace_id": trace_id}, 404)
            else:
                self._json({"trace_id": trace_id, "segments": segments, "logs": store.logs(trace_id)})
        elif path == "/api/services":
            self._json(store.services())
        elif path == "/healthz":
            self._json({"ok": True})
        else:
            self._json({"error": "not found"}, 404)


class _Server(ThreadingHTTPServer):
    """One thread per connection, at most ``max_connections`` of them: clients that open
    connections and stall or trickle (each is closed past its deadline: ``Handler``) cannot
    make the collector start threads without end, nor hold the slots for long. A connection
    over the cap is closed at once and counted (``too_many_connections``)."""

    daemon_threads = True
    intake: Intake
    max_connections = MAX_CONNECTIONS
    # The listen backlog (socketserver's default is 5): a burst of connections waits there
    # for the accept loop instead of its handshakes being dropped and retried by TCP, which
    # can take seconds (each connection's deadline starts once accepted).
    request_queue_size = 2 * MAX_CONNECTIONS

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        super().server_activate()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.intake.refuse(
                "http connection", "too_many_connections", f"{self.max_connections} already open"
            )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the client went away before its answer was written: nothing failed here
        super().handle_error(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def build_server(
    intake: Intake,
    host: str,
    port: int,
    max_body: int = DEFAULT_MAX_BODY,
    allow_hosts: tuple[str, ...] = (),
) -> ThreadingHTTPServer:
    allowed = frozenset(host_name(h) for h in (host, *allow_hosts))
    handler = type(
        "CollectorHandler", (Handler,), {"intake": intake, "max_body": max_body, "allowed_hosts": allowed}
    )
    server = _Server((host, port), handler)
    server.intake = intake
    return server


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="collector-http", daemon=True
    )
    thread.start()
    return thread
