"""websockets client: exit span per opening handshake with ``sw8`` in the upgrade request
(component Websockets, 7018), for the asyncio client (``websockets.connect``,
``websockets.asyncio.client``) and the threading client (``websockets.sync.client``).

Only the handshake is traced, as the SkyWalking Python agent does: messages exchanged on
an open connection carry no headers to propagate a trace in. Tags: ``http.method`` is
``websocket.connect``, ``http.url``, ``http.status_code`` of the handshake response and
``http.status_msg`` (``connection open`` / ``invalid handshake``); a handshake cancelled
or interrupted (a ``BaseException`` that is no ``Exception``) has neither message and is
logged as interrupted, not failed (``Span.interrupted``). The legacy client
(``websockets.legacy``, deprecated upstream) is not instrumented.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from swmp.instrument import _hook
from swmp.instrument._http import peer_of
from swmp.instrument._patch import patch, restore
from swmp.tracing import context as _ctx
from swmp.tracing.constants import (
    TAG_HTTP_METHOD,
    TAG_HTTP_STATUS,
    TAG_HTTP_STATUS_MSG,
    TAG_HTTP_URL,
    Component,
    Layer,
)
from swmp.tracing.span import Span

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "websockets"
PEER_NAMES = ("sw_websockets",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "websockets"
SUPPORTED = ("13.0", "18")
# The package imports its clients lazily: each is patched when (if) it is imported.
TRIGGER = "websockets"


def _start(conn: Any, headers: Any) -> tuple[Any, Any]:
    """``(span or None, headers with sw8)``."""
    from websockets.datastructures import Headers  # noqa: PLC0415

    proto = conn.protocol
    uri = getattr(proto, "uri", None) or proto.wsuri  # renamed in websockets 14
    scheme = "wss" if uri.secure else "ws"
    peer = peer_of(scheme, uri.host, uri.port)
    path = uri.path or "/"
    span = _ctx.new_exit_span(path, peer, Component.WEBSOCKETS, Layer.HTTP)
    if span.__class__ is not Span:
        return None, headers
    try:
        span.tag(TAG_HTTP_METHOD, "websocket.connect")
        span.tag(TAG_HTTP_URL, f"{scheme}://{peer}{path}")
        merged = Headers(headers) if headers is not None else Headers()
        for name, value in span.inject().items():
            if name in merged:  # a forwarded sw8 replaced: Headers adds a second value otherwise
                del merged[name]
            merged[name] = value
    except Exception:
        # Headers the caller gave that Headers() does not take (the library refuses them in
        # its own way): the library gets them as given, and the span open now is finished
        # by the caller (an open span would hold its whole segment back for good).
        return span, headers
    return span, merged


def _end(span: Any, conn: Any, exc: BaseException | None) -> None:
    """Tag and finish the span, once, whatever the response looks like; never raises (the
    library's result or exception goes on as it was)."""
    try:
        response = getattr(conn, "response", None) or getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
        if status is not None:
            span.tag(TAG_HTTP_STATUS, status)
        if exc is None:
            span.tag(TAG_HTTP_STATUS_MSG, "connection open")
        elif isinstance(exc, Exception):
            span.tag(TAG_HTTP_STATUS_MSG, "invalid handshake")
            span.error(exc)
        else:  # cancelled or interrupted, no answer judged: logged, not failed (Span.interrupted)
            span.interrupted(exc)
    except Exception:
        pass
    finally:
        span.finish()


def _make_async(orig: Any) -> Any:
    async def handshake(self: Any, additional_headers: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            span, additional_headers = _start(self, additional_headers)
        except Exception:
            span = None
        if span is None:
            return await orig(self, additional_headers, *args, **kwargs)
        try:
            result = await orig(self, additional_headers, *args, **kwargs)
        except BaseException as e:
            _end(span, self, e)
            raise
        _end(span, self, None)
        return result

    return handshake


def _make_sync(orig: Any) -> Any:
    def handshake(self: Any, additional_headers: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            span, additional_headers = _start(self, additional_headers)
        except Exception:
            span = None
        if span is None:
            return orig(self, additional_headers, *args, **kwargs)
        try:
            result = orig(self, additional_headers, *args, **kwargs)
        except BaseException as e:
            _end(span, self, e)
            raise
        _end(span, self, None)
        return result

    return handshake


def _patch_async() -> None:
    from websockets.asyncio.client import ClientConnection  # noqa: PLC0415

    patch(ClientConnection, "handshake", _make_async)


def _patch_sync() -> None:
    from websockets.sync.client import ClientConnection  # noqa: PLC0415

    patch(ClientConnection, "handshake", _make_sync)


def install(config: Config) -> None:
    _hook.defer("websockets.asyncio.client", _patch_async, key="websockets.asyncio")
    _hook.defer("websockets.sync.client", _patch_sync, key="websockets.sync")


def uninstall() -> None:
    for module in ("websockets.asyncio.client", "websockets.sync.client"):
        mod = sys.modules.get(module)
        if mod is not None:
            restore(mod.ClientConnection, "handshake")
