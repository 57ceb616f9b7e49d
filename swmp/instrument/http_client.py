"""http.client (and so ``urllib.request``): exit span from ``HTTPConnection.request`` to
``getresponse`` with ``sw8`` injected (component Python, 7000).

The request and the response are separate calls, so the span is started without being made
current and kept on the connection; it finishes when the response arrives, when the
connection is closed or reused for another request, whichever comes first, or, for a
connection the application drops without any of these, when it is collected. Under urllib3
or requests the outer library's exit span is current and nothing is recorded here.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from swmp.instrument._http import merged_headers, peer_of, record_status
from swmp.instrument._patch import patch, restore
from swmp.tracing import context as _ctx
from swmp.tracing.constants import TAG_HTTP_METHOD, TAG_HTTP_URL, Component, Layer
from swmp.tracing.span import Span

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "http.client"
PEER_NAMES = ("sw_urllib_request",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = None  # standard library
SUPPORTED = ("", "")
TRIGGER = "http.client"  # usually imported already: then installed at once
_ATTR = "_swmp_span"  # on a connection: its _Pending, made on its first traced request


class _Pending:
    """A connection's unfinished span. A connection dropped with its span unfinished (no
    ``getresponse`` nor ``close``: the application raised in between) finishes it when it is
    collected: an open span holds back its whole segment, the request's entry span with
    it, which would never be reported."""

    __slots__ = ("span",)

    def __init__(self) -> None:
        self.span: Any = None


def _finish_left(holder: _Pending) -> None:
    span = holder.span
    if span is not None:
        holder.span = None
        try:
            span.finish()
        except Exception:  # a finalizer: nothing to raise into
            pass


def _keep(conn: Any, span: Any) -> None:
    """Make ``span`` the connection's unfinished span."""
    holder = getattr(conn, _ATTR, None)
    if holder is None:
        holder = _Pending()
        try:
            weakref.finalize(conn, _finish_left, holder).atexit = False
        except TypeError:  # a connection class without weak references: no safety net
            pass
        setattr(conn, _ATTR, holder)
    holder.span = span


def _pending(conn: Any) -> Any:
    """The connection's unfinished span (taken: none is left). Attribute reads, not
    ``conn.__dict__``, which on Python 3.11+ would turn the connection's inline attribute
    values into a dict and slow every attribute access of ``http.client``."""
    holder = getattr(conn, _ATTR, None)
    if holder is None:
        return None
    span = holder.span
    if span is not None:
        holder.span = None
    return span


_NOT_GIVEN: Any = object()


def install(config: Config) -> None:
    from http.client import HTTPConnection, HTTPMessage  # noqa: PLC0415

    def make_request(orig: Any) -> Any:
        def request(
            self: Any, method: str, url: str, body: Any = None, headers: Any = _NOT_GIVEN, **kw: Any
        ) -> Any:
            if headers is _NOT_GIVEN:
                headers = {}  # http.client's own default; anything given goes on as given
            if url.__class__ is not str or not hasattr(headers, "items"):
                # A URL of bytes, headers without items() (a list of pairs): http.client's own
                # error, as without us (the copy made below would let the list through).
                return orig(self, method, url, body, headers, **kw)
            old = _pending(self)
            if old is not None:
                old.finish()
            scheme = "https" if self.default_port == 443 else "http"
            peer = peer_of(scheme, self.host, self.port)
            path = url.split("?", 1)[0]
            if "://" in path:
                path = "/" + path.split("://", 1)[1].partition("/")[2]
            span = _ctx.new_exit_span(path or "/", peer, Component.PYTHON, Layer.HTTP)
            if span.__class__ is Span:
                span.tag(TAG_HTTP_METHOD, method)
                span.tag(TAG_HTTP_URL, f"{scheme}://{peer}{path}")
                if headers is not None:  # None: http.client's own error, as without us
                    # A forwarded sw8 in any spelling replaced, not sent twice; a header
                    # given twice (an HTTPMessage forwarded as received) sent twice.
                    try:
                        headers = merged_headers(headers, span.inject(), HTTPMessage.__setitem__, HTTPMessage)
                    except Exception:  # headers of another shape: sent as given, without sw8
                        pass
                _keep(self, span)
            try:
                return orig(self, method, url, body, headers, **kw)
            except BaseException as e:
                if span.__class__ is Span:
                    _pending(self)
                    span.ended_by(e)  # an interrupt (KeyboardInterrupt...) is no failure
                    span.finish()
                raise

        return request

    def make_getresponse(orig: Any) -> Any:
        def getresponse(self: Any) -> Any:
            span = _pending(self)
            if span is None:
                return orig(self)
            try:
                resp = orig(self)
                record_status(span, resp.status)
                return resp
            except BaseException as e:
                span.ended_by(e)  # an interrupt (KeyboardInterrupt...) is no failure
                raise
            finally:
                span.finish()

        return getresponse

    def make_close(orig: Any) -> Any:
        def close(self: Any) -> Any:
            span = _pending(self)
            if span is not None:
                span.finish()
            return orig(self)

        return close

    patch(HTTPConnection, "request", make_request)
    patch(HTTPConnection, "getresponse", make_getresponse)
    patch(HTTPConnection, "close", make_close)


def uninstall() -> None:
    from http.client import HTTPConnection  # noqa: PLC0415

    for name in ("request", "getresponse", "close"):
        restore(HTTPConnection, name)
