"""Room in the file system for the arena's pages, taken before they are touched.

The arena is a sparse file on a tmpfs (``/dev/shm`` by default). A page of it gets its memory
when it is first touched through the mapping, and when the tmpfs is full (a container's
default ``/dev/shm`` is 64 MiB, shared with everything else in it) that touch does not fail
in any way a program can handle: the kernel sends SIGBUS and the process dies, here a worker
in the middle of a request. ``fallocate(2)`` takes the same room and fails with ENOSPC
instead. So:

* the parts every process touches (the header and each slot's control block) get their
  room when the arena is created (``reserve_fixed_parts``); an arena that cannot is not
  created;
* a ring's data area gets its room a stretch at a time, ahead of the writer
  (:class:`RingRoom`): the writer never writes past what was reserved, and a record that
  would needs room first; without it, the record is dropped and counted like any record
  that does not fit. The reader only reads what the writer wrote.

A ring whose pages are never freed (too small for the page returner, or on a file system
that cannot punch holes) is reserved once round and then costs nothing more: after one
whole lap with nothing freed behind it, every page is known to be backed. The page returner
(``ring_pages.py``) frees the pages the reader is done with; those come back into use a lap
later, so freeing moves the reserved frontier back to where they start again.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from typing import Any

from ipc import _layout as L

EVERYTHING = 1 << 62  # a frontier past any position: the whole ring is backed
RETRY_SECONDS = 0.1  # after a refusal, records are dropped without a system call for this long
_now = time.monotonic


def reserve(fd: int, offset: int, length: int) -> None:
    """Give the file's bytes [offset, offset + length) their memory now; OSError (ENOSPC) if
    the file system has no room for them."""
    if length > 0:
        os.posix_fallocate(fd, offset, length)


def reserve_fixed_parts(fd: int, slots: int, capacity: int) -> None:
    """The header and every slot's control block: touched by every process, writers, reader
    and the command-line tools alike."""
    reserve(fd, 0, L.SLOTS_OFFSET)
    for slot in range(slots):
        reserve(fd, L.SLOTS_OFFSET + slot * L.slot_stride(capacity), L.CONTROL_SIZE)


class RingRoom:
    """The reserved frontier of one ring's data area, kept by its writer (lock held).

    ``reserved`` is a logical ring position: every position from the writer's tail up to it
    has its page backed. ``fd_of()`` gives the arena's descriptor in the calling process,
    ``data_offset`` is where the data area starts in the file, ``stretch`` how far ahead one
    reservation goes (a power of two dividing ``capacity``), ``tail`` where the writer starts.
    """

    __slots__ = ("_cap", "_fd_of", "_freed_below", "_offset", "_refused_at", "_start", "_stretch", "reserved")

    def __init__(
        self, fd_of: Callable[[], int], data_offset: int, capacity: int, *, stretch: int, tail: int
    ) -> None:
        self._fd_of = fd_of
        self._offset = data_offset
        self._cap = capacity
        self._stretch = stretch
        self._start = tail  # positions reserved without a gap since here
        self._freed_below = 0  # the page returner freed positions below this
        self._refused_at = -RETRY_SECONDS
        self.reserved = tail

    def freed(self, start: int, end: int) -> None:
        """The pages of positions [start, end) were freed: in use again from start + capacity."""
        self.reserved = min(self.reserved, start + self._cap)
        self._freed_below = max(self._freed_below, end)

    def make(self, end: int) -> bool:
        """Reserve up to position ``end`` (at least); False when there is no room now."""
        if end <= self.reserved:
            return True
        now = _now()
        if now - self._refused_at < RETRY_SECONDS:
            return False
        target = (end + self._stretch - 1) & -self._stretch
        try:
            self._reserve(self.reserved, target)
        except OSError:
            self._refused_at = now
            return False
        self.reserved = target
        if target >= max(self._start, self._freed_below) + self._cap:
            self.reserved = EVERYTHING  # a whole lap backed and nothing freed since
        return True

    def _reserve(self, start: int, end: int) -> None:
        cap, fd = self._cap, self._fd_of()
        end = min(end, start + cap)  # one lap covers every page
        while start < end:  # the range may wrap round the end of the data area
            offset = start & (cap - 1)
            length = min(end - start, cap - offset)
            reserve(fd, self._offset + offset, length)
            start += length


def weak_call(descriptor: Callable[[Any], int], owner: Any) -> Callable[[], int]:
    """``descriptor(owner)``, or -1 once ``owner`` is gone. Weak: a descriptor number
    outlives its file once closed, and may by then name another file."""
    ref = weakref.ref(owner)

    def fd_of() -> int:
        alive = ref()
        return -1 if alive is None else descriptor(alive)

    return fd_of
