"""Starting and keeping the reporter alive: fork, supervision, adoption, settings across exec
(the process plumbing is in ``plumbing.py``, thread mode in ``thread_mode.py``).

Process tree (``spawn_reporter`` called in the application's master)::

    master (owner of the arena)
     `- swmp-supervisor   forked from the master's main thread; no event loop, no grpc
         `- swmp-reporter forked by the supervisor; asyncio loop + sender created here

Why a supervisor instead of the master restarting the reporter: the master belongs to the
application server (Gunicorn reaps every child with ``waitpid(-1)``, uWSGI re-execs itself
on reload), so the agent cannot wait for its own child there. The supervisor is a plain
process that only forks, waits on pidfds and forwards signals; when the reporter dies
abnormally it forks a new one (exponential backoff, capped, reset after a stable run), and
the new reporter re-reads whatever the dead one had not committed.

Everything forked from the application ends in ``os._exit``: never return into the
application's code, never run its atexit handlers. Exit statuses are 0 or >= 70; never 3
or 4 (Gunicorn <= 23 halts the server when a child exits with those).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
from typing import NoReturn

import orjson

from ipc import Arena, ArenaError, process_alive
from reporter_proc.exits import EXIT_ERROR, EXIT_OK

# The process plumbing and thread mode have modules of their own; the names callers import
# from here stay importable from here.
from reporter_proc.plumbing import (
    _flush_std,
    _run_loop,
    lower_priority,
    release_std_streams,
    release_stdin,
    reset_signals,
    set_pdeathsig,
    set_process_title,
    tune_gc,
)
from reporter_proc.role import forking_reporter, in_reporter_process, mark_reporter_process, set_forking
from reporter_proc.settings import ReporterSettings, settings_from_mapping
from reporter_proc.supervisor import Supervisor
from reporter_proc.thread_mode import ReporterThread, start_reporter_thread

# The reporter itself (asyncio and every part, ~8 MiB of memory) is imported only where it
# runs: in the forked reporter process or on the reporter thread, never in the application's
# master (whose pages every worker inherits) just because the agent can spawn a reporter.

log = logging.getLogger("swmp.reporter")

__all__ = [
    "ReporterThread",
    "forking_reporter",
    "in_reporter_process",
    "run_reporter_process",
    "run_supervisor",
    "settings_from_json",
    "settings_to_json",
    "spawn_reporter",
    "start_reporter_thread",
    "tune_gc",
]


# -- settings across exec ----------------------------------------------------------------------
def settings_to_json(settings: ReporterSettings) -> str:
    return orjson.dumps(dataclasses.asdict(settings)).decode()


def settings_from_json(text: str | bytes) -> ReporterSettings:
    """The settings in ``text`` (a JSON object), checked: see :func:`settings_from_mapping`."""
    data = orjson.loads(text)
    if not isinstance(data, dict):
        raise ValueError("reporter settings must be a JSON object")
    return settings_from_mapping(data)


# -- the reporter process ----------------------------------------------------------------------
def run_reporter_process(
    arena_path: str, settings: ReporterSettings, owner_pid: int, restarts: int = 0, supervisor_pid: int = 0
) -> int:
    """Body of the reporter process: open the arena, run the loop, return the exit status."""
    mark_reporter_process()
    # A stop signal during start-up (the reporter's modules are imported only now, which
    # takes a while) means "stop", not "die": the supervisor forwards SIGTERM at once when
    # a short-lived owner is already gone, and a reporter killed then drains nothing.
    early: list[str] = []

    def stop_early(signum: int, _frame: object) -> None:
        early.append(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, stop_early)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a terminal hang-up is not ours to act on
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    set_process_title(f"swmp-reporter [{settings.service}] arena={arena_path}")
    tune_gc()
    try:
        arena = Arena.open(arena_path)
    except (OSError, ArenaError) as exc:
        if owner_pid > 0 and not process_alive(owner_pid, 0):
            return EXIT_OK  # the application is gone and took its arena along
        log.error("reporter cannot open %s: %s", arena_path, exc)
        return EXIT_ERROR
    try:
        from reporter_proc.loop import Reporter  # noqa: PLC0415 (see the imports)

        reporter = Reporter(
            arena,
            settings,
            mode="process",
            owner_pid=owner_pid,
            restarts=restarts,
            supervisor_pid=supervisor_pid,
        )
        if early:
            reporter.request_stop(early[0])  # taken up as soon as its loop runs
        return _run_loop(reporter.run())
    finally:
        arena.close()


def _fork_reporter(
    arena_path: str, settings: ReporterSettings, owner_pid: int, restarts: int, close_fds: tuple[int, ...]
) -> int:
    pid = os.fork()
    if pid:
        return pid
    _reporter_child(arena_path, settings, owner_pid, restarts, close_fds)


def _reporter_child(
    arena_path: str, settings: ReporterSettings, owner_pid: int, restarts: int, close_fds: tuple[int, ...]
) -> NoReturn:
    code = EXIT_ERROR
    try:
        reset_signals()
        for fd in close_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        # Our parent is the supervisor: the reporter watches it and replaces it if it dies.
        code = run_reporter_process(arena_path, settings, owner_pid, restarts, supervisor_pid=os.getppid())
    except BaseException:
        with contextlib.suppress(Exception):
            log.exception("reporter process failed")
    finally:
        _flush_std()
        os._exit(code)


def run_supervisor(arena_path: str, settings: ReporterSettings, owner_pid: int, adopt: int = 0) -> int:
    """Body of the supervisor process (also what ``python -m reporter_proc`` runs).

    ``adopt``: the pid of a running reporter to supervise first (a replacement supervisor,
    started by that reporter after its own supervisor was killed).
    """
    mark_reporter_process()
    set_process_title(f"swmp-supervisor [{settings.service}] arena={arena_path}")
    return Supervisor(
        arena_path,
        settings,
        owner_pid,
        fork_reporter=_fork_reporter,
        adopt=adopt,
        still_reporter=lambda pid: _arena_names_reporter(arena_path, pid),
    ).run()


def _arena_names_reporter(arena_path: str, pid: int) -> bool:
    """Does the arena's status block still name ``pid`` as its reporter? A reporter that
    ends cleanly clears it; one that was killed cannot."""
    try:
        with Arena.open(arena_path, wait_s=0) as arena:
            return arena.status.snapshot().reporter_pid == pid
    except (OSError, ArenaError):
        return False  # the arena is gone: the application ended


def python_executable() -> str:
    """A Python interpreter to exec (embedded in uWSGI, ``sys.executable`` is uWSGI)."""
    exe = sys.executable
    if exe and os.path.basename(exe).startswith("python"):
        return exe
    base = getattr(sys, "_base_executable", "")
    if base and os.path.basename(base).startswith("python"):
        return str(base)
    found = shutil.which(f"python{sys.version_info[0]}.{sys.version_info[1]}") or shutil.which("python3")
    return found or exe


def respawn_supervisor(arena_path: str, settings: ReporterSettings, owner_pid: int) -> int:
    """Start a supervisor that adopts this (reporter) process: its own was killed.

    Exec'd, not forked: this process runs an event loop and network clients that must not
    be duplicated. The settings go through a pipe (they may hold a token: never in argv).
    Returns the new supervisor's pid; raises OSError if it could not be started.
    """
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    argv = [
        python_executable(),
        "-m",
        "reporter_proc",
        "--arena",
        arena_path,
        "--owner-pid",
        str(owner_pid),
        "--adopt",
        str(os.getpid()),
        "--settings-stdin",
    ]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, env=env, close_fds=True)
    assert proc.stdin is not None
    try:
        proc.stdin.write(settings_to_json(settings).encode())
    finally:
        proc.stdin.close()
    return proc.pid


# -- spawning from the application -------------------------------------------------------------
def spawn_reporter(
    arena_path: str,
    settings: ReporterSettings,
    owner_pid: int,
    *,
    detach: bool = False,
    stdio_to_devnull: bool = False,
) -> int:
    """Fork the reporter (through its supervisor) from the application's master.

    Call it before the master has threads, event loops or network clients, from the main
    thread. Returns the pid of the forked process (the supervisor, or the reporter itself
    with ``settings.supervise=False``), or -1 if it could not be started (logged).

    ``detach=True`` double-forks into a new session, so the reporter belongs to no process of
    the application (the agent always asks for it: a worker that started it may die, uWSGI
    lazy-apps; a program that reaps every child until none is left would wait for it); the
    owner is watched by pidfd only. ``stdio_to_devnull``: the supervisor and the reporter
    write their standard output and error to ``/dev/null`` (started for a daemon, which lets
    go of the streams it was started with).
    """
    main_thread = threading.current_thread() is threading.main_thread()
    if not main_thread and not detach:
        # PR_SET_PDEATHSIG follows the forking *thread*: it would fire when this thread ends.
        log.warning("spawn_reporter called off the main thread; relying on the pidfd watch only")
    parent = os.getpid()
    rfd, wfd = os.pipe2(os.O_CLOEXEC) if detach else (-1, -1)
    set_forking(True)
    try:
        pid = os.fork()
    except OSError as exc:
        set_forking(False)
        log.error("cannot fork the reporter: %s", exc)
        if detach:
            os.close(rfd)
            os.close(wfd)
        return -1
    if pid == 0:
        _child_main(
            arena_path,
            settings,
            owner_pid,
            parent=parent,
            detach=detach,
            main_thread=main_thread,
            rfd=rfd,
            wfd=wfd,
            stdio_to_devnull=stdio_to_devnull,
        )
    set_forking(False)
    if not detach:
        return pid
    os.close(wfd)
    try:
        with os.fdopen(rfd, "rb") as r:
            data = r.read()
    finally:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # the intermediate exits at once (an application reaper may beat us)
    try:
        return int(data)
    except ValueError:
        log.error("the detached reporter did not start")
        return -1


def _child_main(
    arena_path: str,
    settings: ReporterSettings,
    owner_pid: int,
    *,
    parent: int,
    detach: bool,
    main_thread: bool,
    rfd: int,
    wfd: int,
    stdio_to_devnull: bool = False,
) -> NoReturn:
    """Never returns: the end of every code path is ``os._exit``."""
    code = EXIT_ERROR
    try:
        set_forking(False)
        mark_reporter_process()
        reset_signals()
        close_inherited_sockets()
        lower_priority()
        if detach:
            os.close(rfd)
            os.setsid()
            grandchild = os.fork()
            if grandchild:
                os.write(wfd, str(grandchild).encode())
                os._exit(EXIT_OK)
            os.close(wfd)
        elif main_thread:
            set_pdeathsig(signal.SIGTERM)
            # The owner may have died before prctl took effect: the pidfd watch (opened
            # next, in the supervisor and the reporter) notices at once either way.
            if os.getppid() != parent:
                log.info("owner %d died while the reporter was starting", owner_pid)
        # Never read here; held, the application's stdin pipe would keep its writer from
        # seeing the application's exit (EPIPE, EOF on a socket) until the final drain.
        release_stdin()
        if stdio_to_devnull:
            release_std_streams()
        if settings.supervise:
            code = run_supervisor(arena_path, settings, owner_pid)
        else:
            code = run_reporter_process(arena_path, settings, owner_pid)
    except BaseException:
        with contextlib.suppress(Exception):
            log.exception("reporter start-up failed")
    finally:
        _flush_std()
        os._exit(code)


def close_inherited_sockets() -> int:
    """Close the sockets the reporter inherited from the application (listeners, clients).

    The reporter is forked from the server's master, which under uWSGI has already bound
    its listening sockets. Holding them would keep the port open while the reporter flushes
    after the server stopped, and could confuse the server's own socket accounting. The
    reporter opens its own connections after fork; standard streams are left alone.
    """
    closed = 0
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return 0
    for fd in fds:
        if fd <= 2:
            continue
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)
                closed += 1
        except OSError:
            pass
    return closed
