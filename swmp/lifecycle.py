"""The life of this process as the agent sees it: forked, bound to a slot, leaving.

Several parts of the agent keep per-process state: the sink owns this process's ring and
name, meters own a thread and counted values. They must all notice the same moments, in
one order, whatever the server. This module is where those moments are *announced* and
*subscribed to*; no part looks another up or rewires it:

* **forked** - a new process, announced by ``os.register_at_fork`` and, under uWSGI
  (which skips Python's at-fork hooks unless ``--py-call-uwsgi-fork-hooks``),
  ``uwsgidecorators.postfork``; or late, by :func:`check_fork` from a part whose own pid
  check noticed first. Subscribers drop what the parent had. Never announced in the
  reporter or its supervisor (forked from the application, but not part of it).
* **bound** - the sink claimed (or declined) a ring for this process: its *role* is then
  known: ``"worker"`` (it reports), ``"master"`` (a prefork master: serves no requests,
  never reports), ``"unavailable"`` (no free slot yet; the sink retries now and then),
  ``"helper"`` (see below).
* **leaving** - the interpreter exits or the agent stops here: in-process producers write
  their last records before the sink says goodbye.

It also answers "may this process report?" for parts that start before the sink binds.

**Helpers.** A process forked by a process that reports (a server worker, a single-process
application) or by another helper is a *helper*: a ``multiprocessing`` fork pool, the short
child of ``subprocess`` with ``preexec_fn``, a plain ``os.fork`` in request code. It is not a
server worker: it claims no ring slot, is no instance, and in thread mode starts no reporter
thread and never touches the parent's gRPC channel (a channel used across fork crashed or hung
such children). Its records are dropped and counted. Under a prefork server we know (Gunicorn,
uWSGI) a process whose parent is not the master is a helper too, even if its parent had not
bound yet, and so is a fork of Gunicorn's master other than ``Arbiter.spawn_worker``'s, and a
fork that Python code makes in uWSGI's master (uWSGI forks its workers in C). A
server hook that knows better (Celery's ``worker_process_init``) declares the process a worker
with :func:`declare_server_worker`.

**Daemons.** The grandchild of a double fork that left the owner's session (Gunicorn's
``--daemon``, python-daemon) is no helper: the owner exits, and :func:`daemonized` tells the
agent to start anew in it (``swmp._daemonized`` says how it is recognised). The child of a
single fork that called ``setsid()`` (the ``daemonize`` package) is found later, by the sink
(:func:`notice_single_fork_daemon`), which announces it to the agent the same way.
"""

from __future__ import annotations

import dis
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType

# Imported before our fork hook is registered, on purpose: at-fork hooks run in
# registration order, and ipc's (it disables the ring writers a child inherits) must run
# before ours announces the fork and the sink claims the child's own writer.
import ipc.ring  # noqa: F401
from reporter_proc.role import forking_reporter, in_reporter_process
from swmp import _daemonized
from swmp._daemonized import UNKNOWN_SESSION, detached_by_a_single_fork, made_a_daemon, session_of

log = logging.getLogger("swmp.agent")

WORKER = "worker"
MASTER = "master"
UNAVAILABLE = "unavailable"
HELPER = "helper"
# Roles of a process whose children are helpers: it reports (or tries to), or is a helper.
_HELPER_PARENTS = frozenset((WORKER, UNAVAILABLE, HELPER))
_REPORTING = frozenset((WORKER, UNAVAILABLE))

Hook = Callable[[], None]
RoleHook = Callable[[str], None]

_fork_hooks: list[Hook] = []
_bound_hooks: list[RoleHook] = []
_leave_hooks: list[Hook] = []
_daemon_hooks: list[Hook] = []
_lock = threading.Lock()  # subscriptions only; never held while hooks run


