"""Agent start and stop: arena, reporter, instrumentation, fork hooks.

Order matters and is the point of this module. In the process that owns the application
(the prefork master, or a single-process app):

1. load config (done by the caller) and clean up arenas left by dead applications;
2. create the arena, or attach to the one this master already has (uWSGI reloads re-exec
   the master with the same pid; ``lazy-apps`` imports the app in every worker);
3. fork the reporter - before this process has any thread, event loop or network client,
   and only if no live reporter already holds the arena's reporter lock;
4. install the ring sink, instrumentation and fork hooks.

Workers never run any of this again after fork: they inherit the agent and claim a ring
slot (``swmp._runtime``). With ``SW_AGENT_REPORTER_PROCESS=false`` step 3 becomes a reporter
thread in this process, and each forked child starts its own (no thread crosses a fork).
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

import ipc
from swmp import _sink
from swmp._runtime import ArenaSink
from swmp.config import Config, parse_instance_properties

log = logging.getLogger("swmp.agent")

_state_lock = threading.Lock()


@dataclass
class _Running:
    config: Config
    arena: ipc.Arena
    sink: ArenaSink
    mode: str  # "process" | "thread"
    owner_pid: int
    started_pid: int
    reporter_pid: int | None = None
    thread_handle: Any = None


_running: _Running | None = None
_hooks_registered = False


def running() -> bool:
    return _running is not None


def current() -> _Running | None:
    return _running


def _server_position() -> tuple[int, bool]:
    """``(owner pid, started inside a worker)`` for the server we run in.

    The owner is the process whose life bounds the application: the prefork master. When
    the agent starts inside a worker (uWSGI ``lazy-apps``, or an explicit start in a module
    that only workers import), the owner is the master and the reporter must be detached
    from the worker that happened to start it.
    """
    uwsgi = sys.modules.get("uwsgi")
    if uwsgi is not None:
        try:
            worker_id = int(uwsgi.worker_id())
            master = int(uwsgi.masterpid()) or os.getpid()
            return master, worker_id > 0
        except Exception:
            pass
    if "gunicorn" in sys.modules and _in_gunicorn_worker():
        # Without --preload a gunicorn worker imports the application itself: the agent
        # starts in the worker and the master is its parent.
        return os.getppid(), True
    return os.getpid(), False


def _in_gunicorn_worker() -> bool:
    """True when the call stack runs inside a gunicorn worker's init (app import)."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name in ("init_process", "load_wsgi") and "gunicorn" in frame.f_code.co_filename:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _instance_base(config: Config, owner_pid: int) -> str:
    if config.agent_instance_name:
        return config.agent_instance_name
    try:
        host = socket.gethostname()
    except OSError:
        host = "localhost"
    return f"{host}-{owner_pid}"


def _meta(config: Config, owner_pid: int, base: str, mode: str) -> bytes:
    return orjson.dumps(
        {
            "service": config.service_name,
            "namespace": config.agent_namespace,
            "instance": base,
            "protocol": config.agent_protocol,
            "backends": list(config.backends),
            "authentication": "****" if config.agent_authentication else "",
            "mode": mode,
            "pid": owner_pid,
        }
    )


def start(config: Config) -> None:
    """Start the agent in this process. Idempotent; never raises into the application."""
    global _running
    with _state_lock:
        if _running is not None:
            return
        try:
            _running = _start(config)
        except Exception:
            log.exception("swmp: the agent could not start; the application runs without it")
            _running = None


