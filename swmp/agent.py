"""Agent start and stop: arena, reporter, instrumentation, fork hooks.

Order matters and is the point of this module. In the process that owns the application
(the prefork master, or a single-process app):

1. load config (done by the caller) and clean up arenas left by dead applications;
2. create the arena, or attach to the one this application already has (uWSGI reloads
   re-exec the master with the same pid; ``lazy-apps`` and Gunicorn without ``--preload``
   import the app - and so start the agent - in every worker);
3. fork the reporter - before this process has any thread, event loop or network client,
   and only if no live reporter already holds the arena's reporter lock; detached (double
   fork, own session), so it is no child of the application's;
4. install the ring sink, instrumentation and fork hooks.

Workers inherit the agent and take their own ring after fork (``swmp._runtime``).
``multiprocessing``'s spawn children join the arena of the application that started them,
and its resource tracker and forkserver run no agent (``swmp._spawned``). With
``SW_AGENT_REPORTER_PROCESS=false`` there is no reporter process: every process that
reports starts a reporter thread for itself, after fork, never in a prefork master.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import ipc
from ipc.private import make_directories
from reporter_proc.adoption import kept_for_adoption
from reporter_proc.process import in_reporter_process, spawn_reporter, start_reporter_thread
from swmp import _own_logging, _sink, _spawned, lifecycle, tracing
from swmp._arena_meta import arena_meta
from swmp._arena_sink import ArenaSink
from swmp._runtime import ProcessSink
from swmp._server_position import server_position, uwsgi_daemonized_since
from swmp._thread_sink import ThreadSink
from swmp.config import Config, parse_instance_properties
from swmp.ops.locate import registry_path
from swmp.tracing.identity import identity

log = logging.getLogger("swmp.agent")

_state_lock = threading.Lock()

# A reporter starting in another process (the arena's creator) takes this long at most to
# take the reporter lock; an attacher waits that long before it starts one itself.
_REPORTER_START_GRACE_S = 3.0


@dataclass
class _Running:
    config: Config
    arena: ipc.Arena | None  # process mode: the drained arena; thread mode: the name registry
    sink: ProcessSink
    mode: str  # "process" | "thread"
    owner_pid: int
    started_pid: int
    arena_path: str = ""
    reporter_pid: int | None = None


_running: _Running | None = None
_exit_registered = False


def running() -> bool:
    return _running is not None


def current() -> _Running | None:
    return _running


def _instance_base(config: Config, owner_pid: int) -> str:
    if config.agent_instance_name:
        return config.agent_instance_name
    try:
        host = socket.gethostname()
    except OSError:
        host = "localhost"
    return f"{host}-{owner_pid}"


# -- start ---------------------------------------------------------------------------------
def start(config: Config) -> None:
    """Start the agent in this process. Idempotent; never raises into the application."""
    _start_guarded(config)


def _start_guarded(config: Config, *, in_daemon: bool = False) -> None:
    global _running
    if in_reporter_process():
        return  # the reporter is forked from an application that runs the agent
    if _spawned.runs_no_application():
        # multiprocessing's resource tracker or forkserver: no agent; the forkserver's
        # children run application code and start it when forked (swmp._spawned).
        _spawned.start_in_forkserver_children(lambda: start(config), _at_exit)
        return
    with _state_lock:
        if _running is not None:
            return
        # Before the reporter is forked or its thread started, so both inherit the level.
        _own_logging.apply(config)
        try:
            _running = _start(config, in_daemon=in_daemon)
        except _Unusable as exc:  # a setting's fault: said plainly, no traceback to report
            log.error("swmp: the agent could not start: %s; the application runs without it", exc)
            _running = None
            _own_logging.restore()
        except Exception:
            log.exception("swmp: the agent could not start; the application runs without it")
            _running = None
            _own_logging.restore()


class _Unusable(Exception):
    """A setting the agent cannot start with (the message names it)."""


def _start(config: Config, *, in_daemon: bool = False) -> _Running:
    tracing.configure(config)
    use_process = config.agent_reporter_process and hasattr(os, "fork")
    mode = "process" if use_process else "thread"
    owner_pid, in_worker = server_position()
    directory = config.agent_arena_dir
    try:
        if not directory:  # (abspath would make it the current directory)
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), directory)
        make_directories(directory)  # 0700: never world-writable, whatever the umask
        if not os.path.isdir(directory):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), directory)
    except OSError as exc:  # (empty, a file, under /proc, not ours to write, a foreign link)
        why = "a file, not a directory" if isinstance(exc, FileExistsError) else exc.strerror or str(exc)
        raise _Unusable(f"SW_AGENT_ARENA_DIR={directory!r} cannot be used ({why})") from None
    # A multiprocessing child of an application that runs the agent joins its arena and
    # reporter; it takes a slot when it first records (swmp._spawned). A server worker that
    # is one (Sanic's, spawned by the main process) is named now, as a forked worker is.
    joined = _spawned.owner_to_join(lambda pid: _arena_file(pid, directory, use_process))
    bind_now = in_worker and joined in (0, owner_pid)
    if joined:
        owner_pid, in_worker = joined, True
    base = _instance_base(config, owner_pid)
    if not in_worker:
        # Only before this process holds any lock on an arena: cleanup opens and closes
        # arena files, and closing a descriptor drops the process's locks on that file.
        # In thread mode a killed process's private arena with records still unread is kept
        # for this process's reporter thread, which adopts and delivers it (ipc.adopt).
        keep = None if use_process else kept_for_adoption(arena_meta(config, owner_pid, base, mode))
        try:
            ipc.cleanup_stale(directory, keep=keep)
        except OSError:
            log.debug("stale arena cleanup failed", exc_info=True)
    props = parse_instance_properties(config)
    settings = config.to_reporter_settings()
    path = _arena_file(owner_pid, directory, use_process)
    if use_process:
        arena = ipc.Arena.create_or_open(
            path,
            slots=config.agent_arena_slots,
            ring_capacity=config.agent_ring_size,
            meta=arena_meta(config, owner_pid, base, mode),
            owner_pid=owner_pid,
        )
        sink: ProcessSink = ArenaSink(
            arena,
            config.service_name,
            base,
            namespace=config.agent_namespace,
            properties=props,
            owner_pid=owner_pid,
        )
        run = _Running(config, arena, sink, mode, owner_pid, os.getpid(), arena_path=path)
        if _needs_reporter(arena):
            # Detached (no child of ours): a program reaping every child until ECHILD would
            # wait for the supervisor, which waits for the program. Owner watched by pidfd.
            # In a daemon: not the streams it was started with, which it lets go of.
            pid = spawn_reporter(path, settings, owner_pid, detach=True, stdio_to_devnull=in_daemon)
            run.reporter_pid = pid if pid > 0 else None
        else:
            run.reporter_pid = arena.reporter_pid()
            log.info("swmp: reporter %s already serves %s; attaching to it", run.reporter_pid, path)
    else:
        # The shared arena only names the processes (its slot locks); each process drains
        # its own private arena on its own thread. Tiny rings: nothing is written there.
        registry: ipc.Arena | None
        try:
            registry = ipc.Arena.create_or_open(
                path, slots=config.agent_arena_slots, ring_capacity=4096, owner_pid=owner_pid
            )
        except (OSError, ipc.ArenaError) as exc:
            log.warning("swmp: no instance-name registry (%s); processes are named by pid", exc)
            registry = None

        def start_thread(arena_path: str, s: Any, arena: ipc.Arena) -> Any:
            return start_reporter_thread(arena_path, s, arena=arena)

        sink = ThreadSink(
            registry,
            settings,
            start_thread,
            arena_dir=directory,
            ring_capacity=config.agent_ring_size,
            meta=arena_meta(config, owner_pid, base, mode, os.path.basename(path) if registry else ""),
            service=config.service_name,
            instance_base=base,
            namespace=config.agent_namespace,
            properties=props,
            owner_pid=owner_pid,
            on_started=_exit_first,
        )
        run = _Running(config, registry, sink, mode, owner_pid, os.getpid(), arena_path=path)

    _sink.set_sink(run.sink)
    _spawned.publish(owner_pid, path)
    lifecycle.announce_owner(owner_pid)
    identity.set_binder(run.sink.rebind)
    if bind_now:
        run.sink.rebind()  # this process reports from now on (and is named now)
    elif lifecycle.prefork_master(owner_pid):
        run.sink.count_master_prestart()  # (a process that binds counts them then)
    _install_instrumentation(config)
    _install_profiling(config)
    _register_fork_hooks()
    _register_exit()
    log.info(
        "swmp: agent started (service=%s, mode=%s, protocol=%s, arena=%s)",
        config.service_name,
        mode,
        config.agent_protocol,
        path,
    )
    return run


def _arena_file(owner_pid: int, directory: str, use_process: bool) -> str:
    """The application's shared arena; in thread mode the one that only names processes."""
    path = ipc.arena_path(owner_pid, directory)
    return path if use_process else registry_path(path)


