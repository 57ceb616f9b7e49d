"""Single-producer, single-consumer byte ring over shared memory.

One writer process (its threads serialized by an in-process lock) appends records; one
reader process drains them. Positions are monotonic 64-bit byte counters; the offset in the
data area is ``position & (capacity - 1)``.

Publication order is what makes this safe without cross-process atomics:

1. the writer copies header and payload into the data area (the reader does not look past
   the published tail, so these bytes are private until step 2);
2. the writer stores the new tail with one aligned 8-byte store.

x86-64 keeps stores in program order, so a reader that sees the new tail sees the bytes
before it. A writer killed between 1 and 2 leaves nothing visible: the next writer of the
slot simply overwrites the unpublished bytes. The reader frees space the same way, storing
the head only after it has copied records out.

The writer never blocks and never makes a system call on its path: when the record does
not fit it is dropped and counted. The only syscall is the optional wake-up (a one-byte
write to a FIFO), made only while the reader says it is asleep.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ipc import _layout as L

log = logging.getLogger("ipc")

_pack_header = L.RECORD_HEADER.pack
_unpack_header = L.RECORD_HEADER.unpack_from
_PAD = L.PAD_TYPE
_SALT = L.CHECK_SALT


@dataclass(frozen=True)
class RingStats:
    """A consistent-enough snapshot of one ring's counters (each word is read atomically)."""

    slot: int
    capacity: int
    head: int
    tail: int
    written_records: int
    dropped_records: int
    dropped_bytes: int
    oversize_records: int
    high_water: int
    read_records: int
    read_bytes: int
    corrupt_events: int
    skipped_bytes: int

    @property
    def used(self) -> int:
        """Bytes written and not yet released by the reader."""
        return max(0, min(self.capacity, self.tail - self.head))

    @property
    def fill_ratio(self) -> float:
        return self.used / self.capacity if self.capacity else 0.0


def read_stats(slot: int, control: memoryview, capacity: int) -> RingStats:
    return RingStats(
        slot=slot,
        capacity=capacity,
        head=control[L.C_HEAD],
        tail=control[L.C_TAIL],
        written_records=control[L.C_WRITTEN_RECORDS],
        dropped_records=control[L.C_DROPPED_RECORDS],
        dropped_bytes=control[L.C_DROPPED_BYTES],
        oversize_records=control[L.C_OVERSIZE],
        high_water=control[L.C_HIGH_WATER],
        read_records=control[L.C_READ_RECORDS],
        read_bytes=control[L.C_READ_BYTES],
        corrupt_events=control[L.C_CORRUPT],
        skipped_bytes=control[L.C_SKIPPED_BYTES],
    )


class RingWriter:
    """Appends records to one slot's ring. Thread-safe within one process.

    ``control`` is the slot's control block viewed as u64 words, ``data`` its data area,
    ``status`` the arena's status block as u64 words (for the reader's sleeping flag).
    """

    __slots__ = (
        "_cap",
        "_control",
        "_data",
        "_hw",
        "_lock",
        "_mask",
        "_max_payload",
        "_status",
        "_tail",
        "_wake",
        "_written",
        "slot",
    )

    def __init__(
        self,
        slot: int,
        control: memoryview,
        data: memoryview,
        status: memoryview,
        wake: Callable[[], None] | None = None,
    ) -> None:
        capacity = len(data)
        self.slot = slot
        self._control = control
        self._data = data
        self._status = status
        self._cap = capacity
        self._mask = capacity - 1
        # A record may use at most half the ring: with worst-case end padding it still fits.
        self._max_payload = capacity // 2 - L.RECORD_HEADER_SIZE
        self._lock = threading.Lock()
        self._wake = wake
        # The writer is the only one that moves the tail, so it keeps its own copy and
        # carries on from whatever the previous owner of the slot published.
        self._tail = control[L.C_TAIL]
        self._written = control[L.C_WRITTEN_RECORDS]
        self._hw = control[L.C_HIGH_WATER]

    @property
    def capacity(self) -> int:
        return self._cap

    @property
    def max_payload(self) -> int:
        return self._max_payload

    def write(self, rtype: int, payload: bytes) -> bool:
        """Append one record; False (counted as dropped) when it does not fit right now."""
        n = len(payload)
        span = (n + 15) & ~7
        with self._lock:
            control = self._control
            tail = self._tail
            used = tail - control[L.C_HEAD]
            cap = self._cap
            offset = tail & self._mask
            room_to_end = cap - offset
            extra = room_to_end if span > room_to_end else 0
            if n > self._max_payload or used < 0 or used + span + extra > cap:
                self._drop(n, oversize=n > self._max_payload)
                return False
            data = self._data
            if extra:
                # The record would straddle the end: fill the rest with a padding record.
                data[offset : offset + 8] = _pack_header(room_to_end - 8, _PAD, 0)
                offset = 0
                tail += extra
            end = offset + 8 + n
            data[offset : offset + 8] = _pack_header(n, rtype, (n ^ (n >> 16) ^ rtype ^ _SALT) & 0xFFFF)
            data[offset + 8 : end] = payload
            tail += span
            control[L.C_TAIL] = tail  # publish: one aligned 8-byte store, after the bytes
            self._tail = tail
            self._written += 1
            control[L.C_WRITTEN_RECORDS] = self._written
            used += span + extra
            if used > self._hw:
                self._hw = used
                control[L.C_HIGH_WATER] = used
        if self._status[L.S_SLEEPING] and self._wake is not None:
            self._wake()
        return True

    def _drop(self, n: int, oversize: bool) -> None:
        control = self._control
        control[L.C_DROPPED_RECORDS] = control[L.C_DROPPED_RECORDS] + 1
        control[L.C_DROPPED_BYTES] = control[L.C_DROPPED_BYTES] + n
        if oversize:
            control[L.C_OVERSIZE] = control[L.C_OVERSIZE] + 1

    def stats(self) -> RingStats:
        return read_stats(self.slot, self._control, self._cap)


