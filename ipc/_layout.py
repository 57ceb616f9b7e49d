"""Byte layout of an arena file. One place, so writer, reader and tools agree.

::

    [ header 4 KiB | status block 8 KiB | board 8 KiB | slot 0 | slot 1 | ... ]
    slot = [ control 256 B | data (ring_capacity bytes) ]

All integers are little-endian unsigned 64-bit words at 8-byte aligned offsets, so a
``memoryview.cast("Q")`` element store publishes each of them in one instruction on
x86-64 (see docs/ipc.md for ARM64). Fields that one side changes on every record live on
their own 64-byte cache line so the writer and the reader do not false-share.
"""

from __future__ import annotations

import struct
from typing import Final

MAGIC: Final = 0x314E5241504D5753  # b"SWMPARN1" read as a little-endian u64
LAYOUT_VERSION: Final = 3  # 2: the record check covers its position; 3: the board

HEADER_SIZE: Final = 4096
STATUS_SIZE: Final = 8192
BOARD_OFFSET: Final = HEADER_SIZE + STATUS_SIZE
BOARD_SIZE: Final = 8192
SLOTS_OFFSET: Final = BOARD_OFFSET + BOARD_SIZE
CONTROL_SIZE: Final = 256
META_OFFSET: Final = 128  # opaque owner-supplied bytes (the agent stores JSON here)
META_MAX: Final = HEADER_SIZE - META_OFFSET

# Header words (index into the header viewed as u64).
H_MAGIC: Final = 0
H_VERSION: Final = 1
H_SLOTS: Final = 2
H_CAPACITY: Final = 3
H_OWNER_PID: Final = 4
H_OWNER_START: Final = 5  # owner's start time in clock ticks since boot (guards pid reuse)
H_CREATED_NS: Final = 6
H_META_LEN: Final = 7
H_UID: Final = 8
# Records the owner's processes could not write into any ring, counted here because such a
# process has no ring (and so no slot counters) to count them in. Shared by every process:
# updated read-add-write under LOCK_COUNTERS (see ``Arena.add_counts``), never per record.
H_NO_SLOT_RECORDS: Final = 9  # dropped by workers that found every ring slot taken
H_NO_SLOT_WORKERS: Final = 10  # workers that found every slot taken (each counted once)
H_HELPER_RECORDS: Final = 11  # written in helpers (children forked by a worker), which stay inert
H_MASTER_RECORDS: Final = 12  # written in a prefork master that has no ring for them
H_LATE_RECORDS: Final = 13  # written by a process after its goodbye, when it exits
# The words above that ``Arena.add_counts`` adds to (a word of an older arena reads 0).
COUNTER_WORDS: Final = frozenset(
    (H_NO_SLOT_RECORDS, H_NO_SLOT_WORKERS, H_HELPER_RECORDS, H_MASTER_RECORDS, H_LATE_RECORDS)
)

# Status block words (index into the status block viewed as u64).
S_SEQ: Final = 0  # seqlock sequence: odd while the document is being rewritten
S_REPORTER_PID: Final = 1
S_HEARTBEAT_NS: Final = 2
S_REPORTER_STARTED_NS: Final = 3
S_REPORTER_STARTS: Final = 4
S_DOC_LEN: Final = 5
S_SLEEPING: Final = 8  # own cache line: writers read it after every record
# A writer rings the doorbell of a sleeping reader only once its ring holds at least
# capacity >> WAKE_FILL_SHIFT unread bytes (a quarter): at ordinary rates the reader's own
# timer drains the ring, and no write makes a system call.
WAKE_FILL_SHIFT: Final = 2
S_WAKEUPS: Final = 9
# Entries in use in the counter table below. It shares the sleeping flag's cache line but is
# stored only when the reporter meets a counter name for the first time (a handful of times
# in an arena's life), so writers reading the flag see no false sharing in practice.
S_COUNTERS: Final = 10
# The counter table: named u64 totals since the arena was created (records sent, dropped,
# spooled...). They live here rather than in the reporter's memory so that a restarted
# reporter continues them, ``swmp status`` shows them with no reporter running, and the
# last reporter can log the final totals. Entry = NUL-padded ASCII name + u64 value; only
# the reporter writes, under the same seqlock (S_SEQ) as the document.
COUNTERS_OFFSET: Final = 128
COUNTER_NAME_MAX: Final = 24
COUNTER_ENTRY: Final = COUNTER_NAME_MAX + 8
COUNTERS_MAX: Final = 56
# The document follows the table (1,920 bytes), on its own 2 KiB boundary.
DOC_OFFSET: Final = 2048
DOC_MAX: Final = STATUS_SIZE - DOC_OFFSET

# Board words (index into the board viewed as u64): a blob the reporter publishes to every
# writer (see ``ipc.board``). The generation is a seqlock sequence: odd while rewriting.
B_GENERATION: Final = 0
B_LEN: Final = 1
BOARD_DATA_OFFSET: Final = 64
BOARD_DATA_MAX: Final = BOARD_SIZE - BOARD_DATA_OFFSET

