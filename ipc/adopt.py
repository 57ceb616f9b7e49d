"""Adopting the private arena a dead process left behind, so its unread records are read.

Thread mode gives each process that reports a private one-slot arena,
``<prefix>-<uid>-<pid>-t<8 hex>.arena`` in the user's private directory, drained by a thread of
that process. A process ended by a signal (``multiprocessing.Pool.terminate()``, a killed
worker) runs no exit handler: what its ring held and its thread had not yet committed stays in
the file. A live process *adopts* such an arena: it takes the arena's reporter lock - so of
several processes looking at once exactly one gets it, and the kernel gives it back if that one
dies too - reads the ring from its committed head like any reader, and unlinks the file once
it committed everything (:func:`finish`). A reader commits as it goes, so a later adopter (the
first died mid-way) starts where the first one stopped: nothing is read twice.

Knows nothing of what the records mean; the caller decides what to do with them.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

from ipc.arena import DEFAULT_PREFIX, Arena, ArenaError, _unlink_if_same, arena_unlink
from ipc.arena_files import _arena_files, _mtime, _name_fields, still_linked
from ipc.procinfo import process_exited

__all__ = ["adopt", "dead_private_arenas", "finish", "holds_unread"]

# Thread mode's private arenas: ``<prefix>-<uid>-<pid>-t<8 hex>.arena`` (``swmp._thread_sink``).
_PRIVATE_REST = re.compile(r"t[0-9a-f]{8}")
# A file that cannot be opened as an arena and whose owner is gone is removed after this long:
# before, it may be one its creator (a process just started, reusing a dead pid) is filling in.
DAMAGED_MIN_AGE_S = 10.0


def dead_private_arenas(directory: str, prefix: str = DEFAULT_PREFIX, *, zombies: bool = False) -> list[str]:
    """Private arenas in ``directory`` (a private directory itself, as ``private.private_directory``
    returns) whose owner, by the pid in the name, is no longer alive; this process's own
    arenas are never listed. One directory listing and a ``kill(pid, 0)`` per other process's
    arena: cheap enough for every reporter every few seconds. With ``zombies``, a process that
    exited but was not reaped yet counts as gone too (its locks are; a read of
    ``/proc/<pid>/stat`` each instead: for a last look, :func:`ipc.procinfo.process_exited`)."""
    me = os.getpid()
    out = []
    for path in _arena_files(directory, prefix):
        pid, rest = _name_fields(path, prefix)
        if not pid or pid == me or _PRIVATE_REST.fullmatch(rest) is None:
            continue
        if process_exited(pid) if zombies else not _exists(pid):
            out.append(path)
    return out


def holds_unread(arena: Arena, prefix: str = DEFAULT_PREFIX) -> bool:
    """Is ``arena`` a private arena whose ring holds records no reader committed: what
    :func:`adopt` would take and deliver? For ``cleanup_stale(keep=...)``, in a process about
    to start adopting: removing such a file at start-up lost what a killed process of the same
    application left. Never raises."""
    if _PRIVATE_REST.fullmatch(_name_fields(arena.path, prefix)[1]) is None:
        return False
    try:
        reader = arena.reader(0)
    except (IndexError, ValueError, OSError):  # a header that maps but makes no ring
        return False
    try:
        return reader.backlog() > 0
    finally:
        reader.release()


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: a process (another user's, under a reused pid) is there
        return True
    return True


def adopt(path: str, accept: Callable[[bytes], bool] | None = None) -> Arena | None:
    """Open the dead process's arena at ``path`` holding its reporter lock; None if it is not
    (or no longer) one to adopt: ``accept(meta)`` refuses its header's meta bytes (the caller's
    business: whose records they are), another process holds the lock (it adopts it), the
    owner in its header is alive, a process holds its slot, the file was removed or replaced,
    or it cannot be read as an arena (being created, damaged: removed once old enough). Never
    raises for what is in the file."""
    try:
        arena = Arena.open(path, wait_s=0)
    except (ArenaError, ValueError, OSError):
        _remove_if_damaged(path)
        return None
    try:
        if accept is not None and not accept(arena.info().meta):
            arena.close()
            return None
        if arena.own_slots() or not arena.try_become_reporter():
            arena.close()  # a live adopter has it (or this process holds a slot: never ours)
            return None
        # Checked under the lock: what was true before it may not be now.
        info = arena.info()
        owner_runs = info.owner_alive and not process_exited(info.owner_pid)
        if not still_linked(arena) or owner_runs or arena.live_slots():
            arena.close()
            return None
    except (ArenaError, ValueError, OSError):
        arena.close()
        return None
    return arena


def finish(arena: Arena, *, unlink: bool) -> None:
    """Let go of an adopted arena: with ``unlink``, remove the file first (it is read to the
    end), otherwise leave it for the next adopter (the records still in it are not ours to
    give up). Closing drops the reporter lock."""
    try:
        if unlink:
            _unlink_if_same(arena.path, arena)
    finally:
        arena.close()


def _remove_if_damaged(path: str) -> None:
    """A file at a private arena's name that does not open as an arena, of a dead owner:
    removed once older than :data:`DAMAGED_MIN_AGE_S`, so it does not stay for ever."""
    try:
        if time.time() - _mtime(path) > DAMAGED_MIN_AGE_S:  # in our private directory: ours
            arena_unlink(path)
    except OSError:
        pass