def _needs_reporter(arena: ipc.Arena) -> bool:
    """Should this process start the reporter for ``arena``?

    The creator always does. An attacher does only when no live process holds the reporter
    lock, after giving a reporter that the creator is starting right now (uWSGI lazy-apps:
    workers race) time to take it. Should two start anyway, the second finds the lock taken
    and exits; exactly one drains.
    """
    if arena.created:
        return True
    if arena.reporter_pid() is not None:
        return False
    # The grace runs from the arena's creation (a wall-clock stamp), but is counted down on
    # the monotonic clock and never longer than the grace from now: a wall clock stepped
    # back after the creation must not hold this process's start for the size of the step.
    left = arena.info().created_ns / 1e9 + _REPORTER_START_GRACE_S - time.time()
    deadline = time.monotonic() + min(max(left, 0.0), _REPORTER_START_GRACE_S)
    while time.monotonic() < deadline:
        time.sleep(0.02)
        if arena.reporter_pid() is not None:
            return False
    return arena.reporter_pid() is None


def _install_instrumentation(config: Config) -> None:
    try:
        from swmp.instrument import install_all  # noqa: PLC0415 (imports instrumented libraries)

        install_all(config)
    except Exception:
        log.exception("swmp: installing instrumentation failed; tracing continues without it")
    if config.agent_meter_reporter_active:
        try:
            from swmp.meters import start_meter_reporter  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

            start_meter_reporter(config)
        except ImportError:
            pass
        except Exception:
            log.exception("swmp: the meter reporter could not be started")