# Slot control words (index into the control block viewed as u64).
C_OWNER_PID: Final = 0
C_OWNER_START: Final = 1
C_CLAIMS: Final = 2
C_CLAIMED_NS: Final = 3
# writer cache line: only the writer stores here
C_TAIL: Final = 8
C_WRITTEN_RECORDS: Final = 9
C_DROPPED_RECORDS: Final = 10
C_DROPPED_BYTES: Final = 11
# Records the writer's process meant to write but could not encode (a value its encoder
# refuses even after escaping). The ring never saw them, but only the writer's process can
# count them where everyone reads: it stores this word alone (threads of that process serialize
# on the writer's counter lock), so no cross-process lock, like C_DROPPED_RECORDS. An arena
# whose writers never stored it reads 0.
C_UNBUILT_RECORDS: Final = 12
C_OVERSIZE: Final = 13
# Two more words only the writer's process adds to, the same way (its writer's counter lock),
# for records that process made where no ring of its own could take them, counted in the ring
# it binds afterwards (a slot's words are never stored by a process that does not hold it):
# records made before the process had a ring at all (``RingWriter.add_prestart``), and records
# that an earlier writer of the process refused once it was disabled, its slot given back or
# inherited across fork (``add_stale``). An arena whose writers never stored them reads 0.
C_PRESTART_RECORDS: Final = 14
C_STALE_RECORDS: Final = 15
# reader cache line: only the reader stores here
C_HEAD: Final = 16
C_READ_RECORDS: Final = 17
C_READ_BYTES: Final = 18  # ring bytes (headers and padding included), like the tail
C_CORRUPT: Final = 19
C_SKIPPED_BYTES: Final = 20
C_HIGH_WATER: Final = 21  # most bytes the reader ever found waiting (tail - head)
# Records lost to corruption recovery: well-formed records of a type the reader does not
# take, plus an estimate of the records in bytes skipped to the tail (see RingReader).
C_SKIPPED_RECORDS: Final = 22
# Bad input the writer's process refused (an incoming ``sw8``, ``sw8-correlation`` or ``sw8-x``
# header it could not decode: the request went on as a new trace). Not records: counted so that
# ``swmp status`` shows a caller sending garbage. Stored by the writer's process alone, as
# C_UNBUILT_RECORDS, on a line of its own (rare: never beside the hot words above). An arena
# whose writers never stored it reads 0.
C_BAD_INPUT: Final = 24

# Record header, one little-endian u64 word: payload length (bits 0-31), type (bits 32-47),
# check (bits 48-63). The writer stores it as one word; the reader loads it as one word.
RECORD_HEADER: Final = struct.Struct("<IHH")
RECORD_HEADER_SIZE: Final = 8
PAD_TYPE: Final = 0xFFFF
CHECK_SALT: Final = 0xA5C3
# Cached per payload length by writers: one ``pack_into`` stores header and payload.
RECORD_PACKER_CACHE: Final = 1024
# Positions stay below this; a reset that would pass it starts again from 0. Unreachable
# in practice (2**62 bytes is a century at 1 GB/s) but it keeps garbage from overflowing u64.
POSITION_LIMIT: Final = 1 << 62


def lap_tag(position: int, capacity: int) -> int:
    """The per-lap half of a record's check word: changes every time the ring wraps."""
    return ((position // capacity) ^ CHECK_SALT) & 0xFFFF


def check_word(length: int, rtype: int, position: int, capacity: int) -> int:
    """16-bit check of a record header written at ring ``position``.

    Garbage passes it with probability 2**-16. Folding in the lap number means bytes left
    over from an earlier lap fail it too: every offset of the current lap is written at
    exactly one position, so a header that checks out at the reader's position is the one
    written there, never a stale one (the reader can therefore not return a duplicate when
    a position word is garbage).
    """
    return (length ^ rtype ^ lap_tag(position, capacity)) & 0xFFFF


def header_word(length: int, rtype: int, position: int, capacity: int) -> int:
    return length | rtype << 32 | check_word(length, rtype, position, capacity) << 48


def record_span(length: int) -> int:
    """Ring bytes one record of ``length`` payload bytes occupies (header + 8-byte padding)."""
    return (length + RECORD_HEADER_SIZE + 7) & ~7


def slot_stride(capacity: int) -> int:
    return CONTROL_SIZE + capacity


def file_size(slots: int, capacity: int) -> int:
    return SLOTS_OFFSET + slots * slot_stride(capacity)


# Byte-range locks live far past the end of the file: POSIX locks may cover any offset, and
# keeping them away from mapped bytes keeps the two mechanisms independent.
LOCK_BASE: Final = 1 << 40
LOCK_REPORTER: Final = LOCK_BASE
LOCK_CREATOR: Final = LOCK_BASE + 1
LOCK_COUNTERS: Final = LOCK_BASE + 2  # serializes updates of the shared header counters


def slot_lock_offset(slot: int) -> int:
    return LOCK_BASE + 16 + slot