class RingReader:
    """Drains one slot's ring. Only one reader per ring may exist at a time.

    Reading and releasing are separate steps: :meth:`read` moves a private cursor and
    returns copies of the records; :meth:`commit` hands the space back to the writer. A
    reader that commits only after its batch is safely delivered gives at-least-once
    delivery across its own crashes: a new reader starts again from the committed head.
    """

    __slots__ = ("_cap", "_control", "_cursor", "_data", "_logged", "_mask", "slot")

    def __init__(self, slot: int, control: memoryview, data: memoryview) -> None:
        self.slot = slot
        self._control = control
        self._data = data
        self._cap = len(data)
        self._mask = self._cap - 1
        self._cursor = control[L.C_HEAD]
        self._logged = False

    @property
    def cursor(self) -> int:
        """Position just after the last record returned by :meth:`read`."""
        return self._cursor

    def pending(self) -> bool:
        """True when the writer has published records this reader has not read yet."""
        return self._control[L.C_TAIL] != self._cursor

    def backlog(self) -> int:
        """Bytes published but not yet committed."""
        return self._control[L.C_TAIL] - self._control[L.C_HEAD]

    def rewind(self) -> None:
        """Forget uncommitted reads: the next :meth:`read` starts at the committed head."""
        self._cursor = self._control[L.C_HEAD]

    def read(self, max_records: int = 4096, max_bytes: int = 1 << 62) -> list[tuple[int, bytes]]:
        """Return up to ``max_records`` records as ``(type, payload)``; never raises."""
        control = self._control
        tail = control[L.C_TAIL]
        cursor = self._cursor
        if tail == cursor:
            return []
        cap = self._cap
        if tail < cursor or tail - control[L.C_HEAD] > cap:
            self._corrupt(tail, cursor, "tail outside the ring")
            return []
        data = self._data
        mask = self._mask
        out: list[tuple[int, bytes]] = []
        append = out.append
        nbytes = 0
        while cursor < tail and len(out) < max_records and nbytes < max_bytes:
            offset = cursor & mask
            n, rtype, check = _unpack_header(data, offset)
            if rtype == _PAD:
                room = cap - offset
                if n != room - 8 or cursor + room > tail:
                    self._corrupt(tail, cursor, "bad padding record")
                    return out
                cursor += room
                continue
            span = (n + 15) & ~7
            if (
                rtype == 0
                or check != (n ^ (n >> 16) ^ rtype ^ _SALT) & 0xFFFF
                or offset + span > cap
                or cursor + span > tail
            ):
                self._corrupt(tail, cursor, f"bad record header (length={n}, type={rtype})")
                return out
            append((rtype, bytes(data[offset + 8 : offset + 8 + n])))
            nbytes += n
            cursor += span
        self._cursor = cursor
        control[L.C_READ_RECORDS] = control[L.C_READ_RECORDS] + len(out)
        control[L.C_READ_BYTES] = control[L.C_READ_BYTES] + nbytes
        return out

    def commit(self, position: int | None = None) -> None:
        """Release everything before ``position`` (default: the cursor) to the writer."""
        pos = self._cursor if position is None else position
        if pos > self._control[L.C_HEAD]:
            self._control[L.C_HEAD] = pos

    def _corrupt(self, tail: int, cursor: int, why: str) -> None:
        """Skip everything published so far: garbage must cost data, never a crash or a loop."""
        control = self._control
        control[L.C_CORRUPT] = control[L.C_CORRUPT] + 1
        control[L.C_SKIPPED_BYTES] = control[L.C_SKIPPED_BYTES] + max(0, tail - cursor)
        if not self._logged:
            self._logged = True
            log.error(
                "ring slot %d: %s at position %d (tail %d); skipping to the tail. "
                "Further corruption in this ring is only counted.",
                self.slot,
                why,
                cursor,
                tail,
            )
        # Move past everything visible. If the tail itself is garbage (behind us, or more
        # than a ring ahead) adopt it anyway: the writer continues from it.
        self._cursor = tail
        control[L.C_HEAD] = tail

    def stats(self) -> RingStats:
        return read_stats(self.slot, self._control, self._cap)
