"""Where the agent starts: which process owns the application (the prefork master), and
whether this process is one of its server workers. The owner's life bounds the arena and the
reporter; a worker that starts the agent (lazy apps) joins the owner's.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from swmp import _spawned, lifecycle
from swmp._daemonized import owner_left_behind


def server_position() -> tuple[int, bool]:
    """``(owner pid, started inside a worker)`` for the server we run in.

    The owner is the process whose life bounds the application: the prefork master. When
    the agent starts inside a worker (uWSGI ``lazy-apps``, Gunicorn without ``--preload``
    and a start call in the application module), the owner is the master and the reporter
    must be detached from the worker that happened to start it.
    """
    uwsgi = sys.modules.get("uwsgi")
    if uwsgi is not None:
        try:
            worker_id = int(uwsgi.worker_id())
            master = int(uwsgi.masterpid())
            if master > 0 and master != os.getpid():
                return master, True
            return os.getpid(), worker_id > 0 and master <= 0
        except Exception:
            pass
    master = _gunicorn_master_of_this_worker() or _sanic_main_of_this_worker()
    if master:
        return master, True
    return os.getpid(), False


def uwsgi_daemonized_since(owner_pid: int, owner_sid: int) -> bool:
    """In a uWSGI worker: did uWSGI daemonize after the agent started in ``owner_pid`` (of
    session ``owner_sid``; ``--daemonize2``: it loads the application, then forks twice in C,
    where no Python hook runs, and the daemon forks the workers)? Then the owner exits (or
    has), its reporter with it, and the worker's master is a process the agent never
    started in."""
    uwsgi = sys.modules.get("uwsgi")
    if uwsgi is None or not owner_pid:
        return False
    try:
        master = int(uwsgi.masterpid())
    except Exception:
        return False
    return 0 < master != owner_pid and master != os.getpid() and owner_left_behind(owner_pid, owner_sid)


def _gunicorn_master_of_this_worker() -> int:
    """The arbiter's pid when this process is a Gunicorn worker (0 otherwise).

    A worker runs its whole life inside ``Arbiter.spawn_worker`` (the post_fork hook, the
    application import without ``--preload``, the request loop), and the arbiter object on
    that frame still holds the master's pid.
    """
    if "gunicorn.arbiter" not in sys.modules:
        return 0
    frame: Any = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "spawn_worker" and code.co_filename.endswith(lifecycle.ARBITER_FILE):
            pid = getattr(frame.f_locals.get("self"), "pid", 0)
            if isinstance(pid, int) and pid > 0 and pid != os.getpid():
                return pid
            return os.getppid()
        frame = frame.f_back
    return 0


def _sanic_main_of_this_worker() -> int:
    """The Sanic main process's pid when this process is one of its server workers (0
    otherwise).

    Sanic's worker manager (``sanic app:app --workers N``) starts each worker with
    multiprocessing's *spawn*: a new interpreter, which runs ``swmp run``'s loader and so
    starts an agent of its own. The manager sets ``SANIC_WORKER_NAME`` (``Sanic-Server-0-0``)
    in the environment the worker is started with, and is its parent: the worker then
    joins the main process's arena and reporter and takes a slot of it (``-w0``,
    ``-w1``, ...), as a Gunicorn worker does, instead of being slot 0 of an arena of its
    own. Sanic's other processes (reloader, inspector) are no ``Server``.

    Every interpreter a worker starts (a multiprocessing child, a Python subprocess)
    inherits the variable too, and its parent is the worker, not the main process. The
    manager sets the variable only while it starts a worker, so the main process was never
    started with it: the parent must be the owner that the agent upstream published (the
    main process's, or the worker's, which names the main process), or, when no agent
    published one, a process whose own environment lacks the variable.
    """
    if "Server" not in os.environ.get("SANIC_WORKER_NAME", ""):
        return 0
    parent = os.getppid()
    if parent <= 1:
        return 0
    published = _spawned.published_owner()
    if published:
        return parent if published == parent else 0
    return 0 if _started_with(parent, b"SANIC_WORKER_NAME=") else parent


def _started_with(pid: int, variable: bytes) -> bool:
    """Was process ``pid`` started with ``variable`` in its environment (False: unknown)?"""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return any(entry.startswith(variable) for entry in f.read().split(b"\0"))
    except OSError:
        return False
