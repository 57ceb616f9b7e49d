"""Celery: an exit span per published task, an entry span per task run (component Celery, 7011).

Publishing: every way of sending a task (``delay``, ``apply_async``, ``send_task``, the canvas
primitives, retries, beat) ends in ``Celery.send_task``, which is wrapped: an exit span
``celery/<task name>`` (layer MQ, peer = the broker's ``host:port``, tag ``mq.broker``) whose
``sw8`` headers go into the task message's headers (protocol 2, Celery's default). The
wrapper's common case runs in C (``CelerySend``, swmp/_native/celery.c); the Python
``send_task`` below is its reference and takes every other case.

Executing: ``celery.app.trace.build_tracer`` makes the function a worker calls for each task
run, in every pool (prefork children, solo, threads, gevent, eventlet); the function it
returns is wrapped. Each run is an entry span ``celery/<task name>`` continuing the
publisher's trace (the message headers reach the worker in the request dict), whose
outcome comes from what Celery's tracer returns:

* failure: error flag and the exception (kind, message, stack) as a span log;
* a retry requested by the task: error flag, the reason as tag ``retry`` (``Retry in 1s:
  ...``) and the underlying exception as a log; the run that is the N-th retry carries
  ``celery.retries`` = N;
* revoked before it ran (revoked, expired, or terminated while running by a signal that
  leaves its span unfinished, SIGKILL): an entry span from the worker's consumer with the
  error flag and an ``event=revoked`` log (``task_revoked`` signal). Terminated by a signal
  the pool child turns into ``SystemExit`` (SIGTERM, the default), or in a gevent or eventlet
  pool (its greenlet killed), or stopped by a hard time limit: the run's own span, ended by
  that exception and flagged failed, is the one span (``_celery_stops``).

Eager runs (``task_always_eager``, ``Task.apply``) are local spans of the caller's trace. Task
arguments are recorded (tag ``celery.parameters``) only when
``SW_PLUGIN_CELERY_PARAMETERS_LENGTH`` > 0, cut to that many characters.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Any

from swmp.instrument import _celery_message as _message
from swmp.instrument import _celery_stops as _stops
from swmp.instrument._mq import carrier_from, warn_once
from swmp.instrument._patch import patch, restore
from swmp.tracing import context as _ctx
from swmp.tracing.constants import TAG_CELERY_PARAMETERS, TAG_MQ_BROKER, Component, Layer
from swmp.tracing.limits import limits
from swmp.tracing.span import NO_TAGS, NOOP, Span, native_core

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "celery"
PEER_NAMES = ("sw_celery",)  # the SkyWalking Python agent's plugin module
PACKAGE = "celery"
SUPPORTED = ("5.0", "6")
TRIGGER = "celery"

TAG_RETRY = "retry"
TAG_RETRIES = "celery.retries"
_COMPONENT = Component.CELERY
_MQ = Layer.MQ
# Modules that bind ``build_tracer`` by name at their import: patched too when the agent
# starts after they were imported.
_TRACER_USERS = ("celery.worker.consumer.consumer",)
_BROKER_ATTR = "_swmp_broker"


# new_exit_span is native already (no frame of its own); the entry span's first step is
# called directly, as context.new_entry_span would (the native common case, None
# otherwise): one Python frame less per run.
_new_exit = _ctx.new_exit_span
_entry_root = _ctx.entry_root
_decide_entry = _ctx.decide_entry_span
_arm = _message.arm
_disarm = _message.disarm


class _Settings:
    params_length = 0


settings = _Settings()


# -- helpers ---------------------------------------------------------------------------------
# A URL's user information as SQLAlchemy reads it (the sqla transport hands it the URL): a
# user name without ':' or '/', then a password of anything but '@', so the password may hold
# '/', '?' or '#' where a URL parser would end the host part before it.
_SQLA_USERINFO = re.compile(r"[^:/]*(?::[^@]*)?@")


def without_credentials(url: str) -> tuple[str, str, str]:
    """``(scheme, host[:port], path)`` of a URL with its user information, query and fragment
    left out (the query may hold a password too); ``("", url's host, "")`` for text that is not
    a URL. The user information ends where either reading ends it, whichever is later: a URL
    parser's (up to the last '@' before the first '/', '?' or '#') and SQLAlchemy's, so that
    neither reading's password is kept; what comes out is for spans, never for connecting."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    authority = len(rest)
    for c in "/?#":
        i = rest.find(c)
        if 0 <= i < authority:
            authority = i
    start = rest.rfind("@", 0, authority) + 1
    m = _SQLA_USERINFO.match(rest)
    if m is not None and m.end() > start:
        start = m.end()
    rest = rest[start:]
    end = len(rest)
    for c in "/?#":
        i = rest.find(c)
        if 0 <= i < end:
            end = i
    if not sep:
        return "", rest[:end], ""
    return scheme, rest[:end], rest[end:].partition("?")[0].partition("#")[0]


def broker_of(app: Any) -> tuple[str, str]:
    """``(peer, mq.broker tag)`` for an app's broker, cached on the app (never raises).

    The tag is the broker URL without credentials; the peer is ``host:port`` (the
    transport's default port when the URL has none). Both go through ``without_credentials``:
    a transport that parses its URL itself (``sqla+``, ``mongodb``, Azure) keeps the whole
    URL, password included, as the connection's ``hostname``.
    """
    cached: tuple[str, str] | None = getattr(app, _BROKER_ATTR, None)
    if cached is not None:
        return cached
    try:
        conn = app.connection_for_write()
        try:
            host = conn.hostname or "localhost"
            if "://" in host:  # a database URL: its own host and port, if any
                peer = without_credentials(host)[1] or "localhost"
            else:
                host = without_credentials(host)[1] or "localhost"
                port = conn.port or getattr(conn.transport, "default_port", None)
                peer = f"{host}:{port}" if port else host
            scheme, where, path = without_credentials(conn.as_uri())
            result = (peer, f"{scheme}://{where}{path}")
        finally:
            conn.release()
    except Exception:
        warn_once("celery-broker", "swmp: cannot tell the Celery broker's address; spans go without it")
        result = ("", "")
    try:
        setattr(app, _BROKER_ATTR, result)
    except Exception:
        pass
    return result


def parameters(args: Any, kwargs: Any, length: int) -> str:
    """Task arguments as the peer agent shows them, ``*args, **kwargs``, cut to ``length``.

    Celery's bounded ``saferepr`` keeps the cost of a huge argument bounded too.
    """
    from celery.utils.saferepr import saferepr  # noqa: PLC0415 (only when the option is on)

    return f"*{saferepr(args, length)}, **{saferepr(kwargs or {}, length)}"[:length]


def _origin_host(request: Any) -> str:
    origin = request.get("origin")
    return origin.rpartition("@")[2] if isinstance(origin, str) else ""


def _tag_broker(span: Span, broker: str) -> None:
    """``mq.broker``, the spans' one tag: set as the list ``span.tag`` would build when it is
    the first and fits (every publish and run sets it)."""
    if span.tags is NO_TAGS and len(broker) <= limits.tag_value_max:
        span.tags = [TAG_MQ_BROKER, broker]
    else:
        span.tag(TAG_MQ_BROKER, broker)


# -- publishing ------------------------------------------------------------------------------
_SW_HEADERS = ("sw8", "sw8-correlation", "sw8-x")


def _with_trace(headers: dict[str, Any], sw: dict[str, str]) -> dict[str, Any]:
    """The message's headers with this span's propagation headers instead of any it had: a
    retry copies its request's headers, and those of the message it retries must not survive
    next to this span's (e.g. a correlation header this span's trace no longer has)."""
    if "sw8" in headers or "sw8-correlation" in headers or "sw8-x" in headers:  # _SW_HEADERS
        headers = {k: v for k, v in headers.items() if k not in _SW_HEADERS}
    return {**headers, **sw}


def _untraced(app: Any, options: dict[str, Any]) -> None:
    """A send with no publish span (not recorded: ignored, over the span limit, inside another
    exit span) still must not carry the propagation headers of the task request running here,
    which Celery copies into a retry: the retry's run would continue the original publish.
    They are dropped, and the innermost recorded span of this context, if any, is propagated
    instead (the retry's run stays in this trace). Other headers are the caller's: kept."""
    headers = options.get("headers")
    if not headers or not ("sw8" in headers or "sw8-correlation" in headers or "sw8-x" in headers):
        return
    try:
        task = app.current_worker_task
        if task is None:
            return
        request = task.request
        if not any(
            headers.get(k) is not None and headers.get(k) == getattr(request, k, None) for k in _SW_HEADERS
        ):
            return
        clean = {k: v for k, v in headers.items() if k not in _SW_HEADERS}
        active = _ctx.active_span()
        if active is not None:
            clean.update(active.inject())
        options["headers"] = clean  # a new dict: the request's own is left as it is
    except Exception:
        warn_once("celery-publish-untraced", "swmp: checking an untraced Celery message's headers failed")


def _tag_parameters(span: Span, args: Any, kwargs: Any) -> None:
    """The ``celery.parameters`` tag, on its own: arguments whose text cannot be made (a
    ``__str__`` that raises where Celery's ``saferepr`` calls it: an int subclass, a dict
    subclass's ``items``) cost the tag, never the trace the message must carry."""
    try:
        span.tag(TAG_CELERY_PARAMETERS, parameters(args, kwargs, settings.params_length))
    except Exception:
        warn_once("celery-parameters", "swmp: printing a Celery task's arguments failed; no parameters tag")


def _publish_failed() -> None:
    """Adding the trace to a message failed (called while that exception is handled)."""
    warn_once("celery-publish", "swmp: adding the trace to a Celery message failed")


def _not_consumed(app: Any, peer: str, broker: str, last: list[tuple[Any, str, str, bool]]) -> None:
    """An armed send whose message was not built through ``task_message``: said once, and
    this app's sends pass ``sw8`` as the ``headers`` option from now on."""
    _message.missed(app)
    last[0] = (app, peer, broker, False)


def _send_in(span: Any, orig: Any, /, *args: Any, **options: Any) -> Any:
    """A publish whose span is not recorded but must be current during it (an IgnoredSpan:
    the spans under it are not recorded either); the native publish's way to ``with``."""
    with span:
        return orig(*args, **options)


def _py_send_task(orig: Any) -> tuple[Any, list[tuple[Any, str, str, bool]]]:
    """The publish wrapper in Python and the state it keeps: the reference form of the
    native ``CelerySend`` (swmp/_native/celery.c), which shares that state and hands it
    every call it does not take itself."""
    # (app, peer, tag, headers into the message) of the last send, replaced as one tuple
    # (threads may send through different apps): an application sends through one app, so
    # every send after the first skips broker_of's call.
    last: list[tuple[Any, str, str, bool]] = [(None, "", "", False)]

    def send_task(
        self: Any, name: str, args: Any = None, kwargs: Any = None, *rest: Any, **options: Any
    ) -> Any:
        app, peer, broker, in_message = last[0]
        if app is not self:
            peer, broker = broker_of(self)
            in_message = _message.builds_stock_messages(self)
            last[0] = (self, peer, broker, in_message)
        op = f"celery/{name}"
        span = _new_exit(op, peer, _COMPONENT, _MQ)
        if span.__class__ is not Span:  # NOOP, or an IgnoredSpan: not recorded
            if options.get("headers"):
                _untraced(self, options)  # before an IgnoredSpan becomes current
            if span is NOOP:
                return orig(self, name, args, kwargs, *rest, **options)
            with span:
                return orig(self, name, args, kwargs, *rest, **options)
        # What ``with span:`` does, spelled out: two plain method calls are cheaper.
        span.__enter__()
        box = None
        try:
            if span.tags is NO_TAGS and len(broker) <= limits.tag_value_max:  # _tag_broker, inlined
                span.tags = [TAG_MQ_BROKER, broker]
            else:
                span.tag(TAG_MQ_BROKER, broker)
            if settings.params_length > 0:
                _tag_parameters(span, args, kwargs)
            sw = span.inject()
            headers = options.get("headers")
            if headers:
                # A copy: the caller's dict (a signature's options) is reused for other sends.
                options["headers"] = _with_trace(headers, sw)
            elif in_message:
                box = [sw]  # into the message Celery builds (_celery_message): no option
            else:
                options["headers"] = sw
        except Exception:
            _publish_failed()
        token = None if box is None else _arm(box)
        try:
            result = orig(self, name, args, kwargs, *rest, **options)
        except BaseException as e:
            span.__exit__(type(e), e, e.__traceback__)
            raise
        finally:
            if token is not None:
                _disarm(token)
        if box:  # armed and not consumed: this app builds its messages some other way
            _not_consumed(self, peer, broker, last)
        span.__exit__(None, None, None)
        return result

    return send_task, last


# CelerySend(fallback, orig, last): the publish wrapper with its common case in C (no Python
# frame per published task), when the span core is built.
_CelerySend: Any = None
if native_core is not None and hasattr(native_core, "CelerySend"):
    native_core.setup_celery(
        Span,
        NOOP,
        NO_TAGS,
        limits,
        settings,
        _COMPONENT,
        _MQ,
        TAG_MQ_BROKER,
        _message._armed,
        _publish_failed,
        _not_consumed,
        _send_in,
    )
    _CelerySend = native_core.CelerySend


def _wrap_send_task(orig: Any) -> Any:
    """What ``Celery.send_task`` is patched with: the native publish around the Python
    wrapper, or the Python wrapper alone (pure-Python mode)."""
    send_task, last = _py_send_task(orig)
    return send_task if _CelerySend is None else _CelerySend(send_task, orig, last)


# -- executing -------------------------------------------------------------------------------
def _outcome(span: Span, result: Any, request: Any) -> None:
    """Record what Celery's tracer says happened: ``(retval, info, runtime, repr)``."""
    info = result[1] if isinstance(result, tuple) and len(result) > 1 else None
    retries = request.get("retries") if request else None
    if retries:
        span.tag(TAG_RETRIES, str(retries))
    if info is None:
        return
    state = getattr(info, "state", None)
    exc = getattr(info, "retval", None)
    if state == "RETRY":
        span.tag(TAG_RETRY, str(exc))
        cause = getattr(exc, "exc", None)
        span.error(
            cause if isinstance(cause, BaseException) else exc if isinstance(exc, BaseException) else None
        )
    elif state in ("FAILURE", "REJECTED"):
        span.error(exc if isinstance(exc, BaseException) else None)


def _traced(trace: Any, name: str, task: Any, eager: bool) -> Any:
    op = f"celery/{name}"
    broker: list[str] = []  # the tag, computed on the first run (configuration is final by then)

    def trace_task(uuid: Any, args: Any, kwargs: Any, request: Any = None) -> Any:
        if eager:
            span = _ctx.new_local_span(op, _COMPONENT, _MQ)
        else:
            carrier = carrier_from(request.get) if request else None
            span = _entry_root(op, _COMPONENT, _MQ, carrier) or _decide_entry(op, carrier, _COMPONENT, _MQ)
        if span.__class__ is not Span:
            with span:
                return trace(uuid, args, kwargs, request)
        assert isinstance(span, Span)
        span.__enter__()  # ``with span:`` spelled out, as in send_task
        try:
            if request:
                origin = request.get("origin")  # _origin_host(), inlined: once per task run
                span.peer = origin.rpartition("@")[2] if isinstance(origin, str) else ""
            if not broker:
                broker.append(broker_of(task.app)[1])
            _tag_broker(span, broker[0])
            if settings.params_length > 0:
                _tag_parameters(span, args, kwargs)
        except Exception:
            warn_once("celery-run-tags", "swmp: tagging a Celery task run failed")
        try:
            result = trace(uuid, args, kwargs, request)
        except BaseException as e:
            if _stops.stopped_by_the_pool(e):
                # The run failed, as Celery records it, though the span's __exit__ flags no
                # BaseException that is no Exception.
                span.error(e)
                span.__exit__(None, None, None)
            else:
                span.__exit__(type(e), e, e.__traceback__)
            raise
        try:
            # A successful first run (Celery's ``trace_ok_t`` with no info) has nothing to add.
            if (request and request.get("retries")) or (
                isinstance(result, tuple) and len(result) > 1 and result[1] is not None
            ):
                _outcome(span, result, request)
        except Exception:
            warn_once("celery-outcome", "swmp: recording a Celery task run's outcome failed")
        span.__exit__(None, None, None)
        return result

    return trace_task


def _wrap_build_tracer(orig: Any) -> Any:
    def build_tracer(name: str, task: Any, *args: Any, **kwargs: Any) -> Any:
        trace = orig(name, task, *args, **kwargs)
        # build_tracer(name, task, loader, hostname, store_errors, Info, eager, ...)
        eager = bool(kwargs.get("eager", args[4] if len(args) > 4 else False))
        return _traced(trace, name, task, eager)

    return build_tracer


# -- revoked ---------------------------------------------------------------------------------
def on_revoked(
    sender: Any = None,
    request: Any = None,
    terminated: Any = False,
    signum: Any = None,
    expired: Any = False,
    **_: Any,
) -> None:
    """``task_revoked``: the run that did not happen (or was killed) as a failed entry span."""
    if terminated and _stops.terminated_run_ends_itself(signum):
        return
    try:
        name = getattr(sender, "name", None) or getattr(request, "task", None) or "?"
        carrier = carrier_from(request.get) if request is not None else None  # a Celery Context
        span = _ctx.new_entry_span(f"celery/{name}", carrier, _COMPONENT, _MQ)
        if span.__class__ is not Span:
            return
        assert isinstance(span, Span)
        with span:
            if request is not None:
                span.peer = _origin_host(request)
            app = getattr(sender, "app", None)
            if app is not None:
                span.tag(TAG_MQ_BROKER, broker_of(app)[1])
            reason = "expired" if expired else f"terminated by signal {signum}" if terminated else "revoked"
            span.is_error = True
            span.log(event="revoked", message=reason)
    except Exception:  # a signal receiver's failure must not reach the worker
        warn_once("celery-revoked", "swmp: recording a revoked Celery task failed")


# -- install ---------------------------------------------------------------------------------
def install(config: Config) -> None:
    from celery import Celery, signals  # noqa: PLC0415 (only when the application has it)
    from celery.app import trace  # noqa: PLC0415

    settings.params_length = config.plugin_celery_parameters_length
    _message.install()
    patch(Celery, "send_task", _wrap_send_task)
    patch(trace, "build_tracer", _wrap_build_tracer)
    for name in _TRACER_USERS:
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "build_tracer"):
            patch(mod, "build_tracer", _wrap_build_tracer)
    signals.task_revoked.connect(on_revoked, weak=False, dispatch_uid="swmp-celery-revoked")
    signals.worker_ready.connect(_stops.on_worker_ready, weak=False, dispatch_uid="swmp-celery-ready")


def uninstall() -> None:
    from celery import Celery, signals  # noqa: PLC0415
    from celery.app import trace  # noqa: PLC0415

    restore(Celery, "send_task")
    _message.uninstall()
    restore(trace, "build_tracer")
    for name in _TRACER_USERS:
        mod = sys.modules.get(name)
        if mod is not None:
            restore(mod, "build_tracer")
    signals.task_revoked.disconnect(on_revoked, dispatch_uid="swmp-celery-revoked")
    signals.worker_ready.disconnect(_stops.on_worker_ready, dispatch_uid="swmp-celery-ready")
    _stops.pool.green = False
