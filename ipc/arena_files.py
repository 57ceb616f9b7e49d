"""Finding arena files and removing the stale ones (owner gone, nobody holding a lock).

The arena file itself, its creation, attachment and locks are in ``ipc/arena.py``.
"""

from __future__ import annotations

import glob
import os
import stat
import time
from collections.abc import Callable, Iterator

from ipc import private
from ipc.arena import (
    DEFAULT_DIRECTORY,
    DEFAULT_PREFIX,
    Arena,
    ArenaError,
    ArenaInfo,
    _unlink_if_same,
    arena_unlink,
)
from ipc.procinfo import process_start_ticks


def discover(directory: str = DEFAULT_DIRECTORY, prefix: str = DEFAULT_PREFIX) -> Iterator[str]:
    """Arena files of the current user in its private directories in ``directory``, newest first."""
    paths = [p for d in private.private_directories(directory, prefix) for p in _arena_files(d, prefix)]
    paths.sort(key=_mtime, reverse=True)
    yield from paths


def _arena_files(directory: str, prefix: str, suffix: str = ".arena") -> list[str]:
    return glob.glob(os.path.join(glob.escape(directory), f"{prefix}-{os.getuid()}-*{suffix}"))


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def still_linked(arena: Arena) -> bool:
    """Is ``arena``'s file still at its path? False once it was unlinked (by its owner at
    exit, by the last reporter out) or replaced: what is written into it then is read by
    nobody (``swmp status`` finds arenas by their path)."""
    try:
        st = os.lstat(arena.path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == arena._shared.key


def _kept(keep: Callable[[Arena], bool] | None, arena: Arena) -> bool:
    if keep is None:
        return False
    try:
        return bool(keep(arena))
    except Exception:  # the caller's predicate: when it cannot say, the records stay
        return True


def read_info(path: str) -> ArenaInfo:
    with Arena.open(path, wait_s=0) as arena:
        return arena.info()


def _name_fields(path: str, prefix: str) -> tuple[int, str]:
    """``(owner pid, what follows it)`` of an arena file name, ``<prefix>-<uid>-<pid>[-<rest>].arena``
    (``rest``: the owner's start ticks for a process-mode arena, ``t<8 hex>`` for thread mode's
    private ones, ``""`` for none); pid 0 when the name has none."""
    parts = os.path.basename(path)[len(prefix) + 1 :].split("-")
    try:
        pid = int(parts[1].split(".")[0])
    except (IndexError, ValueError):
        return 0, ""
    return pid, parts[2].split(".")[0] if len(parts) > 2 else ""


def _name_owner_gone(path: str, prefix: str) -> bool:
    """Is the owner the file's name gives gone? Its pid is, or is another process's now: the
    name's start ticks, when it has them, are not those of the process with that pid (pids
    are reused, a container's within minutes)."""
    pid, rest = _name_fields(path, prefix)
    now = process_start_ticks(pid) if pid > 0 else 0
    if now == 0:
        return True
    if not rest.isdigit():
        return False  # no ticks in the name (a thread-mode arena): the pid alone says
    return int(rest) != now


def cleanup_stale(
    directory: str = DEFAULT_DIRECTORY,
    prefix: str = DEFAULT_PREFIX,
    min_age_s: float = 10.0,
    *,
    keep: Callable[[Arena], bool] | None = None,
) -> list[str]:
    """Remove arenas whose owner is dead and that nobody holds a lock on.

    "Nobody" means no reporter and no worker slot: an orphaned reporter still draining, or
    a worker that outlived its master, keeps the file alive. ``keep(arena)``, asked of each
    arena about to be removed, keeps those the caller will read instead (``ipc.adopt``: a
    dead process's private arena with records still unread); a ``keep`` that raises keeps
    the arena too. Files that cannot be read as arenas are removed only if older than
    ``min_age_s`` (a creator may be mid-way) and the owner their name gives is gone (its
    pid, or the start time of the process with that pid differs). Doorbell FIFOs whose
    arena is gone are removed too.
    Returns the removed arena paths.
    """
    removed = []
    for path in discover(directory, prefix):
        try:
            arena = Arena.open(path, wait_s=0)
        except (ArenaError, OSError):
            try:
                old = time.time() - _mtime(path) > min_age_s
                if old and _name_owner_gone(path, prefix):
                    arena_unlink(path)
                    removed.append(path)
            except OSError:
                pass
            continue
        try:
            dead = arena._replaceable() and not arena.own_slots() and not arena.is_reporter
            if dead and not _kept(keep, arena):
                _unlink_if_same(path, arena)
                removed.append(path)
        finally:
            arena.close()
    dirs = private.private_directories(directory, prefix)
    for fifo in [f for d in dirs for f in _arena_files(d, prefix, ".arena.wake")]:
        arena_file = fifo[: -len(".wake")]
        if not os.path.exists(arena_file):
            try:
                if stat.S_ISFIFO(os.lstat(fifo).st_mode):
                    os.unlink(fifo)
            except OSError:
                pass
    return removed
