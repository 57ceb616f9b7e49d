"""What a process forked from the application does to itself before it runs the reporter:
parent-death signal, title, priority, signal dispositions, std streams, the event loop's
run and the garbage collector's tuning; and, once the application has exited, letting go of
the standard output and error it inherited where they are pipes. Used by
``reporter_proc.process`` (supervisor and reporter processes), ``reporter_proc.supervisor``
and ``reporter_proc.lifecycle`` (owner death), ``reporter_proc.thread_mode`` (the loop's run).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import signal
import stat
import sys
from collections.abc import Coroutine
from typing import Any

from reporter_proc.role import in_reporter_process

log = logging.getLogger("swmp.reporter")


_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
REPORTER_NICE = 10  # added to the application's niceness (see lower_priority)


# -- process plumbing --------------------------------------------------------------------------
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def set_pdeathsig(sig: int) -> bool:
    """Ask the kernel to send ``sig`` when the thread that forked us dies (Linux)."""
    try:
        return bool(_libc().prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def set_process_title(title: str) -> None:
    """What ``ps`` shows (else a forked child looks like ``uwsgi --master``)."""
    try:
        import setproctitle  # noqa: PLC0415  (optional dependency)

        setproctitle.setproctitle(title)
    except ImportError:
        pass
    # Embedded in uWSGI, setproctitle cannot find argv; uWSGI exposes its own setter.
    uwsgi = sys.modules.get("uwsgi")
    setprocname = getattr(uwsgi, "setprocname", None)
    if callable(setprocname):
        try:
            setprocname(title)
        except Exception:
            pass
    try:  # the kernel's short name (top, /proc/PID/comm), 15 bytes at most
        name = title.split(" ", 1)[0].encode()[:15]
        _libc().prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def lower_priority() -> None:
    """Make the reporter (and its supervisor) yield the CPU to the application.

    Reporting is background work that needs a few percent of a core; when the machine is
    saturated, an equal-priority reporter waking every few milliseconds preempts request
    handling and shows up in the workers' tail latency (p99 68 ms vs 24 ms at nice 10 in
    benchmarks/prefork_bench.py on a saturated 2-core machine). At nice 10 it still gets
    ~10% of a core against one busy worker, several times what it needs.
    """
    with contextlib.suppress(OSError):
        os.nice(REPORTER_NICE)


def reset_signals() -> None:
    """Undo the signal state inherited from the application server.

    uWSGI children inherit HUP, INT, QUIT, PIPE, TERM and XFSZ as *ignored* (a plain
    ``kill`` would do nothing), Gunicorn's arbiter leaves its Python handlers and its
    wake-up fd behind; none of that may apply here. Everything goes back to the default,
    PIPE stays ignored (Python's own convention: sockets report EPIPE instead), and the
    blocked mask is cleared.
    """
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        target = signal.SIG_IGN if sig == signal.SIGPIPE else signal.SIG_DFL
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            signal.signal(sig, target)
    with contextlib.suppress(OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _to_devnull(fds: tuple[int, ...], flags: int) -> bool:
    """Point each of ``fds`` at ``/dev/null`` (opened with ``flags``); False if it cannot be
    opened. A closed one of them may be the number the open takes: it is then kept."""
    try:
        devnull = os.open(os.devnull, flags)
    except OSError:
        return False
    try:
        for fd in fds:
            if fd != devnull:
                with contextlib.suppress(OSError):
                    os.dup2(devnull, fd)
    finally:
        if devnull not in fds:
            os.close(devnull)
    return True


def release_stdin() -> None:
    """Point fd 0 at ``/dev/null``: a process forked to report never reads its stdin."""
    _to_devnull((0,), os.O_RDONLY)


def release_std_streams() -> None:
    """Point fds 1 and 2 at ``/dev/null``: a reporter started for a daemon (which gives up the
    terminal or pipes it was started with) must not keep holding them: a shell's ``$(...)``,
    an ``ssh`` session or ``subprocess.run(..., capture_output=True)`` would wait for it."""
    _flush_std()
    _to_devnull((1, 2), os.O_WRONLY)


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def release_std_pipes(owner_pid: int, *, announce: bool) -> tuple[str, ...]:
    """The application (``owner_pid``) has exited: stop holding the standard output and error
    inherited from it where they are pipes or FIFOs; returns what was let go of.

    A caller that reads the application's output to its end (``subprocess.run(...,
    capture_output=True)``, a shell's ``$(...)``, cron) would otherwise wait for the
    supervisor and the reporter too, which drain for up to the shutdown deadline after the
    application exited. While the application lives its pipes stay (the reporter's log lines
    go where the application's go); terminals, files and sockets (journald) are always kept:
    nobody waits for their end. Both now point at ``/dev/null``, so whatever is written to
    them later is lost. ``announce``: say so first in one line, while the pipe is still held.
    Only in the supervisor and reporter processes: never the streams of a process that hosts
    a supervisor or a reporter loop for another reason (thread mode, a test).
    """
    if not in_reporter_process():
        return ()
    held: list[tuple[int, str]] = []
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                held.append((fd, name))
        except OSError:
            continue
    if not held:
        return ()
    names = tuple(name for _, name in held)
    if announce:
        log.info(
            "owner %d exited; draining, but no longer writing to %s (a pipe: whoever reads the "
            "application's output to its end would wait for the reporter)",
            owner_pid,
            " and ".join(names),
        )
    _flush_std()
    return names if _to_devnull(tuple(fd for fd, _ in held), os.O_WRONLY) else ()


def _run_loop(coro: Coroutine[Any, Any, int], *, guarded: bool = False) -> int:
    """Run ``coro`` on a new plain selector loop (whatever policy the application set).

    ``guarded`` (thread mode, in the application's process): the loop is closed only while
    its descriptors are its own (``loopguard``): an application may close them and give their
    numbers to its own files; then the loop is abandoned and ``loopguard.DescriptorsLost``
    raised. The reporter's own process runs no application code after the fork: its loop is
    a plain one, without the guard's ``fstat`` before every wait.
    """
    import asyncio  # noqa: PLC0415 (only where a reporter runs)

    if not guarded:
        loop = asyncio.SelectorEventLoop()
        try:
            asyncio.set_event_loop(loop)
            return loop.run_until_complete(coro)
        finally:
            _close_loop(loop)

    from reporter_proc import loopguard  # noqa: PLC0415 (as asyncio)

    guarded_loop = loopguard.new_loop()
    intact: bool | None = None
    try:
        asyncio.set_event_loop(guarded_loop)
        return guarded_loop.run_until_complete(coro)
    except OSError as exc:  # the selector's wait: EBADF, or EINVAL on another kind of file
        intact = loopguard.release(guarded_loop)
        if intact:
            raise
        raise loopguard.DescriptorsLost(exc.errno or 0, "the event loop's descriptors were closed") from exc
    finally:
        if intact is None:
            intact = loopguard.release(guarded_loop)
        if intact:
            _close_loop(guarded_loop)
        else:
            asyncio.set_event_loop(None)


def _close_loop(loop: Any) -> None:
    import asyncio  # noqa: PLC0415 (only where a reporter runs)

    with contextlib.suppress(Exception):
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(loop.shutdown_asyncgens())
    asyncio.set_event_loop(None)
    loop.close()


def tune_gc() -> None:
    """Garbage-collector settings for a process that only runs the reporter.

    The reporter was forked from the application: ``gc.freeze()`` moves every inherited
    object out of the collector's sight (no scans of the application's heap, no
    copy-on-write faults from touching it). Its own data are acyclic lists that reference
    counting frees, while a batch in flight keeps ~100 k young containers alive; at the
    default threshold (700) the collector rescans them hundreds of times per batch,
    which doubled the decode cost in the benchmark. Not used in thread mode: the
    application's collector settings are not ours to change.
    """
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
