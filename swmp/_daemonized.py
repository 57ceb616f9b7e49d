"""Is this new process the daemon that a double fork made of the application?

Daemonizing code (Gunicorn's ``--daemon``, python-daemon's ``DaemonContext``, Celery's
``--detach`` before its exec, the classic recipe) forks, lets the parent exit, calls
``setsid()`` in the child, forks again and lets that child exit too: the grandchild carries
on as the application, in a session of its own, while the process the agent started in (the
owner, whose life bounds the arena and the reporter) is gone. Left as it was, the daemon
wrote into an arena whose reporter had left with the owner (everything after the first
second lost) or, under a prefork server, counted as the owner's helper and reported nothing.

The facts used are the kernel's, seen from the grandchild's at-fork hook: its session is not
the owner's, its parent leads that session (the middle process of the double fork) and exits
at once. A session leader that lives on (a server that called ``setsid()`` itself and forks
its own workers) is not taken for one: its children stay what they were. Nothing here raises.
"""

from __future__ import annotations

import os
import select
import time

# How long a new process waits for the session leader that forked it to exit. Daemonizing
# code exits it right after the fork (milliseconds, more on a loaded machine); only a child of
# a session leader outside the application's session ever waits, and that leader is either
# the middle of a double fork (it exits) or a server that setsid()'d itself (the wait runs out
# once, in each child it forks).
LEADER_EXIT_WAIT_S = 0.5


def session_of(pid: int) -> int:
    """The session id of process ``pid`` (0 if it cannot be read)."""
    try:
        return os.getsid(pid)
    except OSError:
        return 0


def made_a_daemon(owner_sid: int) -> bool:
    """In a new process (the at-fork hook): True when it is the grandchild of a double fork
    that took the application out of the owner's session ``owner_sid`` (0: unknown, False)."""
    if not owner_sid:
        return False
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
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True  # gone (and reaped) already
    except (AttributeError, OSError):
        return _exits_within_by_proc(pid, timeout)  # no pidfd (old kernel, seccomp)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(int(timeout * 1000)))  # readable once the process has exited
    except OSError:
        return False
    finally:
        os.close(fd)


def _exits_within_by_proc(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rpartition(b")")[2].split()[0]
        except FileNotFoundError:
            return True  # no such process
        except (OSError, IndexError):
            return False  # nothing we can read: not taken for gone
        if state in (b"Z", b"X"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)