class _Process:
    __slots__ = (
        "daemon",
        "next_single_fork_check",
        "owner_pid",
        "owner_sid",
        "parent_pid",
        "parent_role",
        "pid",
        "role",
    )

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.role = ""  # "" until the sink binds in this process
        # Who forked this process, and that one's role then (0, "": not forked since the
        # agent's import). A child reads its parent's values: who forked its parent.
        self.parent_pid = 0
        self.parent_role = ""
        self.owner_pid = 0  # the process whose life bounds the application (0: unknown)
        self.owner_sid = UNKNOWN_SESSION  # the owner's session (0 is a real one)
        # The daemon a double fork made of the application (swmp._daemonized): the agent
        # starts anew in it, as in a new application's owner.
        self.daemon = False
        # When notice_single_fork_daemon() may look again (monotonic; 0: at its first call).
        self.next_single_fork_check = 0.0


_here = _Process()


# -- subscribing -------------------------------------------------------------------------------
def _add(hooks: list[Callable[..., None]], fn: Callable[..., None]) -> None:
    with _lock:
        if fn not in hooks:
            hooks.append(fn)


def _remove(hooks: list[Callable[..., None]], fn: Callable[..., None]) -> None:
    with _lock:
        if fn in hooks:
            hooks.remove(fn)


def on_fork(fn: Hook) -> None:
    """Call ``fn()`` first thing in every new process (in subscription order)."""
    _add(_fork_hooks, fn)


def on_bound(fn: RoleHook) -> None:
    """Call ``fn(role)`` whenever the sink has bound this process (once per process)."""
    _add(_bound_hooks, fn)


def on_leave(fn: Hook) -> None:
    """Call ``fn()`` before this process leaves (its sink's goodbye comes after)."""
    _add(_leave_hooks, fn)


def on_daemonized(fn: Hook) -> None:
    """Call ``fn()`` when this process turns out to be the daemon of a single fork
    (:func:`notice_single_fork_daemon`): the agent starts anew in it."""
    _add(_daemon_hooks, fn)


def unsubscribe(fn: Callable[..., None]) -> None:
    for hooks in (_fork_hooks, _bound_hooks, _leave_hooks, _daemon_hooks):
        _remove(hooks, fn)


def _run(hooks: list[Callable[..., None]], *args: str) -> None:
    for fn in list(hooks):
        try:
            fn(*args)
        except Exception:  # one part failing must not keep the others from their moment
            log.exception("swmp: a process lifecycle hook failed in pid %d", os.getpid())


# -- announcing --------------------------------------------------------------------------------
def _forked_python_hook() -> None:
    """Python's at-fork hook in the child. Under uWSGI it also runs in a worker that uWSGI
    forked in C (``--py-call-osafterfork``, ``--py-call-uwsgi-fork-hooks``): with no Python
    frame below it then, where a fork made by Python code (``os.fork``, ``subprocess`` with
    ``preexec_fn``, ``multiprocessing``) has the frame that called it."""
    try:
        _forked(by_python=sys._getframe(0).f_back is not None)
    except KeyboardInterrupt:
        _end_as_interrupted()


def _end_as_interrupted() -> None:
    """SIGINT came while the agent worked in the at-fork hook (a daemon's worker starting the
    agent anew takes a while): Python's handler raised KeyboardInterrupt there, and Python
    ignores what an at-fork hook raises, so the interrupt would be lost and the process would
    go on. A uWSGI worker then outlived its master's stop by the worker mercy (60 s) before
    being killed. The process ends as an uncaught KeyboardInterrupt ends a Python program: by
    SIGINT, with its default action."""
    log.warning("swmp: interrupted while starting in pid %d: ending the process", os.getpid())
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    except (ValueError, OSError):  # not the main thread: the same end without the signal
        os._exit(128 + signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)


def _forked(by_python: bool = False) -> None:
    pid = os.getpid()
    if _here.pid == pid:
        return
    parent_role = _here.role  # still the parent's: memory is inherited, the hooks run first
    middle_forked_by, owner_role = _here.parent_pid, _here.parent_role  # (who forked our parent)
    _here.parent_pid, _here.parent_role = _here.pid, parent_role
    _here.pid = pid
    _here.role = ""
    _here.daemon = False
    _here.next_single_fork_check = 0.0
    if forking_reporter() or in_reporter_process():
        return  # the reporter (or its supervisor) is not a process of the application
    owner = _here.owner_pid
    if made_a_daemon(
        owner, _here.owner_sid, middle_forked_by=middle_forked_by, owner_reported=owner_role in _REPORTING
    ):
        _here.daemon = True  # no helper of the owner, which is gone: see daemonized()
    elif parent_role in _HELPER_PARENTS or _forked_outside_the_master(owner, by_python):
        _here.role = HELPER
    _run(_fork_hooks)