def _install_profiling(config: Config) -> None:
    try:
        from swmp import profiling  # noqa: PLC0415

        profiling.install(config)
    except Exception:
        log.exception("swmp: profiling could not be set up; tracing continues without it")


# -- fork --------------------------------------------------------------------------------------
def _after_fork_in_child() -> None:
    """A new worker: take its own ring and name now rather than on its first record.

    Subscribed to ``swmp.lifecycle``'s fork moment, which is never announced in the
    reporter or its supervisor.
    """
    global _state_lock
    _state_lock = threading.Lock()  # another thread of the parent may have held it
    run = _running
    if run is not None and lifecycle.daemonized():
        _start_anew_in_daemon(run)
        return
    if run is not None and uwsgi_daemonized_since(run.owner_pid, lifecycle.owner_session()):
        # A worker of uWSGI's daemonized master: it joins (or makes) the master's arena and
        # reporter, as under lazy-apps; its streams are uWSGI's log, the reporter keeps them.
        _start_anew_in_daemon(run, streams_released=False)
        return
    if run is not None:
        identity.set_binder(run.sink.rebind)  # re-armed: the child names itself on first use
    if run is None or lifecycle.is_helper() or not lifecycle.prefork_server():
        # Helpers (forked by a worker: multiprocessing, subprocess with preexec_fn, which
        # runs these hooks and then execs, os.fork in request code; a Gunicorn master's forks
        # other than its workers, USR2's re-exec among them) stay inert: no slot, no
        # reporter thread, no arena, nothing that touches the parent's gRPC channel. Other
        # forks outside a prefork server take their ring on their first record, if ever.
        return
    try:
        run.sink.rebind()
    except Exception:
        log.exception("swmp: after-fork setup failed in pid %d", os.getpid())


def _start_anew_in_daemon(run: _Running, *, streams_released: bool = True) -> None:
    """This process is the daemon a double fork made of the application (Gunicorn's
    ``--daemon``, python-daemon's ``DaemonContext``) or a single one (the ``daemonize``
    package; ``swmp._daemonized``), or a worker of such a daemon that no Python hook saw
    being made (uWSGI's ``--daemonize2``). The owner it was forked from exits, and its
    reporter drains what is left and leaves with it: the agent starts here again as in a new
    application (its own arena, reporter and instance names; a uWSGI worker's are its
    master's, as under lazy-apps). Nothing is written to the old arena: this process never
    reported there. ``streams_released``: the daemon let go of the standard streams it was
    started with, so its reporter must not keep them (a uWSGI worker's are uWSGI's log)."""
    global _running
    _running = None
    _switch_off(run)
    _sink.take_prestart()  # the owner's count, copied by the fork: the owner reports it
    if run.arena is not None:
        try:
            if run.mode == "thread":
                # The owner's name registry, which its exit hook would remove: daemonizing
                # code ends the owner with os._exit. (Process mode: its reporter removes it.)
                run.arena.unlink()
            run.arena.close()  # our mapping only
        except Exception:
            log.debug("swmp: closing the owner's arena in its daemon failed", exc_info=True)
    lifecycle.start_as_owner()
    log.info(
        "swmp: pid %d is %s of pid %d's application; the agent starts anew",
        os.getpid(),
        "the daemon" if streams_released else "a worker of the daemon",
        run.owner_pid,
    )
    _start_guarded(run.config, in_daemon=streams_released)


