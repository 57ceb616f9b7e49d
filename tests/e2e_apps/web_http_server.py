"""A plain ``http.server`` service: ``/items/<id>`` answers, ``/fail`` raises in the handler.

swmp run -- python -m tests.e2e_apps.web_http_server PORT
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path.startswith("/fail"):
            raise RuntimeError("http.server handler failed on purpose")
        body = f"item {self.path.rsplit('/', 1)[-1]}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        print("handler error", client_address, flush=True)  # the test waits for no traceback


def main() -> None:
    server = Server(("127.0.0.1", int(sys.argv[1])), Handler)
    print("serving", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
