"""Processes that ``multiprocessing`` starts with a fresh interpreter: which ones run an agent,
and whose arena they join.

Under ``swmp run`` every Python interpreter loads the agent, and without this module each one
that is no server worker owns an arena and forks a reporter of its own. ``multiprocessing``'s
*spawn* and *forkserver* start methods start such interpreters; what they look like when the
agent starts (``sys.orig_argv``, measured with Python 3.11 under ``swmp run``):

* a **spawn child** (a spawn ``Pool`` process, a ``Process``, a ``Manager``'s server, Sanic's
  workers): ``python -B -c 'from multiprocessing.spawn import spawn_main; spawn_main(...)'
  --multiprocessing-fork``. It runs application code: it joins the arena and the reporter of
  the application that started it, and takes a slot when it first records (a pool process
  that never runs traced work is no instance);
* the **resource tracker**: ``python -B -c 'from multiprocessing.resource_tracker import
  main;main(N)'``; and the **forkserver**: ``python -B -c 'from multiprocessing.forkserver
  import main; main(...)'``. They run no application code: no agent there at all. The
  forkserver's children (forked, no new interpreter) do run application code: the agent
  starts in each of them right after the fork and joins the application's arena like a spawn
  child.

Which arena: an agent that starts records its arena's owner and path in :data:`ENV`, which the
interpreters it starts inherit. A child joins only when that owner is still the same live
process (the arena's name carries the owner's start time) and the arena file exists;
otherwise it starts as before, as an application of its own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

ENV = "SWMP_ARENA"  # "<owner pid>:<arena path>" of the agent that started this interpreter

_SPAWN = "from multiprocessing.spawn import spawn_main"
_RESOURCE_TRACKER = "from multiprocessing.resource_tracker import main"
_FORKSERVER = "from multiprocessing.forkserver import main"


def _program() -> str:
    """The ``-c`` program this interpreter was started with ("" when none)."""
    argv: list[str] = list(getattr(sys, "orig_argv", ()))
    try:
        return argv[argv.index("-c") + 1]
    except (ValueError, IndexError):
        return ""


# The command line is the exec'd interpreter's; a process forked from it has the same one.
_STARTED_PID = os.getpid()
_PROGRAM = _program()


def _forked_since_start() -> bool:
    return os.getpid() != _STARTED_PID


def runs_no_application() -> bool:
    """This very process is multiprocessing's resource tracker or forkserver."""
    return not _forked_since_start() and _PROGRAM.startswith((_RESOURCE_TRACKER, _FORKSERVER))


class _Handover:
    """The forkserver's hand-over to each child it forks: start the agent there, and leave
    through multiprocessing's exit finalizers (the forkserver ends its children with
    ``os._exit``: no ``atexit``, so no goodbye and, in thread mode, no final flush)."""

    def __init__(self, start: Callable[[], None], leave: Callable[[], None]) -> None:
        self.start = start
        self.leave = leave

    def in_child(self, _: object) -> None:
        # Called by multiprocessing in the child before the target runs, just after it
        # cleared the finalizers the forkserver had.
        self.start()
        try:
            from multiprocessing import util  # noqa: PLC0415

            util.Finalize(None, self.leave, exitpriority=0)
        except Exception:
            pass  # no goodbye: the slot is freed when the process ends all the same


_handover: list[_Handover] = []  # multiprocessing holds it weakly: kept alive here


def start_in_forkserver_children(start: Callable[[], None], leave: Callable[[], None]) -> None:
    """In the forkserver: ``start()`` in each child it forks (they run application code)."""
    if not _PROGRAM.startswith(_FORKSERVER) or _forked_since_start() or _handover:
        return
    from multiprocessing import util  # noqa: PLC0415 (imported by the forkserver already)

    _handover.append(_Handover(start, leave))
    util.register_after_fork(_handover[0], _handover[0].in_child)


def multiprocessing_child() -> bool:
    """A spawn child, or a child forked by the forkserver."""
    if _forked_since_start():
        return _PROGRAM.startswith(_FORKSERVER)
    return _PROGRAM.startswith(_SPAWN) and "--multiprocessing-fork" in getattr(sys, "orig_argv", ())


def owner_to_join(arena_path_of: Callable[[int], str]) -> int:
    """The owner pid of the arena this multiprocessing child joins; 0: none (start as before).

    ``arena_path_of(pid)`` is where this process's agent would find that owner's arena now: a
    dead owner, or a new process that reuses its pid, gives another path than the recorded one.
    """
    if not multiprocessing_child():
        return 0
    owner, path = _published()
    if owner <= 0 or owner == os.getpid() or not path:
        return 0
    try:
        if arena_path_of(owner) != path or not os.path.exists(path):
            return 0
    except Exception:  # no arena directory we may use: start as before (and fail there)
        return 0
    return owner


def _published() -> tuple[int, str]:
    pid_text, _, path = os.environ.get(ENV, "").partition(":")
    try:
        return int(pid_text), path
    except ValueError:
        return 0, ""


def published_owner() -> int:
    """The application owner an agent in an ancestor of this process published (0: none)."""
    return max(_published()[0], 0)


def publish(owner_pid: int, arena_path: str) -> None:
    """Tell the interpreters this process starts from now on which arena is the application's."""
    os.environ[ENV] = f"{owner_pid}:{arena_path}"


def withdraw(owner_pid: int, arena_path: str) -> None:
    """The agent stopped here: forget what :func:`publish` said (if it is still ours)."""
    if os.environ.get(ENV) == f"{owner_pid}:{arena_path}":
        del os.environ[ENV]
