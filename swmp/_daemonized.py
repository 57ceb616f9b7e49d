"""Is this new process the daemon that a double fork made of the application?

Daemonizing code (Gunicorn's ``--daemon``, python-daemon's ``DaemonContext``, Celery's
``--detach`` before its exec, the classic recipe) forks, lets the parent exit, calls
``setsid()`` in the child, forks again and lets that child exit too: the grandchild carries
on as the application, in a session of its own, while the process the agent started in (the
owner, whose life bounds the arena and the reporter) is gone. Left as it was, the daemon
wrote into an arena whose reporter had left with the owner (everything after the first
second lost) or, under a prefork server, counted as the owner's helper and reported nothing.

The facts used, seen from the grandchild's at-fork hook: the middle process was forked by the
owner itself; the grandchild's session is not the owner's; its parent leads that session and
exits at once. And when the owner was reporting (a single-process application that recorded
before it daemonized), the owner has exited too. So a job that a worker, or a reporting
application that lives on, detaches with the same double fork stays what it was (an inert
helper of the application), and so do the children of a session leader that lives on (a
server that called ``setsid()`` itself and forks its own workers).

Daemonizing with one fork (the ``daemonize`` package: the child calls ``setsid()`` after the
fork, so no at-fork hook sees it) is recognised later, by the sink on its first use in the
child or on a dropped record (``detached_by_a_single_fork``). Nothing here raises.
"""

from __future__ import annotations

import os
import select
import time

from ipc.procinfo import process_exited

# How long a new process waits for the session leader that forked it to exit. Daemonizing
# code exits it right after the fork (milliseconds, more on a loaded machine); only a child of
# a session leader outside the application's session ever waits, and that leader is either
# the middle of a double fork (it exits) or a server that setsid()'d itself (the wait runs out
# once, in each child it forks).
LEADER_EXIT_WAIT_S = 0.5

# A session id that no process has. Not 0: that is a real session, the one of every process
# whose ancestors never called setsid() (the children of a VM's or container's init, a CI
# runner's jobs).
UNKNOWN_SESSION = -1


def session_of(pid: int) -> int:
    """The session id of process ``pid`` (UNKNOWN_SESSION if it cannot be read)."""
    try:
        return os.getsid(pid)
    except OSError:
        return UNKNOWN_SESSION


def made_a_daemon(owner_pid: int, owner_sid: int, *, middle_forked_by: int, owner_reported: bool) -> bool:
    """In a new process (the at-fork hook): True when it is the grandchild of a double fork
    that took the application out of the session ``owner_sid`` of its owner ``owner_pid``
    (UNKNOWN_SESSION or pid 0: unknown, False). ``middle_forked_by``: the pid of the process
    that forked this one's parent; ``owner_reported``: the owner had a ring of its own when it
    forked."""
    if owner_sid == UNKNOWN_SESSION or not owner_pid or middle_forked_by != owner_pid:
        return False
    if not _left_the_session(owner_sid):
        return False
    return not owner_reported or _exits_within(owner_pid, 0.0)


def detached_by_a_single_fork(owner_pid: int, owner_sid: int, *, forked_by: int, wait: float) -> bool:
    """In a process that the owner ``owner_pid`` forked itself (``forked_by``), later: True when
    it daemonized with one fork (the ``daemonize`` package: fork, the parent exits, the child
    calls ``setsid()`` and carries on): it leads a session of its own now, and the owner has
    exited or does within ``wait`` seconds. A child that called ``setsid()`` while the owner
    lives on (a detached job) is no daemon."""
    if owner_sid == UNKNOWN_SESSION or not owner_pid or forked_by != owner_pid:
        return False
    try:
        if os.getsid(0) != os.getpid():
            return False  # no setsid() here (yet)
    except OSError:
        return False
    return _exits_within(owner_pid, wait)


def owner_left_behind(owner_pid: int, owner_sid: int) -> bool:
    """In a worker of a daemon that the owner ``owner_pid`` became where no Python hook saw it
    (uWSGI's ``--daemonize2`` forks twice in C, then forks the workers): has the owner exited?
    It calls ``_exit()`` right after its fork, but on a loaded machine the daemon can fork this
    worker, and the worker reach this question, before the owner has run again. So when this
    process is in a session other than the owner's (the daemonizing code called ``setsid()``),
    the owner's exit is waited for, up to LEADER_EXIT_WAIT_S; in the owner's own session
    (UNKNOWN_SESSION: unknown), only the present counts."""
    return _exits_within(owner_pid, LEADER_EXIT_WAIT_S if _outside_the_session(owner_sid) else 0.0)


def _outside_the_session(owner_sid: int) -> bool:
    """Is this process in a session other than the known session ``owner_sid``?"""
    try:
        return owner_sid != UNKNOWN_SESSION and os.getsid(0) != owner_sid
    except OSError:
        return False


def _left_the_session(owner_sid: int) -> bool:
    """Is this new process in a session other than ``owner_sid``, led by its parent (or by a
    process gone already), which exits: the middle process of a double fork?"""
    try:
        sid = os.getsid(0)
        if sid in (owner_sid, os.getpid()):
            return False  # still in the application's session, or the leader of its own
        parent = os.getppid()
    except OSError:
        return False
    if parent == sid:
        return _exits_within(parent, LEADER_EXIT_WAIT_S)
    # Our parent is no longer the leader that forked us: it exited already (a zombie until
    # reaped, which a signal still reaches) and we were handed to init or a subreaper, or the
    # leader is an older ancestor that lives on.
    return _exits_within(sid, 0.0)


def _exits_within(pid: int, timeout: float) -> bool:
    """Has process ``pid`` exited, or does it within ``timeout`` seconds (a zombie counts)?"""
    if process_exited(pid):
        return True
    if timeout <= 0:
        return False
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True  # gone (and reaped) since
    except (AttributeError, OSError):
        return _polled_exit(pid, timeout)  # no pidfd (old kernel, seccomp)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(int(timeout * 1000)))  # readable once the process has exited
    except OSError:
        return False
    finally:
        os.close(fd)


def _polled_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.002)
        if process_exited(pid):
            return True
    return False
