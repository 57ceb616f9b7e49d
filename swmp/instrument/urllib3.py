"""urllib3: exit span per ``HTTPConnectionPool.urlopen`` with ``sw8`` injected
(component Urllib3, 7006). Retries and redirects re-enter ``urlopen`` inside the span and
are not recorded twice. An absolute URL (a ``ProxyManager`` sending through an HTTP
proxy) is recorded with its target as peer and ``http.url``, not the proxy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument._http import merged_headers, peer_of, record_status, split_url
from swmp.instrument._patch import patch, restore
from swmp.tracing import context as _ctx
from swmp.tracing.constants import TAG_HTTP_METHOD, TAG_HTTP_URL, Component, Layer
from swmp.tracing.span import NOOP

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "urllib3"
PEER_NAMES = ("sw_urllib3", "sw_urllib3_v2")  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "urllib3"
SUPPORTED = ("1.26", "3")
TRIGGER = "urllib3"  # its __init__ imports urllib3.connectionpool


_header_dict: type[Any] = type(None)  # urllib3's HTTPHeaderDict, taken once at install


def _with_sw8(base: Any, added: dict[str, str]) -> Any:
    """A copy of the request's headers with ``added``, of the caller's kind: an
    ``HTTPHeaderDict`` stays one (a header given several values is still sent once per
    value, not as one joined line), any other mapping becomes a dict (as urllib3 iterates
    it). An ``sw8`` already among them in another spelling (``Sw8``, forwarded by a proxy)
    is replaced, not sent beside the span's; a mapping giving a name twice (an
    ``HTTPMessage``) has each of its lines kept. Headers that cannot be copied are sent as
    given, without ``sw8``."""
    try:
        if isinstance(base, _header_dict):
            merged = base.copy()
            for name, value in added.items():
                merged[name] = value  # replaces every spelling of the name
            return merged
        if not hasattr(base, "copy"):
            return base  # urllib3 copies the headers it is given: its AttributeError, as given
        return merged_headers(base, added, _header_dict.add, _header_dict)
    except Exception:
        return base


def install(config: Config) -> None:
    global _header_dict
    from urllib3._collections import HTTPHeaderDict  # noqa: PLC0415
    from urllib3.connectionpool import HTTPConnectionPool  # noqa: PLC0415

    _header_dict = HTTPHeaderDict  # not imported per request

    def make(orig: Any) -> Any:
        def urlopen(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            if url.__class__ is not str:  # bytes...: urllib3's own error, untraced
                return orig(self, method, url, *args, **kwargs)
            # No query string: the operation name and http.url never carry what the query
            # may hold (tokens).
            path = url.split("?", 1)[0].split("#", 1)[0]
            if "://" in path and not path.startswith("/"):
                # An absolute URL: what ProxyManager sends to an HTTP proxy (or forwards
                # HTTPS through it). The target is the peer and the URL, not the proxy, as
                # in the peer agent and the requests instrumentation (no user:password@).
                peer, path, full = split_url(path)
            else:
                peer = peer_of(self.scheme, self.host, self.port)
                path = path or "/"
                full = f"{self.scheme}://{peer}{path}"
            span = _ctx.new_exit_span(path, peer, Component.URLLIB3, Layer.HTTP)
            if span is NOOP:
                return orig(self, method, url, *args, **kwargs)
            with span:
                if span.recording:
                    span.tag(TAG_HTTP_METHOD, method)
                    span.tag(TAG_HTTP_URL, full)
                    # headers is urlopen's 4th parameter: positional after body, or a keyword.
                    # None means "the pool's default headers": keep them.
                    if len(args) >= 2:
                        base = args[1] if args[1] is not None else self.headers
                        args = (args[0], _with_sw8(base, span.inject()), *args[2:])
                    else:
                        headers = kwargs.get("headers")
                        base = headers if headers is not None else self.headers
                        kwargs["headers"] = _with_sw8(base, span.inject())
                resp = orig(self, method, url, *args, **kwargs)
                if span.recording:
                    record_status(span, resp.status)
                return resp

        return urlopen

    patch(HTTPConnectionPool, "urlopen", make)


def uninstall() -> None:
    from urllib3.connectionpool import HTTPConnectionPool  # noqa: PLC0415

    restore(HTTPConnectionPool, "urlopen")
