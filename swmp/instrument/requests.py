"""requests: exit span per sent request with ``sw8`` injected, by wrapping ``Session.send``
(component Requests, 7002). urllib3 and http.client below it see an exit span already open
and record nothing, so one call gives one exit span.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument._http import (
    Saved,
    add_headers,
    record_status,
    restore_headers,
    restore_raised,
    restore_redirects,
    split_url,
)
from swmp.instrument._patch import patch, restore
from swmp.tracing import context as _ctx
from swmp.tracing.constants import TAG_HTTP_METHOD, TAG_HTTP_URL, Component, Layer
from swmp.tracing.span import NOOP

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "requests"
PEER_NAMES = ("sw_requests",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "requests"
SUPPORTED = ("2.20", "3")
TRIGGER = "requests"  # its __init__ imports requests.sessions


def install(config: Config) -> None:
    from requests.sessions import Session  # noqa: PLC0415

    def make(orig: Any) -> Any:
        def send(self: Any, request: Any, **kwargs: Any) -> Any:
            peer, path, url = split_url(request.url or "")
            span = _ctx.new_exit_span(path, peer, Component.REQUESTS, Layer.HTTP)
            if span is NOOP:
                return orig(self, request, **kwargs)
            with span:
                saved: Saved = []
                if span.recording:
                    span.tag(TAG_HTTP_METHOD, request.method or "")
                    span.tag(TAG_HTTP_URL, url)
                    saved = add_headers(request.headers, span.inject())
                try:
                    resp = orig(self, request, **kwargs)
                except BaseException as e:
                    if saved:
                        restore_headers(request.headers, saved)
                        restore_raised(e, request, saved)
                    raise
                if saved:
                    restore_headers(request.headers, saved)
                    restore_redirects(resp, request, saved)
                if span.recording:
                    record_status(span, resp.status_code)
                return resp

        return send

    patch(Session, "send", make)


def uninstall() -> None:
    from requests.sessions import Session  # noqa: PLC0415

    restore(Session, "send")
