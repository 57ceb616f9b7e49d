"""Giving back to the system the pages of a ring that the reader is done with.

A ring's data area is a shared file mapping (tmpfs). Once the writer has gone round the ring
once, every page of it would stay resident: one copy in RAM, counted in the RSS of the worker
and of the reporter, 4 MiB a worker by default whether it holds one unread record or a
thousand.

So at every *stretch* of the ring (capacity / 32: 128 KiB of a 4 MiB ring) the writer's slow
path (``ring_writer.py``) frees the whole pages the reader has read since the last stretch
with ``madvise(MADV_REMOVE)``, which punches them out of the file and out of every process's
mapping, and brings the next stretch in with one ``MADV_POPULATE_WRITE`` (cheaper than a page
fault per 4 KiB as the writer comes round). A ring then holds what is unread, the stretch
being written and the next one: memory follows the records in flight, not the ring's size.

Why at every rate: the kernel zeroes each page it hands out again, ~4 us a page on this
project's VM, ~1 us per KiB written, ~0.3 us a 300-byte segment (docs/performance.md). The
first version freed only for quiet writers (a stretch in a second or more), so a busy worker
kept its whole ring: +3 MiB of memory per busy worker to save that microsecond per KiB.

Why freeing is safe without any help from the reader: only pages wholly inside the logical
positions ``[tail - capacity, head)`` are freed. The reader has finished with them (it reads
``[head, tail)`` only, and publishes ``head`` after reading), and the writer's next use of
each of them is at its position + capacity, which is at or ahead of ``tail``. The writer
frees them with its lock held and before it writes, so a freed page it writes next comes
back as a zeroed page and is written as any other. A stale ``head`` only frees less.

A file system that cannot free pages (``EOPNOTSUPP``) turns it off for the ring; a kernel
without ``MADV_POPULATE_WRITE`` (before 5.14) only loses the prefetch.
"""

from __future__ import annotations

import logging
import mmap

log = logging.getLogger("ipc")

PAGE = mmap.PAGESIZE
# Rings smaller than this are not worth a system call: their pages are few.
MIN_CAPACITY = 256 * 1024
STRETCH_SHIFT = 5  # capacity >> 5: 128 KiB of a 4 MiB ring
MADV_POPULATE_WRITE = 23  # Linux 5.14+; not in Python's mmap module yet


class PageReturner:
    """Frees the read pages of one ring: ``returner(tail, head)``, writer's lock held.

    ``mm`` is the mapping holding the ring, ``data_offset`` where the ring's data area starts
    in it (any alignment: only whole pages inside a range are freed), ``capacity`` its size.
    """

    __slots__ = ("_base", "_cap", "_mark", "_mm", "_populate", "done", "stretch")

    def __init__(self, mm: mmap.mmap, data_offset: int, capacity: int) -> None:
        self._mm: mmap.mmap | None = mm
        self._base = data_offset
        self._cap = capacity
        self.stretch = capacity >> STRETCH_SHIFT
        self.done = 0  # logical position below which the pages were freed
        self._mark = -1  # tail when the current stretch began (-1: not yet seen)
        self._populate = True  # MADV_POPULATE_WRITE works here (until it fails once)

    @property
    def active(self) -> bool:
        return self._mm is not None

    def __call__(self, tail: int, head: int) -> tuple[int, int] | None:
        """Free what is due; the logical positions [start, end) whose pages were freed, if any
        (the writer's ``RingRoom`` reserves them again before they come back into use)."""
        if self._mm is None:
            return None
        if self._mark < 0 or tail < self._mark:  # the first look (or a tail that jumped back)
            self._mark = tail
            return None
        if tail - self._mark < self.stretch:  # a wrap or a full ring, inside a stretch
            return None
        self._mark = tail
        freed = None
        start = max(self.done, tail - self._cap)
        if head > start:
            self.done = head
            # Counted as freed even if it fails part-way: some pages may be gone.
            freed = (start, head)
            if not self._each(start, head, mmap.MADV_REMOVE):
                # No hole punching on this file system (or the mapping is gone): the
                # ring stays resident, as it did before this existed.
                self._mm = None
                return freed
        # The pages ahead were freed a lap ago only if what was freed reaches past them.
        ahead_freed = self.done > tail - self._cap
        if ahead_freed and self._populate and not self._each(tail, tail + self.stretch, MADV_POPULATE_WRITE):
            self._populate = False  # an older kernel: the writer takes page faults instead
        return freed

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