def _forked_outside_the_master(owner_pid: int, by_python: bool) -> bool:
    """Under Gunicorn or uWSGI, only the master forks server workers; Gunicorn's master forks
    them only in ``Arbiter.spawn_worker``, uWSGI's only in C. The master's other forks are
    helpers: Gunicorn's ``reexec`` (USR2: fork then exec a new master, which starts an agent
    of its own), ``--daemon``, Gunicorn 27's dirty arbiter; ``subprocess`` with
    ``preexec_fn``, ``os.fork`` or ``multiprocessing`` in a server hook or, under uWSGI, in
    the application imported by the master (``by_python``: a Python frame made the fork)."""
    if not owner_pid or not prefork_server():
        return False
    try:
        if os.getppid() != owner_pid:
            return True
    except OSError:
        return False
    if "uwsgi" in sys.modules:
        return by_python
    return "gunicorn.arbiter" in sys.modules and not _gunicorn_worker_fork()


ARBITER_FILE = os.path.join("gunicorn", "arbiter.py")


def _gunicorn_worker_fork() -> bool:
    """Is this process the fork of ``Arbiter.spawn_worker`` (the stack is the parent's)?

    A fork made by the ``pre_fork`` hook, which ``spawn_worker`` runs just before its own
    fork, has that frame on its stack too, stopped at the hook's call: that one is a helper.
    (Matching the frame at its ``os.fork()`` call instead would turn every worker into a
    helper, with no telemetry at all, the day Gunicorn forks on another line.)
    """
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "spawn_worker" and code.co_filename.endswith(ARBITER_FILE):
            return frame.f_lineno not in _lines_calling(code, "pre_fork")
        frame = frame.f_back
    return False


@functools.lru_cache(maxsize=8)
def _lines_calling(code: CodeType, name: str) -> frozenset[int]:
    """The source lines of ``code`` that load the attribute or name ``name``."""
    lines: set[int] = set()
    line = code.co_firstlineno
    for ins in dis.get_instructions(code):
        positions = getattr(ins, "positions", None)  # Python 3.11+; starts_line before
        if positions is not None and positions.lineno is not None:
            line = positions.lineno
        elif positions is None and ins.starts_line:
            line = ins.starts_line
        if ins.argval == name:
            lines.add(line)
    return frozenset(lines)


def declare_server_worker() -> None:
    """A server hook says this process is a server worker (e.g. Celery's pool child), not a
    helper of the process that forked it. The sink's next bind claims a slot."""
    check_fork()
    if _here.role == HELPER:
        _here.role = ""


def check_fork() -> None:
    """Announce the fork now if the hooks have not (a pid check noticed it first)."""
    if _here.pid != os.getpid():
        _forked()


def announce_owner(owner_pid: int) -> None:
    """The agent started: ``owner_pid`` is the application's owner (prefork master)."""
    _here.owner_pid = owner_pid
    _here.owner_sid = session_of(owner_pid) if owner_pid else UNKNOWN_SESSION
    _here.daemon = False


def owner_session() -> int:
    """The session of the owner announced last (UNKNOWN_SESSION: none, or unknown)."""
    return _here.owner_sid


# A helper forked by a reporting owner asks again this often (its records are dropped until
# then): the owner may exit after the helper's first look.
SINGLE_FORK_RECHECK_S = 1.0


def notice_single_fork_daemon() -> bool:
    """Is this process the daemon of a single fork, found only now (``swmp._daemonized``:
    forked by the owner, ``setsid()`` since, the owner gone)? Asked by the sink on its slow
    paths (its first use in a new process, a helper's dropped records). When it is, the moment
    is announced (the agent starts anew here, with a sink of its own) and True returned: the
    caller hands its record to that sink. Cheap for every other process: two comparisons."""
    check_fork()
    if _here.parent_pid != _here.owner_pid or not _here.owner_pid or _here.daemon:
        return False  # not forked by the owner itself (or already known)
    now = time.monotonic()
    if now < _here.next_single_fork_check:
        return False
    # The first look waits a moment for the owner's exit (the child's first record may come
    # before its parent is gone); later ones only look.
    wait = _daemonized.LEADER_EXIT_WAIT_S if not _here.next_single_fork_check else 0.0
    _here.next_single_fork_check = now + SINGLE_FORK_RECHECK_S
    if not detached_by_a_single_fork(_here.owner_pid, _here.owner_sid, forked_by=_here.parent_pid, wait=wait):
        return False
    _here.daemon = True
    _run(_daemon_hooks)
    return True


