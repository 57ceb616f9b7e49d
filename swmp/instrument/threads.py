"""Threads continue the trace they were started in: ``threading.Thread`` and
``concurrent.futures.ThreadPoolExecutor`` (asyncio tasks do it through contextvars already).

A thread started, or a work item submitted, while a recorded span is open inherits a
snapshot of it (``swmp.tracing.context.inherit``): the spans it opens start segments with
a cross-thread reference to that span, and its log records carry the trace id. No span is
made for the thread itself, so a thread that does nothing traced costs nothing more, and a
long-lived thread holds nothing open.

Both methods are Gates (swmp/instrument/_gate.py): outside a trace the cost is one
context-variable read in C per ``start()`` / ``submit()``, and inside one the checks that
usually find nothing to do (a pool's worker thread, a work item that runs in a copy of its
caller's context) run in C too (swmp/_native/threads.c, with the Python forms below as the
reference and the fallback); Python code runs only to take and hand over a snapshot.

Not wrapped: the worker threads of thread pools (``concurrent.futures``,
``multiprocessing.pool``: they serve many work items, each of which is wrapped on its own
at submit) and the agent's own threads. ``SW_AGENT_THREAD_PROPAGATION=false`` turns all of
this off.
"""

from __future__ import annotations

import contextvars
import functools
import sys
import threading
import types
from typing import TYPE_CHECKING, Any

from swmp.instrument import _hook
from swmp.instrument._gate import gated
from swmp.instrument._patch import patch, restore
from swmp.tracing import context as _ctx
from swmp.tracing.span import native_core

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "threading"
PACKAGE = None
SUPPORTED = ("", "")

# Targets that run a pool's worker loop (one long-lived thread, many work items), the agent,
# asgiref's helper threads (the join of a request's executor, started by Django's ASGI
# handler on every request; its work goes to executors, wrapped at submit) or grpc's own
# threads: grpc starts them through ``cygrpc.ForkManagedThread``, whose target runs in a
# copy of the starting context already, and a sync channel starts its spin thread again
# for the first call after it went idle (on every ``future()`` or streamed call made one
# at a time): a snapshot there was a quarter to a third of such a call's traced cost in a
# request (benchmarks/grpc_client_cost.py --in-request), set for nothing.
_SKIP_MODULES = (
    "concurrent.futures.",
    "multiprocessing.",
    "swmp.",
    "reporter_proc.",
    "ipc.",
    "asgiref.",
    "grpc.",
)
_SKIP_EXACT = frozenset(("concurrent.futures", "multiprocessing"))
_POOL = "concurrent.futures.thread"
_partial = functools.partial
_Context = contextvars.Context
_BuiltinMethod = types.BuiltinMethodType


# Classes whose bound method, as a pool work item's ``functools.partial``, runs the work in
# a copy of the submitting context: ``contextvars.Context`` (``asyncio.to_thread``) and
# asgiref's ``SyncToAsync`` (added when ``asgiref.sync`` is imported).
_COPYING_OWNERS: set[type] = {_Context}


def _note_asgiref() -> None:
    _COPYING_OWNERS.add(sys.modules["asgiref.sync"].SyncToAsync)


def _own_context(fn: Any) -> bool:
    """The work item runs in a copy of the submitting context, where the caller's span is
    current already: ``asyncio.to_thread`` (``partial(context.run, ...)``), grpc's server
    (``context.run``) and asgiref's ``sync_to_async`` (Django's ASGI handler, twice a
    request: ``partial(thread_handler, ...)``, which runs the function in the caller's
    copied context). A snapshot would be made and set for nothing."""
    if fn.__class__ is _partial:
        return getattr(fn.func, "__self__", None).__class__ in _COPYING_OWNERS
    # grpc's server submits ``context.run`` itself (the handler's copied context).
    return fn.__class__ is _BuiltinMethod and fn.__self__.__class__ is _Context


def _skipped(thread: threading.Thread) -> bool:
    target = getattr(thread, "_target", None)
    module = getattr(target if target is not None else type(thread).run, "__module__", None) or ""
    return module.startswith(_SKIP_MODULES) or module in _SKIP_EXACT


