"""Byte-range locks that the kernel releases when their holder dies.

A slot or the reporter role is *owned* by holding a POSIX record lock on one byte of the
arena file. The kernel drops the lock when the holder exits, however it exits (SIGKILL
included), and a lock is never inherited across ``fork()``. That gives claim and reclaim
with no shared-memory compare-and-swap, no dependence on a lock a dead process could hold,
and no confusion when a pid is reused.

Caveat inherent to POSIX locks: closing *any* descriptor of the file in the holding process
releases its locks, so an arena keeps one descriptor open for its whole life.
"""

from __future__ import annotations

import fcntl
import os
import struct

# struct flock on Linux x86-64 / aarch64: short l_type, short l_whence, off_t l_start,
# off_t l_len, pid_t l_pid (+ padding to 32 bytes).
_FLOCK = struct.Struct("hhqqi4x")


def try_lock(fd: int, offset: int) -> bool:
    """Take an exclusive lock on one byte without waiting; False if someone else holds it."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset, os.SEEK_SET)
    except OSError:
        return False
    return True


def lock_wait(fd: int, offset: int) -> bool:
    """Take an exclusive lock on one byte, waiting for its holder; False on error."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX, 1, offset, os.SEEK_SET)
    except OSError:
        return False
    return True


def unlock(fd: int, offset: int) -> None:
    try:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset, os.SEEK_SET)
    except OSError:
        pass


def holder(fd: int, offset: int) -> int | None:
    """Pid of the process holding the lock on ``offset``, or None if nobody (else) does.

    A process never sees its own locks here (they do not conflict with itself).
    """
    query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    except OSError:
        return None
    l_type, _whence, _start, _len, pid = _FLOCK.unpack(answer)
    if l_type == fcntl.F_UNLCK:
        return None
    return int(pid)