def daemonized() -> bool:
    """Is this process the daemon that a double fork made of the application (Gunicorn's
    ``--daemon``, python-daemon)? The owner it was forked from exits, and the owner's
    reporter with it: the agent must start here anew (``swmp.agent``)."""
    check_fork()
    return _here.daemon


def start_as_owner() -> None:
    """The agent starts anew in this process (a daemon): no role yet, its owner announced next."""
    _here.role = ""
    _here.owner_pid = 0
    _here.owner_sid = UNKNOWN_SESSION
    _here.daemon = False


def announce_bound(role: str) -> None:
    check_fork()
    _here.role = role
    _run(_bound_hooks, role)


def announce_leaving() -> None:
    _run(_leave_hooks)


def announce_unbound() -> None:
    """The sink left this process's ring (the agent stopped here): the role is unknown again."""
    if _here.pid == os.getpid() and _here.role != HELPER:
        _here.role = ""


# -- asking ------------------------------------------------------------------------------------
def role() -> str:
    """This process's role once the sink bound it here; "" before."""
    return _here.role if _here.pid == os.getpid() else ""


def is_reporting_worker() -> bool:
    return role() == WORKER


def is_helper() -> bool:
    """Forked by a reporting process and not a server worker: stays inert (see the module doc)."""
    check_fork()
    return _here.role == HELPER


def may_report_here() -> bool:
    """False in the reporter process and in a prefork master (they serve no requests)."""
    if forking_reporter() or in_reporter_process():
        return False
    known = role()
    if known:
        return known not in (MASTER, HELPER)
    owner = _here.owner_pid
    return not (owner and prefork_master(owner))


def prefork_master(owner_pid: int) -> bool:
    """True in the master process of a prefork server we know (it serves no requests)."""
    pid = os.getpid()
    if pid != owner_pid:
        return False
    uwsgi = sys.modules.get("uwsgi")
    if uwsgi is not None:
        try:
            return int(uwsgi.masterpid()) == pid and int(uwsgi.worker_id()) == 0
        except Exception:
            return False
    # The arbiter module is imported by the gunicorn command itself, never by workers'
    # applications; in the owner process it means "this is the arbiter".
    return "gunicorn.arbiter" in sys.modules


def prefork_server() -> bool:
    """Are we in a prefork server whose forks are workers (they report from their start)?"""
    return "gunicorn.arbiter" in sys.modules or "uwsgi" in sys.modules


# -- the fork hooks, registered once per interpreter -------------------------------------------
def _register_fork_hooks() -> bool:
    """Register the hooks; True when a fork is sure to be announced without a pid check."""
    os.register_at_fork(after_in_child=_forked_python_hook)
    if "uwsgi" not in sys.modules:
        return True
    try:
        import uwsgidecorators  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

        uwsgidecorators.postfork(_forked)
        return True
    except Exception:
        # Without it the pid checks on the hot paths (sink, meters) still notice the fork.
        log.debug("uwsgidecorators.postfork unavailable", exc_info=True)
        return False


FORK_HOOKS_RELIABLE = _register_fork_hooks()


def _pid_from_hooks() -> int:
    return _here.pid


# This process's pid for hot paths: where the fork hooks are reliable they keep it current,
# so no system call is made per record (glibc no longer caches getpid()); elsewhere
# (uWSGI without uwsgidecorators) it is os.getpid(), the backstop.
current_pid: Callable[[], int] = _pid_from_hooks if FORK_HOOKS_RELIABLE else os.getpid
# The object whose ``pid`` is that pid where the hooks keep it (native code reads it without
# a Python call), else None.
pid_holder: object | None = _here if FORK_HOOKS_RELIABLE else None
