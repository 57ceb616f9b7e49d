"""httpx: exit span per ``Client.send`` / ``AsyncClient.send`` with ``sw8`` injected
(component HTTPX, 7019). With ``stream=True`` the span covers the call up to the response
headers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument._http import (
    Saved,
    add_headers,
    peer_of,
    record_status,
    restore_headers,
    restore_raised,
    restore_redirects,
)
from swmp.instrument._patch import patch, restore
from swmp.tracing import context as _ctx
from swmp.tracing.constants import TAG_HTTP_METHOD, TAG_HTTP_URL, Component, Layer
from swmp.tracing.span import NOOP, NoopSpan, Span

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "httpx"
PEER_NAMES = ("sw_httpx",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "httpx"
SUPPORTED = ("0.23", "1")
TRIGGER = "httpx"  # Client and AsyncClient exist once httpx/__init__ ran


def _start(request: Any) -> tuple[Span | NoopSpan, Saved]:
    """The exit span of ``request``, and what its headers were before sw8 went in (to be
    given back after the send: see add_headers)."""
    u = request.url
    path = u.path or "/"
    peer = peer_of(u.scheme, u.host, u.port)
    span = _ctx.new_exit_span(path, peer, Component.HTTPX, Layer.HTTP)
    saved: Saved = []
    if span.__class__ is Span:
        span.tag(TAG_HTTP_METHOD, request.method)
        span.tag(TAG_HTTP_URL, f"{u.scheme}://{peer}{path}")
        saved = add_headers(request.headers, span.inject())
    return span, saved


def install(config: Config) -> None:
    import httpx  # noqa: PLC0415

    def make_sync(orig: Any) -> Any:
        def send(self: Any, request: Any, **kwargs: Any) -> Any:
            span, saved = _start(request)
            if span is NOOP:
                return orig(self, request, **kwargs)
            with span:
                try:
                    resp = orig(self, request, **kwargs)
                except BaseException as e:
                    restore_headers(request.headers, saved)
                    restore_raised(e, request, saved)
                    raise
                restore_headers(request.headers, saved)
                restore_redirects(resp, request, saved)
                record_status(span, resp.status_code)
                return resp

        return send

    def make_async(orig: Any) -> Any:
        async def send(self: Any, request: Any, **kwargs: Any) -> Any:
            span, saved = _start(request)
            if span is NOOP:
                return await orig(self, request, **kwargs)
            with span:
                try:
                    resp = await orig(self, request, **kwargs)
                except BaseException as e:
                    restore_headers(request.headers, saved)
                    restore_raised(e, request, saved)
                    raise
                restore_headers(request.headers, saved)
                restore_redirects(resp, request, saved)
                record_status(span, resp.status_code)
                return resp

        return send

    patch(httpx.Client, "send", make_sync)
    patch(httpx.AsyncClient, "send", make_async)


def uninstall() -> None:
    import httpx  # noqa: PLC0415

    restore(httpx.Client, "send")
    restore(httpx.AsyncClient, "send")
