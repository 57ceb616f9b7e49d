"""The standard library's ``http.server``: entry span per request handled by a
``BaseHTTPRequestHandler`` subclass's ``do_<METHOD>`` methods (component Python, 7000).

``handle_one_request`` reads and parses one request, calls ``do_<METHOD>`` and returns;
the span starts once ``parse_request`` succeeded (method, path and headers are known) and
finishes when ``handle_one_request`` returns or raises (the exception is logged with its
stack and propagates unchanged). ``send_response_only`` gives the status code. The URL's
scheme is ``https`` when the request's socket is an ``ssl.SSLSocket`` (a TLS-wrapped server).

WSGI servers built on it are left to the WSGI tracing of the framework they serve:
``wsgiref.simple_server`` never calls ``handle_one_request``, and handlers with a
``run_wsgi`` method (Werkzeug's development server) are skipped, so a Flask or Django app
under its development server keeps its own component.
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any

from swmp.instrument._http import record_status, request_tags
from swmp.instrument._incoming import carrier_of
from swmp.instrument._patch import patch, restore
from swmp.tracing import context as _ctx
from swmp.tracing.constants import Component, Layer
from swmp.tracing.span import NOOP, Span

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "http_server"
PEER_NAMES = ("sw_http_server",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = None
TRIGGER = "http.server"

# Instance attribute of the handler: _ARMED while handle_one_request runs and parse_request
# has not started a span yet, then the span (or None: not traced), None between requests.
# Plain attribute reads and writes, never ``self.__dict__``: on Python 3.11+ reading an
# instance's ``__dict__`` turns its inline attribute values into a real dict, and every
# attribute access of the handler's own code in that request then takes the slow path
# (measured: ~25,000 instructions a request, more than the entry span itself).
_SPAN = "_swmp_span"
_ARMED: Any = object()
_PYTHON = Component.PYTHON
_HTTP = Layer.HTTP
# context.new_entry_span's two steps, called directly: one Python frame less per request.
_entry_root = _ctx.entry_root
_decide_entry = _ctx.decide_entry_span


@functools.lru_cache(maxsize=256)  # bounded: handler classes may be made at run time
def _is_wsgi(cls: type) -> bool:
    """The handler class serves WSGI (has ``run_wsgi``). Asked once per class: a failed
    ``hasattr`` walks the class's bases and builds an AttributeError on every request."""
    return hasattr(cls, "run_wsgi")


def _start(handler: Any) -> Any:
    method = handler.command or "GET"
    if _ctx.policy.rules.ignore_method(method):
        return None
    path = (handler.path or "/").partition("?")[0] or "/"
    headers = handler.headers
    carrier = carrier_of(headers)
    span = _entry_root(path, _PYTHON, _HTTP, carrier) or _decide_entry(path, carrier, _PYTHON, _HTTP)
    if span is NOOP:
        return None
    span.__enter__()
    if span.__class__ is Span:
        host = headers.get("Host")
        # A TLS-wrapped server's request socket is an ssl.SSLSocket (ssl is then imported).
        ssl = sys.modules.get("ssl")
        tls = ssl is not None and isinstance(getattr(handler, "connection", None), ssl.SSLSocket)
        scheme = "https" if tls else "http"
        request_tags(span, method, f"{scheme}://{host}{path}" if host else path)  # no query, as WSGI/ASGI
        client = handler.client_address
        if isinstance(client, tuple) and len(client) >= 2:
            span.peer = f"{client[0]}:{client[1]}"
    return span


def _armed(orig: Any) -> Any:
    def handle_one_request(self: Any) -> None:
        if _is_wsgi(self.__class__):
            orig(self)
            return
        self._swmp_span = _ARMED
        try:
            orig(self)
        except BaseException as e:
            span = self._swmp_span
            self._swmp_span = None
            if span is not None and span is not _ARMED:
                span.ended_by(e)  # a KeyboardInterrupt stopping the server is no failed request
                span.finish()
            raise
        span = self._swmp_span
        self._swmp_span = None
        if span is not None and span is not _ARMED:
            span.finish()

    return handle_one_request


def _starting(orig: Any) -> Any:
    def parse_request(self: Any) -> bool:
        ok: bool = orig(self)
        if ok and getattr(self, _SPAN, None) is _ARMED:
            self._swmp_span = None  # what is left if _start fails
            try:
                self._swmp_span = _start(self)
            except Exception:
                pass
        return ok

    return parse_request


def _status(orig: Any) -> Any:
    def send_response_only(self: Any, code: int, *args: Any, **kwargs: Any) -> Any:
        span = getattr(self, _SPAN, None)
        if span.__class__ is Span and isinstance(code, int) and code >= 200:
            try:
                record_status(span, code)
            except Exception:
                pass
        return orig(self, code, *args, **kwargs)

    return send_response_only


def install(config: Config) -> None:
    from http.server import BaseHTTPRequestHandler  # noqa: PLC0415

    patch(BaseHTTPRequestHandler, "handle_one_request", _armed)
    patch(BaseHTTPRequestHandler, "parse_request", _starting)
    patch(BaseHTTPRequestHandler, "send_response_only", _status)


def uninstall() -> None:
    from http.server import BaseHTTPRequestHandler  # noqa: PLC0415

    for name in ("handle_one_request", "parse_request", "send_response_only"):
        restore(BaseHTTPRequestHandler, name)
