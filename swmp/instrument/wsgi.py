"""WSGI: one entry span per request.

Use directly (``app = WSGIMiddleware(app)``) or through the framework instrumentations,
which call :func:`trace_wsgi` from the framework's own WSGI entry point. The span starts
when the application is called and finishes when the server closes the response iterable
(PEP 3333 requires ``close()``), so streamed bodies are inside the request's span. The
span is the current span only while the application callable runs; the body is produced
after that, in the server's own context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial
from types import MethodType as _bind
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
from swmp.tracing.span import NO_TAGS, NOOP, Span, current_span, native_core

_get_current = current_span.get
_entry_root = _ctx.entry_root
_set_current = current_span.set
_HTTP = Layer.HTTP

NAME = "wsgi"

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Body:
    """The response iterable, finishing the span when the server closes it."""

    __slots__ = ("_it", "_span")

    def __init__(self, it: Iterable[bytes], span: Span) -> None:
        self._it = it
        self._span = span

    def __iter__(self) -> Iterator[bytes]:
        try:
            it = iter(self._it)
            first = next(it)
        except StopIteration:
            return
        except BaseException as e:
            self._span.ended_by(e)  # an interrupt (KeyboardInterrupt...) is no failure
            _failed_first(self._span, e)
            raise
        yield first
        try:
            yield from it
        except BaseException as e:
            self._span.ended_by(e)
            raise

    def close(self) -> None:
        try:
            close = getattr(self._it, "close", None)
            if close is not None:
                close()
        finally:
            self._span.finish()


def _failed_first(span: Any, exc: BaseException) -> None:
    """A response that failed before its first item, or an application that raised instead
    of returning one: its headers not sent yet, the server answers 500 (Gunicorn, Waitress,
    wsgiref), so the span's status is that one, not what the application gave
    ``start_response``. Also the native body's and ``wsgi_call``'s (body.c, wsgi.c)."""
    if not isinstance(exc, Exception):  # an exit or an interrupt: the server answers nothing
        return
    try:
        _drop_status(span)
        record_status(span, 500)
    except Exception:
        pass


# ``"200"`` -> ``(("http.status_code", "200"), 200)`` for every status code: the status tag
# (key and text, ready to extend the tag list) and the code of a status line, found with
# one dict lookup instead of int() and a new tuple per response.
_STATUS = {str(code): ((TAG_HTTP_STATUS, str(code)), code) for code in range(100, 600)}


def _record_start_status(span: Any, status: Any) -> None:
    """Tag ``span`` with the status line a WSGI application gave ``start_response``."""
    try:
        hit = _STATUS.get(status[:3])
        tags = span.tags
        if hit is not None and tags.__class__ is list and limits.tag_value_max >= 3:
            tags += hit[0]  # record_status(), inlined
            if hit[1] >= 400:
                span.error()
        else:
            record_status(span, int(status[:3]))
    except (ValueError, TypeError):
        pass


def _py_start_response(
    span: Any, start_response: Callable[..., Any], status: str, headers: Any, exc_info: Any = None
) -> Any:
    if exc_info is None:
        _record_start_status(span, status)
        return start_response(status, headers)
    # An error answer (PEP 3333's second call, after an exception): the server takes the new
    # status only while no header was sent, else it re-raises exc_info and the first status
    # stands. The span keeps one status, the one the server took: asked first, then tagged.
    write = start_response(status, headers, exc_info)
    _drop_status(span)
    _record_start_status(span, status)
    return write


def _drop_status(span: Any) -> None:
    """The ``http.status_code`` tag a first ``start_response`` left, taken off the span."""
    tags = span.tags
    if tags.__class__ is list and TAG_HTTP_STATUS in tags[::2]:
        tags[:] = [
            x for pair in zip(tags[::2], tags[1::2], strict=False) if pair[0] != TAG_HTTP_STATUS for x in pair
        ]


def _py_status_recorder(span: Any, start_response: Callable[..., Any]) -> Callable[..., Any]:
    return partial(_py_start_response, span, start_response)


def _file_response(result: Any, span: Span) -> Any:
    """A server's own file response handed back as it is, its ``close`` made to finish the
    span: an instance of ``environ["wsgi.file_wrapper"]`` (what Flask's ``send_file``,
    Django's ``FileResponse``, Bottle's ``static_file`` return), or under uWSGI, whose
    ``wsgi.file_wrapper`` is a function giving back the file itself, a file-like object. The
    server knows it by its type (Gunicorn) or by identity (uWSGI) and sends the file its own
    way (``sendfile``); wrapped, it would be iterated block by block (uWSGI: line by line).
    PEP 3333 has the server call ``close()``. An object that takes no ``close`` of ours (a
    built-in file) still goes back as it is, the span finished now, before the file is sent."""
    close = getattr(result, "close", None)

    def closed() -> None:
        try:
            if close is not None:
                close()
        finally:
            span.finish()

    try:
        result.close = closed
    except Exception:
        span.finish()
    return result


def _is_file_response(environ: Any, result: Any) -> bool:
    wrapper = environ.get("wsgi.file_wrapper")
    if isinstance(wrapper, type):
        return isinstance(result, wrapper)
    # uWSGI's (a function): what it gave back is the file-like the application passed it (a
    # list, most responses, never is: no failed look-up for it, as in the C form).
    return wrapper is not None and result.__class__ is not list and hasattr(result, "read")


# The response iterable that finishes the span when closed: in C (swmp/_native/body.c) when
# the span core is built.
_make_body: Callable[[Iterable[bytes], Span], Iterable[bytes]] = (
    native_core.wsgi_body if native_core is not None else _Body
)
if native_core is not None and hasattr(native_core, "setup_wsgi_body"):
    native_core.setup_wsgi_body(_failed_first)

# status_recorder(span, start_response): what the application gets as its start_response.
# Native (swmp/_native/status.c) when the span core is built: made and called in C, the
# common status lines tagged there and the rest by _record_start_status.
_status_recorder: Callable[[Any, Callable[..., Any]], Callable[..., Any]] = _py_status_recorder
if native_core is not None:
    native_core.setup_recorder(_record_start_status, _py_start_response)
    _status_recorder = native_core.status_recorder


def _wsgi_text(text: str) -> str:
    """A PEP 3333 native string (the request's bytes, one latin-1 character each) as the text
    it spells, as ASGI's ``path`` and the frameworks' own ``request.path`` give it: the UTF-8
    path ``/café`` arrives as ``/cafÃ©``. Left as it is when its bytes are not UTF-8."""
    try:
        return text.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return text


def _tag_request(  # noqa: PLR0917
    span: Any, environ: dict[str, Any], method: Any, path: str, collect_params: bool, params_limit: int
) -> None:
    """A recorded entry span's ``http.method`` / ``http.url`` tags, its client as peer and,
    when asked, the query string; a failure leaves the span as it is."""
    get = environ.get
    try:
        host = get("HTTP_HOST") or f"{get('SERVER_NAME', '')}:{get('SERVER_PORT', '')}"
        script = get("SCRIPT_NAME", "")
        if script.__class__ is str and not script.isascii():
            script = _wsgi_text(script)
        url = f"{get('wsgi.url_scheme', 'http')}://{host}{script}{path}"
        request_tags(span, method, url)
        remote = get("REMOTE_ADDR")
        if remote:
            port = get("REMOTE_PORT")
            span.peer = f"{remote}:{port}" if port else remote
        if collect_params:
            qs = get("QUERY_STRING")
            if qs:
                span.tag(TAG_HTTP_PARAMS, qs[:params_limit] if params_limit >= 0 else qs)
    except Exception:
        pass


def _run_unrecorded(
    span: Any, app: WSGIApp, environ: dict[str, Any], start_response: Callable[..., Any]
) -> Iterable[bytes]:
    """A request whose span is not recorded (ignored, over a limit): the span only keeps
    nested instrumentation quiet while the application runs."""
    with span:
        return app(environ, start_response)


def _py_trace_wsgi(  # noqa: PLR0917 (once per request: positional calls are cheaper)
    app: WSGIApp,
    environ: dict[str, Any],
    start_response: Callable[..., Any],
    component: int = Component.PYTHON,
    collect_params: bool = False,
    params_limit: int = 1024,
) -> Iterable[bytes]:
    """``app(environ, start_response)`` inside the request's entry span: the reference form
    of the native ``wsgi_call`` (swmp/_native/wsgi.c), which hands it every request that is
    not of the plain shapes."""
    get = environ.get
    method = get("REQUEST_METHOD") or "GET"
    rules = _ctx.policy.rules
    # No call at all when no method is ignored (IgnoreRules keeps them in ``_methods``; any
    # other rules object is asked).
    if getattr(rules, "_methods", True) and rules.ignore_method(method):
        return app(environ, start_response)
    path = get("PATH_INFO") or "/"
    if path.__class__ is str and not path.isascii():
        path = _wsgi_text(path)
    sw8 = get("HTTP_SW8")
    carrier = (
        from_headers(
            sw8,
            get("HTTP_SW8_CORRELATION"),
            get("HTTP_SW8_X"),
            limits.correlation_max_elements,
            limits.correlation_max_value_length,
        )
        if sw8 is not None
        else None
    )
    span: Any = _entry_root(path, component, _HTTP, carrier)  # the common case, in C
    if span is None:
        span = _ctx.decide_entry_span(path, carrier, component, _HTTP)
    if span.__class__ is not Span:
        if span is NOOP:
            return app(environ, start_response)
        return _run_unrecorded(span, app, environ, start_response)
    prev = _get_current()
    span.__enter__()
    _tag_request(span, environ, method, path, collect_params, params_limit)
    try:
        result = app(environ, _status_recorder(span, start_response))
    except BaseException as e:
        span.ended_by(e)  # an interrupt (KeyboardInterrupt, SystemExit) is no failure
        # Nothing was sent (the headers go with the first body item): the server answers
        # 500, whatever status start_response was given.
        _failed_first(span, e)
        span.finish()
        raise
    # The body runs outside the application call: leave the span open until close(), but
    # give the context back now.
    if _get_current() is span:
        _set_current(prev)
    cls = result.__class__
    if cls is list or cls is tuple or isinstance(result, (list, tuple)):  # exact types first
        span.finish()
        return result
    if _is_file_response(environ, result):
        return _file_response(result, span)  # type: ignore[no-any-return]
    return _make_body(result, span)


# trace_wsgi(app, environ, start_response, component, collect_params, params_limit): native
# when the span core is built (its plain requests in C, every other by the Python form).
trace_wsgi: Callable[..., Iterable[bytes]] = _py_trace_wsgi
if native_core is not None and hasattr(native_core, "wsgi_call"):
    native_core.setup_wsgi(
        _py_trace_wsgi,
        _tag_request,
        _run_unrecorded,
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
        current_span,
    )
    native_core.setup_wsgi_file(_file_response)
    trace_wsgi = native_core.wsgi_call
_WSGIMethod: Any = getattr(native_core, "WSGIMethod", None) if trace_wsgi is not _py_trace_wsgi else None


class WSGIMiddleware:
    """Wrap a WSGI application so every request gets an entry span."""

    def __init__(
        self,
        app: WSGIApp,
        component: int = Component.PYTHON,
        collect_params: bool = False,
        params_limit: int = 1024,
    ) -> None:
        self.app = app
        self.component = component
        self.collect_params = collect_params
        self.params_limit = params_limit

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        return trace_wsgi(
            self.app, environ, start_response, self.component, self.collect_params, self.params_limit
        )


def traced_wsgi_method(component: int, collect_params: bool, params_limit: int) -> Callable[[Any], Any]:
    """A patch factory for frameworks whose entry point is a WSGI *method*
    (``Flask.wsgi_app``, Django's ``WSGIHandler.__call__``): wraps ``orig(self, environ,
    start_response)`` in an entry span."""

    def make(orig: Any) -> Any:
        def method(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
            # The original bound to the instance: no closure, no extra frame per request.
            return trace_wsgi(
                _bind(orig, self), environ, start_response, component, collect_params, params_limit
            )

        if _WSGIMethod is None:
            return method
        # The same in C (swmp/_native/wsgi.c): no frame of ours between the framework and
        # wsgi_call; ``method`` takes the calls of other shapes.
        return _WSGIMethod(method, orig, component, collect_params, params_limit)

    return make
