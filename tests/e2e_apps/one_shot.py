"""Serve exactly one instrumented HTTP request, then exit: the end-to-end "one process" app.

    swmp run -- python tests/e2e_apps/one_shot.py --out DIR --framework flask
    python tests/e2e_apps/one_shot.py --out DIR --framework wsgi --start

The request to ``/e2e/order`` goes through the agent's WSGI instrumentation (Flask's, put
in place by ``swmp run``; or ``WSGIMiddleware`` around a plain WSGI app, with the agent
started by ``swmp.start()`` here). Its handler makes one outbound HTTP call to a second
local endpoint (``requests`` with Flask, ``urllib`` with plain WSGI), tags the span, logs
one WARNING line and raises. After that one request the process returns from ``main``:
whatever the agent still holds must leave with the normal interpreter exit.

Files written into ``--out`` (each by rename, so the test never reads half a file):
``ready.json`` (``{"port", "downstream_port", "pid"}``) once both servers listen, and
``result.json`` (the trace id, the headers the downstream saw) after the request.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

LOG_MARKER = "e2e-order-log"
TAG_KEY = "e2e.order"
TAG_VALUE = "42"


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class Downstream(BaseHTTPRequestHandler):
    """The second local endpoint; keeps the headers of the last request it served."""

    seen: dict[str, str] = {}

    def do_GET(self) -> None:
        Downstream.seen = {k.lower(): v for k, v in self.headers.items()}
        body = b"pong"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def handle_order(state: dict[str, Any], call_downstream: Any) -> None:
    """The work of one request: outbound call, tag, log line, then fail."""
    import swmp  # the app is instrumented on purpose: it tags and reads the trace id

    status = call_downstream(state["downstream_url"])
    swmp.tag(TAG_KEY, TAG_VALUE)
    state["trace_id"] = swmp.trace_id()
    state["downstream_status"] = status
    logging.getLogger("e2e.app").warning("%s trace=%s", LOG_MARKER, state["trace_id"])
    raise RuntimeError("e2e order failed on purpose")


def flask_app(state: dict[str, Any]) -> Any:
    import requests
    from flask import Flask

    app = Flask("one_shot")

    def call(url: str) -> int:
        return requests.get(url, timeout=10).status_code

    @app.route("/e2e/order")
    def order() -> str:
        handle_order(state, call)
        return "unreachable"

    return app


def wsgi_app(state: dict[str, Any]) -> Any:
    import urllib.request

    from swmp.instrument.wsgi import WSGIMiddleware

    def call(url: str) -> int:
        with urllib.request.urlopen(url, timeout=10) as resp:
            resp.read()
            return int(resp.status)

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        if environ.get("PATH_INFO") != "/e2e/order":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found"]
        handle_order(state, call)
        return [b"unreachable"]

    return WSGIMiddleware(app)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--framework", choices=["flask", "wsgi"], default="flask")
    parser.add_argument("--start", action="store_true", help="call swmp.start() (else: swmp run)")
    args = parser.parse_args()
    if args.start:
        import swmp

        swmp.start()  # settings from the SW_* environment

    downstream = ThreadingHTTPServer(("127.0.0.1", 0), Downstream)
    threading.Thread(target=downstream.serve_forever, daemon=True).start()
    state: dict[str, Any] = {
        "downstream_url": f"http://127.0.0.1:{downstream.server_address[1]}/downstream",
    }
    app = flask_app(state) if args.framework == "flask" else wsgi_app(state)
    server = make_server("127.0.0.1", 0, app, handler_class=QuietHandler)
    write_json(
        args.out / "ready.json",
        {"port": server.server_port, "downstream_port": downstream.server_address[1], "pid": os.getpid()},
    )
    server.handle_request()  # exactly one request
    server.server_close()
    downstream.shutdown()
    downstream.server_close()
    write_json(
        args.out / "result.json",
        {
            "trace_id": state.get("trace_id", ""),
            "downstream_status": state.get("downstream_status", 0),
            "downstream_headers": Downstream.seen,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
