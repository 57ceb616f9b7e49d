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
write to a FIFO), made only while the reader says it is asleep.

Ownership of the control words: the writer alone stores the tail and the written/dropped
counters and keeps private copies of them; the reader alone stores the head and the read
counters and keeps private copies. Each side only *loads* the other's words, so garbage in
a word (a stray write, a foreign process) is noticed as a disagreement and repaired by a
reset, never trusted blindly; see :meth:`RingReader._reset`.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from ipc import _layout as L

log = logging.getLogger("ipc")


class _ByteSource(Protocol):
    def __getitem__(self, key: slice, /) -> bytes: ...


@dataclass(frozen=True)
class RingStats:
    """A snapshot of one ring's counters (each word is read atomically, the set is not)."""

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
    def written_bytes(self) -> int:
        """Ring bytes written over the slot's life: headers, alignment and padding included.

        This is the tail position itself (so it costs the writer nothing); it jumps forward
        when a corrupted ring is reset.
        """
        return self.tail

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


# Writers alive in this process, so a fork can disable the copies the child inherits.
_writers: weakref.WeakSet[RingWriter] = weakref.WeakSet()


def _disable_inherited_writers() -> None:
    for writer in list(_writers):
        writer._disable("inherited across fork")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disable_inherited_writers)


class RingWriter:
    """Appends records to one slot's ring. Thread-safe within one process.

    ``control`` is the slot's control block viewed as u64 words, ``data`` its data area,
    ``status`` the arena's status block as u64 words (for the reader's sleeping flag).

    ``write(rtype, payload) -> bool`` is an attribute holding a closure rather than a
    method: every piece of state it touches is a local or a closure cell, which is what
    gets the hot path under a microsecond (see docs/performance.md). A writer inherited
    by a forked child, or whose slot was released, is disabled: it drops (and counts)
    everything, because the slot is no longer this process's to write.
    """

    __slots__ = ("__weakref__", "_cap", "_control", "_lost", "_max_payload", "slot", "write")

    write: Callable[[int, bytes], bool]

    def __init__(
        self,
        slot: int,
        control: memoryview,
        data: memoryview,
        status: memoryview,
        wake: Callable[[], None] | None = None,
    ) -> None:
        capacity = len(data)
        if capacity < 4096 or capacity & (capacity - 1) or control.format != "Q":
            raise ValueError("ring data must be a power of two >= 4096 bytes, control a u64 view")
        self.slot = slot
        self._control = control
        self._cap = capacity
        # A record may use at most half the ring: with worst-case end padding it still fits.
        self._max_payload = capacity // 2 - L.RECORD_HEADER_SIZE
        self._lost = 0  # writes refused after the writer was disabled (not in shared memory)
        self.write = _make_write(slot, control, data, status, wake, capacity)
        _writers.add(self)

    @property
    def capacity(self) -> int:
        return self._cap

    @property
    def max_payload(self) -> int:
        return self._max_payload

    @property
    def tail(self) -> int:
        """The published tail (what the reader can see)."""
        return int(self._control[L.C_TAIL])

    @property
    def disabled_drops(self) -> int:
        """Records refused after this writer was disabled (fork, slot released)."""
        return self._lost

    def stats(self) -> RingStats:
        return read_stats(self.slot, self._control, self._cap)

    def _disable(self, why: str) -> None:
        logged = False

        def refuse(rtype: int, payload: bytes) -> bool:
            nonlocal logged
            self._lost += 1
            if not logged:
                logged = True
                log.warning("ring slot %d: writer %s; records are dropped", self.slot, why)
            return False

        self.write = refuse


def _no_wake() -> None:
    pass


class _Packers(dict[int, Callable[..., None]]):
    """``pack_into`` of ``Struct("<IHH{n}s")`` per payload length ``n``, made on first use.

    Bounded: past the limit a generic (two-step) packer is returned and nothing is cached.
    """

    def __missing__(self, n: int) -> Callable[..., None]:
        packer = struct.Struct(f"<IHH{n}s").pack_into
        if len(self) < L.RECORD_PACKER_CACHE:
            self[n] = packer
        return packer


