"""ASGI: one entry span per HTTP request (WebSocket and lifespan scopes pass through).

Use directly (``app = ASGIMiddleware(app)``) or through the framework instrumentations
(Starlette/FastAPI, Django under ASGI, Falcon's ASGI app). The span is current for the
whole application call, in the request's own task, so spans created by the handler (and
tasks it spawns, which copy the context) are its children. An application that raises
before starting a response gets ``http.status_code`` 500, what the server answers then.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from functools import partial
from typing import Any

from swmp.instrument._http import record_status, request_tags
from swmp.propagation import from_headers
from swmp.tracing import context as _ctx
from swmp.tracing.constants import (
    TAG_HTTP_METHOD,
    TAG_HTTP_PARAMS,
    TAG_HTTP_STATUS,
    TAG_HTTP_URL,
    Component,
    Layer,
)
from swmp.tracing.limits import limits
from swmp.tracing.span import NO_TAGS, NOOP, Span, native_core

_HTTP = Layer.HTTP
_entry_root = _ctx.entry_root

NAME = "asgi"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# The header names the entry span reads, by their index in _wanted()'s answer.
_WANTED = {b"host": 0, b"sw8": 1, b"sw8-correlation": 2, b"sw8-x": 3}
_WANTED_LENGTHS = frozenset(len(name) for name in _WANTED)
_wanted_index = _WANTED.get


def _wanted(headers: Any) -> list[Any]:
    """``[host, sw8, sw8-correlation, sw8-x]`` of an ASGI header list, in one pass, one dict
    lookup per header (names are lowercased bytes by the spec; other spellings are still
    found: a name that is not all lowercase and has the length of one of ours is lowercased
    and looked up again)."""
    found: list[Any] = [None, None, None, None]
    try:
        for pair in headers:
            k = pair[0]
            i = _wanted_index(k) if k.__class__ is bytes else None
            if i is None:
                if k.__class__ is bytes and (len(k) not in _WANTED_LENGTHS or k.islower()):
                    continue
                k = k.lower() if isinstance(k, (bytes, bytearray)) else str(k).lower().encode("latin-1")
                i = _wanted_index(bytes(k))
                if i is None:
                    continue
            found[i] = pair[1]
    except Exception:  # not a header list: nothing to continue, the URL without a host
        pass
    return found


def _py_entry(scope: Scope, component: int, collect_params: bool, params_limit: int) -> Any:
    """The entry span of an HTTP ``scope``, tagged when it is recorded; None when the request
    passes through untouched (not HTTP, an ignored method, nothing recorded). A plain
    function, not a coroutine: the callers await the application themselves, so the
    tracing adds no coroutine of its own to every request. The reference form of the native
    ``asgi_entry`` (swmp/_native/asgi.c), which hands every case outside its plain shapes
    to this function."""
    try:
        if scope.get("type") != "http":
            return None
        method = scope.get("method") or "GET"
        rules = _ctx.policy.rules
        # No call at all when no method is ignored (IgnoreRules keeps them in ``_methods``; any
        # other rules object is asked), as in the WSGI entry.
        if getattr(rules, "_methods", True) and rules.ignore_method(method):
            return None
        path = scope.get("path") or "/"
        host, sw8, corr, sw8x = _wanted(scope.get("headers") or ())
        carrier = None
        if sw8 is not None:
            carrier = from_headers(
                sw8, corr, sw8x, limits.correlation_max_elements, limits.correlation_max_value_length
            )
        span: Any = _entry_root(path, component, _HTTP, carrier)  # the common case, in C
        if span is None:
            span = _ctx.decide_entry_span(path, carrier, component, _HTTP)
        if span is NOOP:
            return None
        if span.__class__ is Span:
            _tag_request(span, scope, method, path, host, collect_params, params_limit)
        return span
    except Exception:  # a scope outside the spec (a bytes path, ...): the request untraced
        return None


def _under(path: str, root: str) -> bool:
    """Whether ``path`` starts with the non-empty ``root`` path (whole segments): then it is
    the full path, root path included, and the URL is not to get the root path twice."""
    n = len(root)
    return n > 0 and path.startswith(root) and (len(path) == n or path[n] == "/" or root[-1] == "/")


def _tag_request(  # noqa: PLR0917 (positional: also called from C)
    span: Any, scope: Scope, method: str, path: str, host: Any, collect_params: bool, params_limit: int
) -> None:
    """A recorded entry span's ``http.method``, ``http.url``, peer and (when collected) query
    string; a failure leaves the span as it is."""
    try:
        if host.__class__ is bytes:
            host = host.decode("latin-1")
        elif isinstance(host, bytearray):
            host = bytes(host).decode("latin-1")
        if not host:
            server = scope.get("server") or ("", "")
            host = f"{server[0]}:{server[1]}"
        root = scope.get("root_path", "")
        if root.__class__ is str and path.__class__ is str and _under(path, root):
            root = ""  # the server put root_path in path already (the ASGI spec; Uvicorn)
        url = f"{scope.get('scheme', 'http')}://{host}{root}{path}"
        request_tags(span, method, url)
        client = scope.get("client")
        if client:
            span.peer = f"{client[0]}:{client[1]}"
        if collect_params:
            qs = scope.get("query_string")
            if qs:
                q = bytes(qs).decode("latin-1")
                span.tag(TAG_HTTP_PARAMS, q[:params_limit] if params_limit >= 0 else q)
    except Exception:
        pass


# _entry(scope, component, collect_params, params_limit): native when the span core is built
# (its plain cases in C, every other by _py_entry and _tag_request).
_entry: Callable[[Scope, int, bool, int], Any] = _py_entry
if native_core is not None and hasattr(native_core, "asgi_entry"):
    native_core.setup_asgi(
        _py_entry,
        _tag_request,
        _ctx.decide_entry_span,
        from_headers,
        request_tags,
        NOOP,
        Span,
        _ctx.policy,
        limits,
        _HTTP,
        TAG_HTTP_METHOD,
        TAG_HTTP_URL,
        NO_TAGS,
    )
    _entry = native_core.asgi_entry


def _record_send_status(span: Any, message: Any) -> None:
    """Tag ``span`` with the status of a response start message."""
    try:
        # A response starts once: the server refuses a second start (raises), so the status
        # it sent is the first one's.
        if message["type"] == "http.response.start" and TAG_HTTP_STATUS not in span.tags[::2]:
            status = message.get("status", 0)
            record_status(span, status if status.__class__ is int else int(status))
    except Exception:  # not a message the server would take: its own error, unchanged
        pass


def _py_send(span: Any, send: Send, message: Message) -> Awaitable[None]:
    _record_send_status(span, message)
    return send(message)


def _py_status_sender(span: Any, send: Send) -> Send:
    """``send`` that tags the response status on ``span`` first (``send`` itself for a span
    that records nothing). A plain function returning ``send``'s awaitable (what the
    application awaits), so no coroutine per message."""
    if span.__class__ is not Span:
        return send
    return partial(_py_send, span, send)


# status_sender(span, send): native (swmp/_native/status.c) when the span core is built, made
# and called in C: a start message with a known integer status tagged there, any other by
# _record_send_status.
_status_sender: Callable[[Any, Send], Send] = _py_status_sender
if native_core is not None:
    native_core.setup_sender(Span, _record_send_status, _py_send)
    _status_sender = native_core.status_sender


def _raised_unanswered(span: Any) -> None:
    """The application raised an Exception: when it had not started a response (no status
    tagged by the sender), the server answers 500 itself (Uvicorn does), so 500 is tagged.
    Once a response started, the server only closes the connection: nothing is added."""
    try:
        if span.__class__ is Span and TAG_HTTP_STATUS not in span.tags[::2]:
            record_status(span, 500)
    except Exception:
        pass


async def trace_asgi(  # noqa: PLR0917 (once per request: positional calls are cheaper)
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    component: int = Component.PYTHON,
    collect_params: bool = False,
    params_limit: int = 1024,
) -> None:
    """Run ``app(scope, receive, send)`` inside an entry span (HTTP scopes only)."""
    span = _entry(scope, component, collect_params, params_limit)
    if span is None:
        await app(scope, receive, send)
        return
    with span:
        try:
            await app(scope, receive, _status_sender(span, send))
        except Exception:
            _raised_unanswered(span)
            raise


class ASGIMiddleware:
    """Wrap an ASGI application so every HTTP request gets an entry span."""

    def __init__(
        self,
        app: ASGIApp,
        component: int = Component.PYTHON,
        collect_params: bool = False,
        params_limit: int = 1024,
    ) -> None:
        self.app = app
        self.component = component
        self.collect_params = collect_params
        self.params_limit = params_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # trace_asgi() inlined: one coroutine less per request.
        span = _entry(scope, self.component, self.collect_params, self.params_limit)
        if span is None:
            await self.app(scope, receive, send)
            return
        with span:
            try:
                await self.app(scope, receive, _status_sender(span, send))
            except Exception:
                _raised_unanswered(span)
                raise


def traced_asgi_method(component: int, collect_params: bool, params_limit: int) -> Callable[[Any], Any]:
    """A patch factory for frameworks whose ASGI entry point is an ``async`` *method*
    (Django's ``ASGIHandler.__call__``, Falcon's ``falcon.asgi.App.__call__``)."""

    def make(orig: Any) -> Any:
        async def method(self: Any, scope: Scope, receive: Receive, send: Send) -> None:
            span = _entry(scope, component, collect_params, params_limit)
            if span is None:
                await orig(self, scope, receive, send)
                return
            with span:
                try:
                    await orig(self, scope, receive, _status_sender(span, send))
                except Exception:
                    _raised_unanswered(span)
                    raise

        return method

    return make


# within(span, awaitable): the awaitable run inside the span without a Python coroutine of
# ours (swmp/_native/within.c); None without the native core.
_within: Callable[[Any, Any], Any] | None = getattr(native_core, "within", None)


def can_trace_inner_method() -> bool:
    """Whether :func:`traced_inner_method` can be used (the native core is built)."""
    return _within is not None


def traced_inner_method(component: int, collect_params: bool, params_limit: int) -> Callable[[Any], Any]:
    """A patch factory for an ``async`` method that only its framework calls, awaiting the
    result at once (Django's ``ASGIHandler.handle``): a plain function that returns the
    original's coroutine run inside the entry span by :data:`_within`, so the request is
    awaited through no coroutine of ours (each time the request waits, a wrapping
    coroutine's frame was resumed too). Not for an application's entry point: servers ask
    whether that is a coroutine function. Needs the native core (can_trace_inner_method)."""
    within = _within
    if within is None:
        raise RuntimeError("traced_inner_method needs the native core")

    def make(orig: Any) -> Any:
        def method(self: Any, scope: Scope, receive: Receive, send: Send) -> Any:
            span = _entry(scope, component, collect_params, params_limit)
            if span is None:
                return orig(self, scope, receive, send)
            try:
                awaitable = orig(self, scope, receive, _status_sender(span, send))
            except BaseException as e:  # the call itself failed: the span ends with it
                span.__enter__()
                span.__exit__(type(e), e, e.__traceback__)
                raise
            return within(span, awaitable)

        return method

    return make