def _start_anew_after_a_single_fork() -> None:
    """The sink found this process to be the daemon of a single fork (``swmp.lifecycle``)."""
    run = _running
    if run is not None:
        _start_anew_in_daemon(run)


def _register_fork_hooks() -> None:
    lifecycle.on_fork(_after_fork_in_child)
    lifecycle.on_daemonized(_start_anew_after_a_single_fork)
    _register_celery_worker_hooks()


def _register_celery_worker_hooks() -> None:
    """Celery pool children take their ring at start and leave cleanly (``swmp._celery_worker``),
    connected when (if ever) the application imports celery."""
    try:
        from swmp import _celery_worker  # noqa: PLC0415
        from swmp.instrument import _hook, _present  # noqa: PLC0415

        if _present("celery"):
            _hook.defer("celery", _celery_worker.connect, key="celery-worker")
    except Exception:
        log.debug("swmp: celery worker hooks unavailable", exc_info=True)


# -- exit ----------------------------------------------------------------------------------
def _register_exit() -> None:
    global _exit_registered
    if not _exit_registered:
        _exit_registered = True
        atexit.register(_at_exit)


def _exit_first() -> None:
    """Run our exit hook before the reporter thread's own (atexit runs last-registered
    first): this process's last records (a final meter report, the goodbye) must be in
    the ring before the thread's final flush."""
    global _exit_registered
    atexit.unregister(_at_exit)
    atexit.register(_at_exit)
    _exit_registered = True


def _at_exit() -> None:
    """Interpreter exit (a worker recycled or stopped, the app ending): leave cleanly.

    Runs in every process that inherited the agent. The reporter process is not told
    anything: it watches the owner and drains what is left when the owner is gone.
    """
    run = _running
    if run is None:
        return
    try:
        lifecycle.announce_leaving()  # in-process producers (meters) write their last records
        run.sink.leave(run.config.agent_reporter_shutdown_timeout, for_good=True)
    except Exception:
        log.debug("swmp: exit hook failed", exc_info=True)
    if run.mode == "thread" and run.arena is not None and os.getpid() == run.owner_pid:
        run.arena.unlink()  # the name registry; process mode: the reporter unlinks


def _stop_meters() -> None:
    """Meters off in this process: their thread, the PVM meters' gc callback (a later
    start() sets them up again with its own settings)."""
    meters = sys.modules.get("swmp.meters")
    if meters is not None:
        try:
            meters.stop_meter_reporter()
        except Exception:
            log.debug("swmp: stopping the meters failed", exc_info=True)


def _switch_off(run: _Running) -> None:
    """The agent's parts in this process off: the arena no longer published to the interpreters
    it starts, meters, the sink (records counted, not written), naming, profiling."""
    _spawned.withdraw(run.owner_pid, run.arena_path)
    _stop_meters()
    _sink.set_sink(None)
    identity.set_binder(None)
    _uninstall_profiling()


def _uninstall_profiling() -> None:
    profiling = sys.modules.get("swmp.profiling")
    if profiling is not None:
        profiling.uninstall()


def stop() -> None:
    """Stop the agent in this process (tests, notebooks).

    This process leaves (its instance goes away, in thread mode its reporter thread
    flushes and stops); a reporter process stays for the application's other processes
    and ends with the owner.
    """
    global _running
    with _state_lock:
        run = _running
        if run is None:
            return
        _running = None
        try:
            lifecycle.announce_leaving()  # as at exit: meters write their last report, first
        except Exception:
            log.debug("swmp: stop failed", exc_info=True)
        _switch_off(run)
        try:
            run.sink.leave(run.config.agent_reporter_shutdown_timeout)
        except Exception:
            log.debug("swmp: stop failed", exc_info=True)
        _own_logging.restore()
