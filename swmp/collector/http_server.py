"""The HTTP side: the OAP's HTTP receivers (POST ``/v3/...``), the JSON API and the page.

Receivers refuse, count and log once: a body over the size limit (413, not read), a content
type other than JSON (415), a body that is not what the OAP's receiver would take (400).
The page and the API answer GET only, and the page is one self-contained file: no CDN, no
fetch outside this server (its Content-Security-Policy says so to the browser as well).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from swmp.collector.decode import HTTP_ROUTES, BadInput, parse_json_body
from swmp.collector.intake import Intake
from swmp.collector.options import DEFAULT_MAX_BODY

_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'"
)


def _page() -> bytes:
    return resources.files("swmp.collector").joinpath("page.html").read_bytes()


def _int_arg(query: dict[str, list[str]], name: str, default: int = 0) -> int:
    try:
        return max(0, int(query.get(name, [str(default)])[0]))
    except ValueError:
        return default


class Handler(BaseHTTPRequestHandler):
    intake: Intake
    max_body: int = DEFAULT_MAX_BODY
    protocol_version = "HTTP/1.1"  # keep-alive, as the agent's pooled connections expect
    server_version = "swmp-collector"
    timeout = 30  # seconds a client may take to send its request: a stalled one frees its thread

    def log_message(self, format: str, *args: Any) -> None:  # no line per request
        pass

    def _reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
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
        if route is None or length < 0 or length > self.max_body:
            # the body is not read: close the connection rather than resynchronise on it
            self.close_connection = True
            if route is None:
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
        self.intake.accept(route.kind, messages, "http")
        self._json({})

    # -- page and API ----------------------------------------------------------------------
    def do_GET(self) -> None:
        url = urlsplit(self.path)
        q = parse_qs(url.query)
        store = self.intake.store
        path = url.path
        if path in ("/", "/index.html"):
            self._reply(200, _page(), "text/html; charset=utf-8")
        elif path == "/api/stats":
            self._json(self.intake.stats())
        elif path == "/api/traces":
            self._json(
                store.traces(
                    service=q.get("service", [""])[0],
                    endpoint=q.get("endpoint", [""])[0],
                    errors_only=q.get("errors", ["0"])[0] in ("1", "true", "on"),
                    min_duration_ms=_int_arg(q, "min_ms"),
                    max_duration_ms=_int_arg(q, "max_ms"),
                    limit=_int_arg(q, "limit", 50) or 50,
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
        elif path == "/api/logs":
            self._json(store.logs(q.get("trace_id", [""])[0], limit=_int_arg(q, "limit", 200) or 200))
        elif path == "/healthz":
            self._json({"ok": True})
        else:
            self._json({"error": "not found"}, 404)


def build_server(
    intake: Intake, host: str, port: int, max_body: int = DEFAULT_MAX_BODY
) -> ThreadingHTTPServer:
    handler = type("CollectorHandler", (Handler,), {"intake": intake, "max_body": max_body})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="collector-http", daemon=True
    )
    thread.start()
    return thread