def _make_write(
    slot: int,
    control: memoryview,
    data: memoryview,
    status: memoryview,
    wake: Callable[[], None] | None,
    cap: int,
) -> Callable[[int, bytes], bool]:
    """Build the writer's hot path as a closure over locals (see :class:`RingWriter`).

    Measured choices (docs/performance.md): one cached ``Struct("<IHH{n}s").pack_into``
    stores header and payload in a single call; the check word needs only the lap tag,
    which changes when the ring wraps, so it is recomputed on the slow path only (the fast
    path refuses a record that would end exactly at the end of the data area).
    """
    mask = cap - 1
    max_payload = cap // 2 - L.RECORD_HEADER_SIZE
    limit = L.POSITION_LIMIT
    pad = L.PAD_TYPE
    C_HEAD, C_TAIL, C_WRITTEN, C_HW = L.C_HEAD, L.C_TAIL, L.C_WRITTEN_RECORDS, L.C_HIGH_WATER
    S_SLEEPING = L.S_SLEEPING
    packers = _Packers()
    wake = wake if wake is not None else _no_wake
    lock = threading.Lock()
    acquire = lock.acquire
    release = lock.release
    # The writer is the only one that moves the tail, so it keeps its own copy and carries
    # on from whatever the previous owner of the slot published.
    tail = int(control[C_TAIL])
    tag = L.lap_tag(tail, cap)
    written = int(control[C_WRITTEN])
    high_water = int(control[C_HW])
    problem_logged = False

    def drop(n: int, oversize: bool) -> None:
        control[L.C_DROPPED_RECORDS] += 1
        control[L.C_DROPPED_BYTES] += n
        if oversize:
            control[L.C_OVERSIZE] += 1

    def slow(rtype: int, payload: bytes) -> str | bool:
        """Everything off the fast path: padding, wrap, full ring, bad input, resync.

        Called with the lock held. Returns True/False (written/dropped) or a message to log
        (after the lock is released: a log handler may itself write to this ring).
        """
        nonlocal tail, tag, written, high_water
        n = len(payload)
        span = (n + 15) & -8
        if not 0 < rtype < pad:
            drop(n, False)
            return f"record type {rtype!r} is outside 1..65534"
        if n > max_payload:
            drop(n, True)
            return False
        t = tail
        used = t - control[C_HEAD]
        if not 0 <= used <= cap:
            # The head is not where a reader that follows us could have put it: the reader
            # reset the ring after corruption (it then puts the head past anything we could
            # have written) or the word is garbage. Continue from the head, which is where
            # the reader will look next; if it is garbage the reader resets again.
            head = int(control[C_HEAD])
            if head >= limit:
                drop(n, False)
                return False
            t = (head + 7) & -8
            used = t - head
        offset = t & mask
        room = cap - offset
        extra = room if span > room else 0
        if used + extra + span > cap:
            drop(n, False)
            tail = t  # a resync is kept even when this record does not fit
            tag = L.lap_tag(t, cap)
            return False
        if extra:
            # The record would straddle the end: fill the rest with a padding record.
            data[offset : offset + 8] = L.header_word(room - 8, pad, t, cap).to_bytes(8, "little")
            t += room
            offset = 0
        data[offset : offset + 8] = L.header_word(n, rtype, t, cap).to_bytes(8, "little")
        data[offset + 8 : offset + 8 + n] = payload
        t += span
        control[C_TAIL] = t  # publish: one aligned 8-byte store, after the bytes
        tail = t
        tag = L.lap_tag(t, cap)
        written += 1
        control[C_WRITTEN] = written
        used += extra + span
        if used > high_water:
            high_water = used
            control[C_HW] = used
        return True

    def write(rtype: int, payload: bytes) -> bool:
        """Append one record; False (counted as dropped) when it does not fit right now."""
        nonlocal tail, written, problem_logged
        acquire()
        try:
            n = len(payload)
            t = tail
            offset = t & mask
            span = (n + 15) & -8
            # Fast path: the record ends before the end of the data area (so the lap and
            # its tag do not change) and fits behind the head. Everything else is slow().
            if span < cap - offset and 0 <= t - control[C_HEAD] <= cap - span:
                # Header (u32 length, u16 type, u16 check) and payload in one call. A type
                # outside 0..65535 makes it raise (see below); 0 and 65535 are skipped and
                # counted by the reader.
                packers[n](data, offset, n, rtype, (n ^ rtype ^ tag) & 0xFFFF, payload)
                control[C_TAIL] = tail = t + span  # publish: one aligned 8-byte store
                written += 1
                control[C_WRITTEN] = written
                outcome: str | bool = True
            else:
                outcome = slow(rtype, payload)
        except Exception as exc:
            # A payload struct does not take (memoryview...) goes the generic way; anything
            # else (a str payload, a torn-down mapping) is dropped, never raised.
            try:
                outcome = slow(rtype, payload)
            except Exception:
                outcome = f"write failed: {exc!r}"
                try:
                    drop(0, False)
                except Exception:
                    pass
        finally:
            # The lock release is an atomic read-modify-write (a full barrier on x86-64), so
            # the tail store above is visible before the sleeping flag is loaded below.
            release()
        if outcome is True:
            if status[S_SLEEPING]:
                wake()
            return True
        if outcome is not False and not problem_logged:
            problem_logged = True
            log.error("ring slot %d: %s; dropped (further problems are only counted)", slot, outcome)
        return False

    return write


