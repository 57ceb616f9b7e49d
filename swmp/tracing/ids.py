"""Trace and segment ids, unique across forked workers.

An id is ``<per-process random prefix>.<counter>``. uuid1-style ids (time + clock sequence)
collided between the peer agent's forked workers because the clock state is copied by
fork; here the prefix is 80 random bits drawn from ``os.urandom`` in each process, so two
processes share a prefix with negligible probability, and the counter (atomic under the
GIL: ``itertools.count`` is implemented in C) makes ids unique within a process.

The prefix is re-drawn after fork twice over: ``os.register_at_fork`` covers servers that
run at-fork hooks (Gunicorn), and a pid check on every id covers uWSGI, which does not
(unless ``--py-call-uwsgi-fork-hooks``). The check compares with ``swmp.lifecycle.current_pid``:
where the fork hooks are reliable (everywhere but uWSGI without ``uwsgidecorators``) that is
the pid the hooks keep, so drawing an id makes no system call; elsewhere it is ``getpid``.
(A system call per request is not only its own cost: in a VM it leaves the request's later
work slower, see docs/performance.md.)
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

from swmp import lifecycle
from swmp.tracing.span import native_core

_pid = 0
_prefix = ""
_counter = itertools.count(1)
# Where the current pid comes from: an object whose ``pid`` the fork hooks keep (no system
# call), or None and then a function (``os.getpid`` where the hooks are not reliable).
_pid_source: Callable[[], int] = lifecycle.current_pid
_pid_holder: Any = lifecycle.pid_holder


# The tracing core's native module (its ``new_id``), or None: the same choice as the spans'.
_native: Any = native_core


def _reseed() -> None:
    global _pid, _prefix, _counter
    _prefix = os.urandom(10).hex() + "."
    _counter = itertools.count(1)
    _pid = os.getpid()
    if _native is not None:
        _native.set_ids(_prefix, _pid, _pid_holder, _pid_source, _reseed)


def _py_new_id() -> str:
    if _pid_source() != _pid:
        _reseed()
    return _prefix + str(next(_counter))


# The native one draws from the same prefix with its own counter, so only one of the two
# may serve a process: the module's choice, made once.
new_id: Callable[[], str] = _native.new_id if _native is not None else _py_new_id


def process_prefix() -> str:
    """This process's id prefix (for tests and diagnostics)."""
    if _pid_source() != _pid:
        _reseed()
    return _prefix


def use_pid_source(source: Callable[[], int], holder: Any = None) -> None:
    """Where the fork check reads the pid (tests: a fork that runs no at-fork hooks)."""
    global _pid_source, _pid_holder
    _pid_source, _pid_holder = source, holder
    _reseed()


_reseed()
os.register_at_fork(after_in_child=_reseed)
