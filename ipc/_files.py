"""One descriptor per arena file per process, shared by every :class:`~ipc.Arena` on it.

POSIX record locks belong to the (process, file) pair, and closing *any* descriptor of a
file drops *all* of the process's locks on it. Two ``Arena`` objects on one file in one
process (the agent's worker and ``swmp status`` code, a reporter that calls ``read_info``)
would each open the file, and closing one would silently release the slot or reporter
lock the other holds. So every open goes through this registry: an already-open file is
reused (reference counted) and its descriptor is closed only when the last user closes.

Python's ``mmap`` keeps a ``dup()`` of the descriptor and closes it when the map is closed
or garbage collected, which drops the locks just the same. So the registry also owns the
one mapping of each file, closes it only when nobody in the process uses the file any
more, and keeps a mapping it cannot close (views still exported) alive for good rather
than let the garbage collector close it at some random later moment.

The registry also remembers which locks this process holds, since ``F_GETLK`` never
reports a process's own locks: without it a process could "claim" a slot it already
holds. Locks are not inherited across ``fork()``, so a child starts with an empty set.

A process may close the descriptors it did not open (billiard's ``close_open_fds`` in
Celery's embedded beat process, daemonizing code, in a forked child or in the very process
that opened them), and the number may then name another file of the application. Locking a
byte of that file would "claim" a slot another process holds (two writers on one ring),
reserving ring room there would grow it, and closing it would close someone else's file. So
every use checks the descriptor (:meth:`SharedFile.descriptor`) and opens the arena again
when the number no longer names it. The locks the process held went with the closed
descriptor (the kernel dropped them): its slot locks are taken again then, unless another
process claimed the slot in between (its writer then stops: ``arena._descriptor``).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from dataclasses import dataclass, field

from ipc import _layout as L
from ipc import _locks
from ipc.private import UnsafePathError

log = logging.getLogger("ipc")
_lock = threading.Lock()
_open: dict[tuple[int, int], SharedFile] = {}
_parked: list[object] = []  # descriptors and mappings we must never close


@dataclass(eq=False)
class SharedFile:
    fd: int
    key: tuple[int, int]
    path: str
    mm: mmap.mmap | None = None  # the process's one mapping of the file (see above)
    refs: int = 1
    pid: int = field(default_factory=os.getpid)
    slots: set[int] = field(default_factory=set)  # slot locks this process holds
    reporter: bool = False  # this process holds the reporter lock
    lock: threading.Lock = field(default_factory=threading.Lock)
    mm_pid: int = field(default_factory=os.getpid)  # the process that made the entry and map

    def descriptor(self) -> int:
        """``fd``, made sure to still name the file (see the module doc): opened again if it
        does not; -1 if that fails (every use then fails like a lock held by someone else,
        never on another file)."""
        fd = self.fd
        if fd < 0 or self._names_the_file(fd):
            return fd
        with _lock:
            if self.fd != fd:  # another thread opened it again meanwhile
                return self.fd
            self.fd = -1  # the old number is not ours any more: never close it
            try:
                new = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                return -1
            try:
                same = _key(os.fstat(new)) == self.key
            except OSError:
                same = False
            if not same:  # the path names another file now (the arena was replaced)
                os.close(new)
                return -1
            self.fd = new
            self._lock_held_slots_again(new)
            return new

    def _lock_held_slots_again(self, fd: int) -> None:
        """The slot locks this process held went with the closed descriptor: taken again, so
        that no other process claims a ring this one still writes, and the reporter still
        sees the slot held. One another process claimed in between is
        not ours any more: left out of ``slots``, and said once. (The reporter lock of a
        thread-mode reporter is taken again by that reporter when it restarts.)"""
        if self.pid != os.getpid():
            return  # a forked child: it held none (see held())
        for slot in sorted(self.slots):
            if not _locks.try_lock(fd, L.slot_lock_offset(slot)):
                self.slots.discard(slot)
                log.warning(
                    "ring slot %d of %s: claimed by another process after this one "
                    "(pid %d) closed its descriptor of the file; its records there may be refused",
                    slot,
                    self.path,
                    os.getpid(),
                )

    def _names_the_file(self, fd: int) -> bool:
        """Is ``fd`` still a descriptor of this file? Checked on every use (one ``fstat``;
        none is on a record's path), in the process that opened it too: a program that
        closes every descriptor it did not open (a daemon) may have the number name one of
        its own files, which the ring's room reservation (``posix_fallocate``) then grew by
        megabytes of zeros."""
        try:
            return _key(os.fstat(fd)) == self.key
        except OSError:
            return False

    def held(self) -> SharedFile:
        """This entry with the lock bookkeeping reset if we are a forked child."""
        pid = os.getpid()
        if self.pid != pid:
            self.pid = pid
            self.slots = set()
            self.reporter = False
        return self


def _key(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def register_new(fd: int, mm: mmap.mmap, path: str) -> SharedFile:
    """Register a descriptor this process just created the file at ``path`` with (``O_EXCL``)."""
    key = _key(os.fstat(fd))
    with _lock:
        entry = SharedFile(fd, key, path, mm)
        _open[key] = entry
        return entry


def open_existing(path: str) -> tuple[SharedFile, bool]:
    """The shared entry for ``path``: ``(entry, fresh)``; ``fresh`` if we opened it now.

    Raises OSError like ``os.open`` would; a symbolic link at ``path`` is never followed
    (``private.UnsafePathError``).
    """
    with _lock:
        try:
            entry = _open.get(_key(os.lstat(path)))
        except OSError:
            entry = None
        if entry is not None:
            entry.refs += 1
            return entry, False
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePathError(f"refusing {path}: it is a symbolic link") from None
            raise
        key = _key(os.fstat(fd))
        entry = _open.get(key)
        if entry is not None:
            # The path changed under us between stat and open and now names a file we
            # already have open. Closing this descriptor would drop our locks on it:
            # keep it open (one descriptor, once, in a race nobody should hit).
            _parked.append(fd)
            entry.refs += 1
            return entry, False
        entry = SharedFile(fd, key, path)
        _open[key] = entry
        return entry, True


def release(entry: SharedFile) -> None:
    """Drop one reference; the mapping and descriptor are closed with the last one."""
    with _lock:
        entry.refs -= 1
        if entry.refs > 0:
            return
        if _open.get(entry.key) is entry:
            del _open[entry.key]
        fd, entry.fd = entry.fd, -1
        inherited = entry.mm_pid != os.getpid()
        if fd >= 0 and not entry._names_the_file(fd):
            fd = -1  # an inherited number now naming another file: never close it
        mm, entry.mm = entry.mm, None
    if mm is not None and inherited:
        # The map holds a dup() of the parent's descriptor, which the child may have closed
        # (and the number be another file's now): closing the map would close that number.
        _parked.append(mm)
    elif mm is not None:
        try:
            mm.close()
        except BufferError:
            _parked.append(mm)  # views are still out there: never let it be collected
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def _after_fork_in_child() -> None:
    # Another thread may have held these at fork time; the child has only this thread.
    global _lock
    _lock = threading.Lock()
    for entry in _open.values():
        entry.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