def _start(config: Config) -> _Running:
    import swmp.tracing as tracing

    tracing.configure(config)
    use_process = config.agent_reporter_process and hasattr(os, "fork")
    owner_pid, in_worker = _server_position() if use_process else (os.getpid(), False)
    mode = "process" if use_process else "thread"
    base = _instance_base(config, owner_pid)
    directory = config.agent_arena_dir
    os.makedirs(directory, exist_ok=True)
    try:
        ipc.cleanup_stale(directory)
    except OSError:
        log.debug("stale arena cleanup failed", exc_info=True)

    if use_process:
        path = ipc.arena_path(owner_pid, directory)
    else:
        # One private arena per process: the reporter thread drains only this process.
        path = ipc.arena_path(os.getpid(), directory).replace(".arena", f"-{uuid.uuid4().hex[:8]}.arena")
    arena = ipc.Arena.create_or_open(
        path,
        slots=config.agent_arena_slots if use_process else 1,
        ring_capacity=config.agent_ring_size,
        meta=_meta(config, owner_pid, base, mode),
        owner_pid=owner_pid,
    )
    settings = config.to_reporter_settings()
    run = _Running(
        config=config,
        arena=arena,
        sink=ArenaSink(
            arena,
            config.service_name,
            base,
            config.agent_namespace,
            parse_instance_properties(config),
        ),
        mode=mode,
        owner_pid=owner_pid,
        started_pid=os.getpid(),
    )
    if use_process:
        from reporter_proc.process import spawn_reporter

        if arena.reporter_pid() is None:
            run.reporter_pid = spawn_reporter(path, settings, owner_pid, detach=in_worker)
        else:
            log.info("swmp: a reporter already serves %s; attaching to it", path)
    else:
        from reporter_proc.process import start_reporter_thread

        run.thread_handle = start_reporter_thread(path, settings)

    _sink.set_sink(run.sink)
    if not use_process or in_worker or owner_pid != os.getpid():
        run.sink.rebind()  # this process writes right away (and names its instance)
    _install_instrumentation(config)
    _register_fork_hooks()
    atexit.register(_at_exit)
    log.info(
        "swmp: agent started (service=%s, mode=%s, protocol=%s, arena=%s)",
        config.service_name,
        mode,
        config.agent_protocol,
        path,
    )
    return run


def _install_instrumentation(config: Config) -> None:
    try:
        from swmp.instrument import install_all

        install_all(config)
    except Exception:
        log.exception("swmp: installing instrumentation failed; tracing continues without it")
    if config.agent_log_reporter_active:
        try:
            from swmp.logs import install_log_reporter

            install_log_reporter(config)
        except ImportError:
            pass
        except Exception:
            log.exception("swmp: the log reporter could not be installed")
    if config.agent_meter_reporter_active:
        try:
            from swmp.meters import start_meter_reporter

            start_meter_reporter(config)
        except ImportError:
            pass
        except Exception:
            log.exception("swmp: the meter reporter could not be started")


def _after_fork_in_child() -> None:
    """A new process: claim our own slot (process mode) or start our own reporter (thread mode)."""
    run = _running
    if run is None:
        return
    try:
        if run.mode == "process":
            run.sink.rebind()
        else:
            _restart_thread_mode_in_child(run)
    except Exception:
        log.exception("swmp: after-fork setup failed in pid %d", os.getpid())


def _restart_thread_mode_in_child(run: _Running) -> None:
    """Thread mode: the parent's reporter thread did not cross the fork; start ours."""
    global _running
    _running = None
    try:
        run.arena.close()
    except Exception:
        pass
    _sink.set_sink(None)
    start(run.config)


def _register_fork_hooks() -> None:
    global _hooks_registered
    if _hooks_registered:
        return
    _hooks_registered = True
    os.register_at_fork(after_in_child=_after_fork_in_child)
    if "uwsgi" in sys.modules:
        try:
            import uwsgidecorators

            uwsgidecorators.postfork(_after_fork_in_child)
        except Exception:
            # Without uwsgidecorators the per-write pid check still notices the fork.
            log.debug("uwsgidecorators.postfork unavailable", exc_info=True)


def _at_exit() -> None:
    run = _running
    if run is None:
        return
    try:
        _flush_in_process_reporters()
        if run.mode == "process":
            run.sink.leave()
            if os.getpid() == run.owner_pid and run.started_pid == os.getpid():
                # The owner leaves: the reporter notices through its pidfd, drains and
                # unlinks the arena. Nothing to wait for here.
                pass
        else:
            run.sink.leave()
            if run.thread_handle is not None and os.getpid() == run.started_pid:
                run.thread_handle.stop(run.config.agent_reporter_shutdown_timeout)
                run.arena.unlink()
    except Exception:
        log.debug("swmp: exit hook failed", exc_info=True)


def _flush_in_process_reporters() -> None:
    """Give periodic in-process producers (meters) a chance to write their last report."""
    meters = sys.modules.get("swmp.meters")
    flush = getattr(meters, "flush", None)
    if callable(flush):
        try:
            flush()
        except Exception:
            pass


def stop() -> None:
    """Stop the agent in this process (tests, notebooks). The reporter process stays for the
    application's other processes; in thread mode the reporter thread flushes and stops."""
    global _running
    with _state_lock:
        run = _running
        if run is None:
            return
        _running = None
        _sink.set_sink(None)
        try:
            run.sink.leave()
            if run.mode == "thread" and run.thread_handle is not None:
                run.thread_handle.stop(run.config.agent_reporter_shutdown_timeout)
                run.arena.unlink()
        except Exception:
            log.debug("swmp: stop failed", exc_info=True)
