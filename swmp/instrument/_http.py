"""Small helpers shared by the HTTP instrumentations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

from swmp.tracing.constants import TAG_HTTP_METHOD, TAG_HTTP_STATUS, TAG_HTTP_URL
from swmp.tracing.limits import limits
from swmp.tracing.span import NO_TAGS, native_core

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def peer_of(scheme: str, host: str | None, port: int | None) -> str:
    """``host:port`` as SkyWalking expects it for a peer (default port filled in)."""
    if not host:
        return ""
    if port is None:
        port = _DEFAULT_PORTS.get(scheme, 80)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal
    return f"{host}:{port}"


def split_url(url: str) -> tuple[str, str, str]:
    """``(peer, path, url without query)`` of an absolute URL; never raises. The URL keeps
    no ``user:password@`` of the one given (requests leaves it in the prepared URL)."""
    try:
        p = urlsplit(url)
        peer = peer_of(p.scheme, p.hostname, p.port)
        path = p.path or "/"
        host = p.netloc.rpartition("@")[2]
        return peer, path, f"{p.scheme}://{host}{path}" if host else path
    except (ValueError, TypeError):
        return "", "/", str(url)


# The tag text of every status code a server sends, and the tag pair ready to extend a
# span's tag list: made once, not per response.
_STATUS_TEXT = {code: str(code) for code in range(100, 600)}
_STATUS_TAG = {code: (TAG_HTTP_STATUS, text) for code, text in _STATUS_TEXT.items()}
if native_core is not None:  # the WSGI / ASGI status recorders append the same pairs (status.c)
    native_core.setup_status(_STATUS_TAG, limits)


def path_text(path: str, latin1: bool = False) -> str:
    """A request path as received, its percent-escapes decoded as UTF-8, as the text it
    spells: ``/caf%C3%A9`` is ``/café``, as aiohttp, the ASGI servers and the WSGI entry
    span give it, so a path no route matched is one endpoint however the client escaped
    it. ``latin1``: the path's characters are the bytes of the request line (Tornado's
    reading: the UTF-8 ``/café`` sent unescaped arrives as ``/cafÃ©``). A path that does
    not spell UTF-8 text is kept as it is. Never raises; for a path with a ``%`` or beyond
    ASCII (the caller asks: no call for the common path)."""
    try:
        return unquote_to_bytes(path.encode("latin-1" if latin1 else "utf-8")).decode("utf-8")
    except (UnicodeError, TypeError, AttributeError):
        return path


def request_tags(span: Any, method: Any, url: str) -> None:
    """An entry span's ``http.method`` and ``http.url``: in one list when they are its first
    tags and need no clipping (what two ``Span.tag`` calls would build), once per request."""
    lim = limits.tag_value_max
    if span.tags is NO_TAGS and method.__class__ is str and len(method) <= lim and len(url) <= lim:
        span.tags = [TAG_HTTP_METHOD, method, TAG_HTTP_URL, url]
    else:
        span.tag(TAG_HTTP_METHOD, method)
        span.tag(TAG_HTTP_URL, url)


def record_status(span: Any, status: int) -> None:
    """Tag the status code; 4xx/5xx mark the span as an error (as the SkyWalking agents do)."""
    hit = _STATUS_TAG.get(status) if status.__class__ is int else None
    tags = span.tags
    if hit is not None and tags.__class__ is list and limits.tag_value_max >= 3:
        tags += hit  # Span.tag(), inlined: once per response
        if status >= 400:
            span.error()
        return
    text = _STATUS_TEXT.get(status) if status.__class__ is int else None
    span.tag(TAG_HTTP_STATUS, status if text is None else text)
    if status >= 400:
        span.error()


def merged_headers(
    base: Any, added: dict[str, str], add_line: Callable[[Any, Any, Any], None], multi: Any
) -> Any:
    """A new headers mapping for a library that reads them through iteration and ``items()``
    (http.client, urllib3): ``base``'s lines without any spelling of ``added``'s names (a
    forwarded ``Sw8`` is replaced, not sent twice), then ``added``. A dict, unless ``items()``
    gives a name more than once (an ``HTTPMessage`` of headers forwarded as received): a dict
    would keep one of its lines, so then ``multi()``, given each line by ``add_line(headers,
    name, value)``, which keeps them all, in order. May raise (``base`` of another shape)."""
    lines = [(k, v) for k, v in base.items() if not (k.__class__ is str and k.lower() in added)]
    merged = dict(lines)
    if len(merged) < len(lines):
        merged = multi()
        for name, value in lines:
            add_line(merged, name, value)
    for name, value in added.items():
        merged[name] = value  # none of its lines is left: a Message's append is a set here
    return merged


# A request object the application built may be sent again, outside any trace: the headers
# a traced send added to it are taken out again once it was sent, so a later send does not
# carry this span's sw8 (continuing a trace that has ended).
Saved = list[tuple[str, Any]]
_ABSENT = object()


def _spelling(headers: Any, name: str) -> str:
    """The caller's own spelling of header ``name`` (``SW8``): setting it back under it keeps
    the key as the caller wrote it (requests' CaseInsensitiveDict and httpx's Headers keep
    the spelling last set). httpx iterates lower-cased names: its ``raw`` pairs keep them."""
    raw = getattr(headers, "raw", None)
    keys = [k.decode("latin-1") for k, _ in raw] if raw.__class__ is list else headers
    for key in keys:
        if key.__class__ is str and key.lower() == name:
            return key
    return name


def add_headers(headers: Any, added: dict[str, str]) -> Saved:
    """``added`` set in ``headers``; what to give back to :func:`restore_headers` afterwards."""
    saved: Saved = []
    for name in added:
        old = headers.get(name, _ABSENT)
        # Rare (the caller sends an sw8 of its own): its spelling looked up only then.
        saved.append((name if old is _ABSENT else _spelling(headers, name), old))
    for name, value in added.items():
        # Not update(): httpx's moves a header the caller has to the end, where the value
        # set back afterwards would stay; setting one keeps its place.
        headers[name] = value
    return saved


def restore_headers(headers: Any, saved: Saved) -> None:
    """The headers as they were before :func:`add_headers` (never raises)."""
    try:
        for name, old in saved:
            if old is _ABSENT:
                headers.pop(name, None)
            else:
                headers[name] = old
    except Exception:  # a headers object of another shape: left as sent
        pass


def restore_redirects(resp: Any, original: Any, saved: Saved) -> None:
    """The requests a redirect made of the traced one (requests and httpx copy its headers,
    the span's sw8 with them) given back the headers the original had, as the response and
    its ``history`` hold them, and the one a redirect not followed leaves to send next:
    resending one later sends no stale sw8, and its headers read as without the agent
    (never raises)."""
    if not saved:
        return
    try:
        history = getattr(resp, "history", None) or ()
        for r in (*history, resp):
            # Not followed (allow_redirects / follow_redirects false): the redirect's request,
            # made for the caller to send (requests' resp.next, httpx's resp.next_request).
            following = getattr(r, "_next", None) or getattr(r, "next_request", None)
            for req in (r.request, following):
                if req is not None and req is not original:
                    restore_headers(req.headers, saved)
    except Exception:  # a response of another shape: left as sent
        pass


def restore_raised(e: BaseException, original: Any, saved: Saved) -> None:
    """:func:`restore_redirects` for a send that raised during its redirects: requests'
    errors hold the last ``response`` and ``request``, httpx's the ``request`` (never raises)."""
    if not saved:
        return
    try:
        resp = getattr(e, "response", None)
        if resp is not None:
            restore_redirects(resp, original, saved)
        req = getattr(e, "request", None)
        if req is not None and req is not original:
            restore_headers(req.headers, saved)
    except Exception:  # httpx: an error without its request raises on .request
        pass