_NO_WORK = object()


def _py_runs_in_own_context(executor: Any, fn: Any = _NO_WORK, /, *args: Any, **kwargs: Any) -> bool:
    """The ``submit`` gate's ``passes``: a work item in its own context, or no work item
    (a check that raises is "passes" for the gate, as for ``start``'s ``_skipped``)."""
    return fn is _NO_WORK or _own_context(fn)


_thread_skipped: Any = _skipped
_runs_in_own_context: Any = _py_runs_in_own_context
if native_core is not None and hasattr(native_core, "setup_threads"):
    native_core.setup_threads(_SKIP_MODULES, _SKIP_EXACT, _COPYING_OWNERS, _partial)
    _thread_skipped = native_core.thread_skipped
    _runs_in_own_context = native_core.runs_in_own_context


def _continuing(fn: Any, snapshot: _ctx.Snapshot) -> Any:
    """``fn`` run with ``snapshot`` as its trace parent, restored afterwards."""

    def run(*args: Any, **kwargs: Any) -> Any:
        token = _ctx.inherit(snapshot)
        try:
            return fn(*args, **kwargs)
        finally:
            _ctx.disinherit(token)

    return run


_NONE: Any = object()


def _thread_run(thread: threading.Thread, snapshot: _ctx.Snapshot) -> Any:
    """``thread.run`` continuing ``snapshot``. Once it has run, the thread's own ``run``
    attribute is as it was before: the wrapper (which refers to the thread) no longer hangs
    on the thread, so a finished thread is freed by its reference count, not left in a
    reference cycle for the garbage collector (as threading.Thread.run drops its target)."""
    own = thread.__dict__.get("run", _NONE)
    wrapped = _continuing(thread.run, snapshot)

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return wrapped(*args, **kwargs)
        finally:
            if own is _NONE:
                thread.__dict__.pop("run", None)
            else:
                thread.__dict__["run"] = own

    return run


def _make_start(orig: Any) -> Any:
    def start(self: threading.Thread) -> None:
        # Reached with a span current, for a thread that is not skipped (the gate asked).
        try:
            snapshot = _ctx.capture()
            if snapshot is not None:
                # An instance attribute: the class (and other threads) stay untouched;
                # named like the method it stands for (what a debugger or a log shows).
                run = _thread_run(self, snapshot)
                functools.update_wrapper(run, self.run)
                self.run = run  # type: ignore[method-assign]
        except Exception:  # never fail the application's thread start for tracing
            pass
        return orig(self)  # type: ignore[no-any-return]

    return gated(orig, start, _thread_skipped)


def _make_submit(orig: Any) -> Any:
    def submit(self: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        # Reached with a span current, for a work item that needs a snapshot (the gate asked).
        snapshot = _ctx.capture()
        if snapshot is not None:
            # No functools.wraps: the pool only calls the work item, and copying its
            # name, doc and dict cost more than the rest of the wrapping together.
            fn = _continuing(fn, snapshot)
        return orig(self, fn, *args, **kwargs)

    return gated(orig, submit, _runs_in_own_context)


def _install_pool() -> None:
    from concurrent.futures.thread import ThreadPoolExecutor  # noqa: PLC0415

    patch(ThreadPoolExecutor, "submit", _make_submit)


def install(config: Config) -> None:
    if not config.agent_thread_propagation:
        return
    patch(threading.Thread, "start", _make_start)
    _hook.defer("asgiref.sync", _note_asgiref, key="threading-asgiref")
    # concurrent.futures imports its thread pool lazily: patch it when (if ever) it is imported.
    if _POOL in sys.modules:
        _install_pool()
    else:
        _hook.defer(_POOL, _install_pool, key="threading-pool")


def uninstall() -> None:
    restore(threading.Thread, "start")
    pool = sys.modules.get(_POOL)
    if pool is not None:
        restore(pool.ThreadPoolExecutor, "submit")
