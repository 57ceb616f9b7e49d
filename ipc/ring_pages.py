"""Giving back to the system the pages of a ring that the reader is done with.

A ring's data area is a shared file mapping (tmpfs). Once the writer has gone round the ring
once, every page of it stays resident: one copy in RAM, but counted in the RSS of the worker
and of the reporter, and kept however quiet the worker becomes. So every ``capacity / 8``
bytes the writer (on its slow path, see ``ring_writer.py``) frees the pages the reader has
read since the last time, with ``madvise(MADV_REMOVE)``, which punches them out of the file
and out of every process's mapping. What stays resident is what is unread plus at most one
stretch: about 1 MiB of a 4 MiB ring at saturation, less at ordinary rates.

Why it is safe without any help from the reader: only pages wholly inside the logical
positions ``[tail - capacity, head)`` are freed. The reader has finished with them (it reads
``[head, tail)`` only, and publishes ``head`` after reading), and the writer's next use of
each of them is at its position + capacity, which is at or ahead of ``tail``. The writer
frees them with its lock held and before it writes, so a freed page it writes next comes
back as a zeroed page and is written as any other. A stale ``head`` only frees less.

The cost: at each stretch (128 KiB of a 4 MiB ring, ~160 segments) two system calls, one
that frees the pages read and one (``MADV_POPULATE_WRITE``, Linux 5.14+) that brings in the
next stretch in one go, which is cheaper than the page fault per 4 KiB the writer would
otherwise take as it comes round (the kernel hands out a zeroed page either way). Measured
in docs/performance.md: ~0.7 us per 800-byte record on this project's VM, where the kernel's
page recycling is slow. A file system that cannot free pages (``EOPNOTSUPP``) turns it off
for the ring; a kernel without ``MADV_POPULATE_WRITE`` only loses the prefetch.
"""

from __future__ import annotations

import logging
import mmap

log = logging.getLogger("ipc")

PAGE = mmap.PAGESIZE
# Rings smaller than this are not worth a system call: their pages are few.
MIN_CAPACITY = 256 * 1024
STRETCH_SHIFT = 5  # every capacity >> 5 bytes (128 KiB of a 4 MiB ring)
MADV_POPULATE_WRITE = 23


class PageReturner:
    """Frees the read pages of one ring: ``returner(tail, head)`` with the writer's lock held.

    ``mm`` is the mapping holding the ring, ``data_offset`` where the ring's data area starts
    in it (any alignment: only whole pages inside the range are freed), ``capacity`` its size.
    """

    __slots__ = ("_base", "_cap", "_mm", "_populate", "done", "stretch")

    def __init__(self, mm: mmap.mmap, data_offset: int, capacity: int) -> None:
        self._mm: mmap.mmap | None = mm
        self._base = data_offset
        self._cap = capacity
        self.stretch = capacity >> STRETCH_SHIFT
        self.done = 0  # logical position below which the pages were freed
        self._populate = True  # MADV_POPULATE_WRITE works here (until it fails once)

    @property
    def active(self) -> bool:
        return self._mm is not None

    def __call__(self, tail: int, head: int) -> None:
        if self._mm is None:
            return
        start = max(self.done, tail - self._cap)
        if head - start >= self.stretch:
            self.done = head
            if not self._each(start, head, mmap.MADV_REMOVE):
                # No hole punching on this file system (or the mapping is gone): the ring
                # stays resident, as it did before this existed.
                self._mm = None
                return
        if self._populate and not self._each(tail, tail + self.stretch, MADV_POPULATE_WRITE):
            self._populate = False  # an older kernel: the writer takes page faults instead

    def _each(self, start: int, end: int, advice: int) -> bool:
        """``madvise`` the whole pages of logical positions [start, end); False if it failed."""
        cap = self._cap
        while start < end:  # the range may wrap round the end of the data area
            offset = start & (cap - 1)
            length = min(end - start, cap - offset)
            if not self._advise(self._base + offset, length, advice):
                return False
            start += length
        return True

    def _advise(self, offset: int, length: int, advice: int) -> bool:
        first = -(-offset // PAGE) * PAGE  # whole pages only: the edges may hold unread bytes
        end = (offset + length) // PAGE * PAGE
        if end <= first or self._mm is None:
            return True
        try:
            self._mm.madvise(advice, first, end - first)
        except (OSError, ValueError) as exc:
            log.info("ring pages: madvise(%d) failed (%s); not tried again for this ring", advice, exc)
            return False
        return True


def page_returner(mm: mmap.mmap | None, data_offset: int, capacity: int) -> PageReturner | None:
    """A returner for a ring of ``capacity`` bytes at ``data_offset`` of ``mm``, or None when
    there is no mapping or the ring is too small to bother."""
    if mm is None or capacity < MIN_CAPACITY or not hasattr(mmap, "MADV_REMOVE"):
        return None
    return PageReturner(mm, data_offset, capacity)
