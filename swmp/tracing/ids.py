"""Trace and segment ids, unique across forked workers.

An id is ``<per-process random prefix>.<counter>``. uuid1-style ids (time + clock sequence)
collided between the peer agent's forked workers because the clock state is copied by
fork; here the prefix is 80 random bits drawn from ``os.urandom`` in each process, so two
processes share a prefix with negligible probability, and the counter (atomic under the
GIL: ``itertools.count`` is implemented in C) makes ids unique within a process.

The prefix is re-drawn after fork twice over: ``os.register_at_fork`` covers servers that
run at-fork hooks (Gunicorn), and a pid check on every id covers uWSGI, which does not
(unless ``--py-call-osafterfork``). The check compares with ``swmp.lifecycle.current_pid``:
where the fork hooks are reliable (everywhere but uWSGI without ``uwsgidecorators``) that is
the pid the hooks keep, so drawing an id makes no system call; elsewhere it is ``getpid``.
(A system call per request is not only its own cost: in a VM it leaves the request's later
work slower, see docs/performance.md.)
"""

from __future__ import annotations

import itertools
import os

from swmp import lifecycle

_pid = 0
_prefix = ""
_counter = itertools.count(1)


def _reseed() -> None:
    global _pid, _prefix, _counter
    _prefix = os.urandom(10).hex() + "."
    _counter = itertools.count(1)
    _pid = os.getpid()


_current_pid = lifecycle.current_pid


def new_id() -> str:
    if _current_pid() != _pid:
        _reseed()
    return _prefix + str(next(_counter))


def process_prefix() -> str:
    """This process's id prefix (for tests and diagnostics)."""
    if _current_pid() != _pid:
        _reseed()
    return _prefix


_reseed()
os.register_at_fork(after_in_child=_reseed)
