"""Single-producer, single-consumer byte ring over shared memory.

One writer process (its threads serialized by an in-process lock) appends records; one
reader process drains them. Positions are monotonic 64-bit byte counters; the offset in the
data area is ``position & (capacity - 1)``.

Record: one 8-byte header word (length, type, check; see ``_layout``) and the payload,
padded to a multiple of 8. A record never straddles the end of the data area: when it would,
the writer first fills the rest with a padding record. Every record therefore starts at an
8-byte aligned offset and its header is one aligned word.

Publication order is what makes this safe without cross-process atomics:

1. the writer stores header and payload in the data area (the reader does not look past
   the published tail, so these bytes are private until step 2);
2. the writer stores the new tail with one aligned 8-byte store.

x86-64 keeps stores in program order and loads in program order, so a reader that sees the
new tail sees the bytes before it (ARM64 needs release/acquire here; see docs/ipc.md). A
writer killed between 1 and 2 leaves nothing visible: the next writer of the slot simply
overwrites the unpublished bytes. The reader frees space the same way, storing the head
only after it has copied records out.

The writer never blocks and never makes a system call on its path: when the record does
not fit it is dropped and counted. The only syscall is the optional wake-up (a one-byte
write to a FIFO), made only while the reader says it is asleep *and* the ring is filling up
(a quarter of its capacity unread, ``_layout.WAKE_FILL_SHIFT``); below that the reader's
own timer comes for the records.

Ownership of the control words: the writer alone stores the tail and the written/dropped
counters and keeps private copies of them; the reader alone stores the head and the read
counters and keeps private copies. Each side only *loads* the other's words, so garbage in
a word (a stray write, a foreign process) shows up as a disagreement that the owner of the
word repairs by storing it again; it is never trusted blindly (see :class:`RingReader`).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import TYPE_CHECKING

from ipc import _layout as L
from ipc import ring_room
from ipc.ring_pages import page_returner
from ipc.ring_reader import RingReader
from ipc.ring_stats import RingStats, read_stats
from ipc.ring_writer import RingWriter

if TYPE_CHECKING:
    from ipc.arena import SlotViews

# The two ends live in ring_writer.py and ring_reader.py; this module keeps the protocol's
# description above and the names every caller imports.
__all__ = [
    "RingReader",
    "RingStats",
    "RingWriter",
    "anonymous_ring",
    "file_writer",
    "page_returner",
    "read_stats",
]


def anonymous_ring(capacity: int = 1 << 16) -> tuple[RingWriter, RingReader, memoryview]:
    """A writer and reader over private memory (tests, benchmarks): no arena file.

    Returns ``(writer, reader, control)``; ``control`` is the u64 view of the control words.
    """
    mm = mmap.mmap(-1, L.CONTROL_SIZE + capacity)
    status = memoryview(bytearray(L.STATUS_SIZE)).cast("Q")
    control = memoryview(mm)[: L.CONTROL_SIZE].cast("Q")
    data = memoryview(mm)[L.CONTROL_SIZE :]
    writer = RingWriter(0, control, data, status, pages=page_returner(mm, L.CONTROL_SIZE, capacity))
    reader = RingReader(0, control, data, mapping=mm, base=L.CONTROL_SIZE)
    return writer, reader, control


def file_writer(
    slot: int,
    control: memoryview,
    views: SlotViews,
    status: memoryview,
    wake: Callable[[], None] | None,
    *,
    mm: mmap.mmap | None,
    fd: Callable[[], int],
) -> RingWriter:
    """The writer of ``slot``'s ring in an arena file mapped at ``mm``: pages its reader is
    done with go back at every stretch (``ring_pages``), and pages get the file system's
    room before it writes them (``ring_room``). ``fd()`` is the file's descriptor in this
    process, -1 once closed."""
    data, data_offset = views.data(slot), views.base(slot) + L.CONTROL_SIZE
    pages = page_returner(mm, data_offset, len(data))
    stretch = pages.stretch if pages is not None else len(data)
    room = ring_room.RingRoom(fd, data_offset, len(data), stretch=stretch, tail=int(control[L.C_TAIL]))
    return RingWriter(slot, control, data, status, wake, pages=pages, room=room)