class _ViewSource:
    """Byte source over a plain memoryview (rings not backed by an mmap)."""

    __slots__ = ("_view",)

    def __init__(self, view: memoryview) -> None:
        self._view = view

    def __getitem__(self, key: slice, /) -> bytes:
        return bytes(self._view[key])


class RingReader:
    """Drains one slot's ring. Only one reader per ring may exist at a time.

    Reading and releasing are separate steps: :meth:`read` moves a private cursor and
    returns copies of the records; :meth:`commit` hands the space back to the writer. A
    reader that commits only after its batch is safely delivered gives at-least-once
    delivery across its own crashes: a new reader starts again from the committed head.

    ``types``, if given, is the set of record types the caller understands; well-formed
    records of any other type are skipped and counted as corruption. ``mapping``/``base``
    let the reader copy payloads straight out of the mmap (one copy, no memoryview).
    """

    __slots__ = (
        "_base",
        "_cap",
        "_control",
        "_cursor",
        "_data",
        "_head",
        "_logged",
        "_source",
        "_stalled",
        "_types",
        "_words",
        "slot",
    )

    def __init__(
        self,
        slot: int,
        control: memoryview,
        data: memoryview,
        *,
        mapping: mmap.mmap | None = None,
        base: int = 0,
        types: Collection[int] | None = None,
    ) -> None:
        self.slot = slot
        self._control = control
        self._data = data
        self._words = data.cast("Q")
        self._cap = len(data)
        self._source: _ByteSource = mapping if mapping is not None else _ViewSource(data)
        self._base = base if mapping is not None else 0
        self._types = frozenset(types) if types is not None else None
        self._head = int(control[L.C_HEAD])
        self._cursor = self._head
        self._stalled = -1
        self._logged = False

    @property
    def cursor(self) -> int:
        """Position just after the last record returned by :meth:`read`."""
        return self._cursor

    @property
    def head(self) -> int:
        """The committed position (everything before it is released to the writer)."""
        return self._head

    def pending(self) -> bool:
        """True when the writer has published something this reader has not read yet."""
        return bool(self._control[L.C_TAIL] > self._cursor)

    def backlog(self) -> int:
        """Bytes published but not yet committed (0..capacity)."""
        return max(0, min(self._cap, int(self._control[L.C_TAIL]) - self._head))

    def rewind(self) -> None:
        """Forget uncommitted reads: the next :meth:`read` starts at the committed head."""
        self._cursor = self._head

    def read(self, max_records: int = 4096, max_bytes: int = 1 << 62) -> list[tuple[int, bytes]]:
        """Return up to ``max_records`` records as ``(type, payload)``; never raises.

        Stops early after ``max_bytes`` payload bytes (at least one record is returned).
        """
        try:
            return self._read(max_records, max_bytes)
        except Exception as exc:  # a torn-down mapping, a bug: cost data, never the caller
            self._reset(int(self._control[L.C_TAIL]), f"reader failed: {exc!r}")
            return []

    def _read(self, max_records: int, max_bytes: int) -> list[tuple[int, bytes]]:
        control = self._control
        tail = int(control[L.C_TAIL])
        cursor = self._cursor
        head = self._head
        if control[L.C_HEAD] != head:
            self._reset(tail, "head word changed behind the reader's back")
            return []
        if tail <= cursor:
            if tail < cursor and tail != self._stalled:
                # Behind us: after our own reset, until the writer catches up, or garbage
                # the writer overwrites with its next record. Nothing to skip; count once.
                self._stalled = tail
                control[L.C_CORRUPT] += 1
            return []
        cap = self._cap
        if tail - head > cap or (tail | head) & 7:
            self._reset(tail, "tail outside the ring")
            return []
        words = self._words
        source = self._source
        base = self._base + 8
        mask = cap - 1
        shift = cap.bit_length() - 1
        salt = L.CHECK_SALT
        types = self._types
        out: list[tuple[int, bytes]] = []
        append = out.append
        nbytes = 0
        count = 0
        while cursor < tail and count < max_records and nbytes < max_bytes:
            offset = cursor & mask
            word = words[offset >> 3]
            n = word & 0xFFFFFFFF
            rtype = (word >> 32) & 0xFFFF
            if word >> 48 != (n ^ rtype ^ (cursor >> shift) ^ salt) & 0xFFFF:
                self._finish(cursor, count, nbytes)
                self._reset(tail, f"bad record header at {cursor} (length={n}, type={rtype})")
                return out
            span = (n + 15) & -8
            if rtype == 0xFFFF:
                room = cap - offset
                if n != room - 8 or cursor + room > tail:
                    self._finish(cursor, count, nbytes)
                    self._reset(tail, f"bad padding record at {cursor}")
                    return out
                cursor += room
                continue
            if rtype == 0 or offset + span > cap or cursor + span > tail:
                self._finish(cursor, count, nbytes)
                self._reset(tail, f"bad record at {cursor} (length={n}, type={rtype})")
                return out
            if types is not None and rtype not in types:
                self._skip(cursor, span, rtype)
                cursor += span
                continue
            start = base + offset
            append((rtype, source[start : start + n]))
            count += 1
            nbytes += n
            cursor += span
        self._finish(cursor, count, nbytes)
        return out

    def _finish(self, cursor: int, count: int, nbytes: int) -> None:
        self._cursor = cursor
        if count:
            control = self._control
            control[L.C_READ_RECORDS] += count
            control[L.C_READ_BYTES] += nbytes

    def commit(self, position: int | None = None) -> None:
        """Release everything before ``position`` (default: the cursor) to the writer.

        Positions before the committed head (e.g. from before a reset) are ignored, and a
        position past the cursor is taken as the cursor.
        """
        pos = self._cursor if position is None else min(position, self._cursor)
        if pos > self._head:
            self._head = pos
            self._control[L.C_HEAD] = pos

    def _skip(self, cursor: int, span: int, rtype: int) -> None:
        control = self._control
        control[L.C_CORRUPT] += 1
        control[L.C_SKIPPED_BYTES] += span
        self._log_once(f"record of unknown type {rtype} at {cursor} skipped")

    def _reset(self, tail: int, why: str) -> None:
        """Throw away everything unread and start the ring afresh past any sane position.

        Garbage must cost data, never a crash or an endless loop. We cannot know where the
        writer really is when a word is garbage, so the new position is chosen *beyond*
        every position in sight by two capacities: the writer finds the head ahead of its
        own tail (impossible in normal operation) and continues from it (see the writer's
        resync), and everything between here and there, stale or garbage, is never read.
        Uncommitted records already returned are released too.
        """
        control = self._control
        cursor = self._cursor
        cap = self._cap
        sane_tail = tail if 0 <= tail - self._head <= cap else cursor
        skipped = max(0, sane_tail - cursor)
        candidates = [cursor, self._head, tail, int(control[L.C_HEAD])]
        highest = max((p for p in candidates if p < L.POSITION_LIMIT), default=0)
        target = ((highest + 7) & -8) + 2 * cap
        if target >= L.POSITION_LIMIT:
            target = 0
        control[L.C_CORRUPT] += 1
        control[L.C_SKIPPED_BYTES] += skipped
        self._cursor = self._head = target
        self._stalled = tail  # the tail we saw is behind us now; not a new event
        control[L.C_HEAD] = target
        self._log_once(f"{why}; {skipped} bytes skipped, ring reset to position {target}")

    def _log_once(self, message: str) -> None:
        if not self._logged:
            self._logged = True
            log.error("ring slot %d: %s. Further corruption in this ring is only counted.", self.slot, message)

    def stats(self) -> RingStats:
        return read_stats(self.slot, self._control, self._cap)


def anonymous_ring(capacity: int = 1 << 16) -> tuple[RingWriter, RingReader, memoryview]:
    """A writer and reader over private memory (tests, benchmarks): no arena file.

    Returns ``(writer, reader, control)``; ``control`` is the u64 view of the control words.
    """
    mm = mmap.mmap(-1, L.CONTROL_SIZE + capacity)
    status = memoryview(bytearray(L.STATUS_SIZE)).cast("Q")
    control = memoryview(mm)[: L.CONTROL_SIZE].cast("Q")
    data = memoryview(mm)[L.CONTROL_SIZE :]
    writer = RingWriter(0, control, data, status)
    reader = RingReader(0, control, data, mapping=mm, base=L.CONTROL_SIZE)
    return writer, reader, control
