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

import logging
import mmap
import os
import struct
import threading
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

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
    skipped_records: int = 0

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
        skipped_records=control[L.C_SKIPPED_RECORDS],
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
        self.write = _make_write(slot, control=control, data=data, status=status, wake=wake, cap=capacity)
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


_HEADER_PACK = L.RECORD_HEADER.pack_into


def _pack_generic(buf: memoryview, offset: int, *fields: Any) -> None:
    """Same arguments as the cached packers' ``pack_into``: (n, rtype, check, payload)."""
    n, rtype, check, payload = fields
    _HEADER_PACK(buf, offset, n, rtype, check)
    buf[offset + 8 : offset + 8 + n] = payload


def _refuse(buf: memoryview, offset: int, *fields: Any) -> None:
    raise OverflowError("record larger than the ring's max_payload")


class _Packers(dict[int, Callable[..., None]]):
    """``pack_into`` of ``Struct("<IHH{n}s")`` per payload length ``n``, made on first use.

    Bounded (a Struct is a few hundred bytes): past the limit, lengths not seen yet get the
    generic two-step packer. Lengths over ``max_payload`` get one that raises, which sends
    the record to the slow path (and its oversize count) at no cost to the fast path.
    """

    def __init__(self, max_payload: int) -> None:
        super().__init__()
        self.max_payload = max_payload

    def __missing__(self, n: int) -> Callable[..., None]:
        if n > self.max_payload:
            return _refuse
        if len(self) >= L.RECORD_PACKER_CACHE:
            return _pack_generic
        packer = self[n] = struct.Struct(f"<IHH{n}s").pack_into
        return packer


def _make_write(
    slot: int,
    *,
    control: memoryview,
    data: memoryview,
    status: memoryview,
    wake: Callable[[], None] | None,
    cap: int,
) -> Callable[[int, bytes], bool]:
    """Build the writer's hot path as a closure over locals (see :class:`RingWriter`).

    Measured choices (docs/performance.md): one cached ``Struct("<IHH{n}s").pack_into``
    stores header and payload in a single call; the writer does not load the head on every
    record but keeps ``limit``, a position it may write up to (the lower of the end of the
    current lap and the head it last saw plus the capacity). The head only grows, so the
    bound is conservative; the slow path refreshes it when a record does not fit under it.
    Records that would end exactly at the end of the lap also take the slow path, so the
    check word's lap tag only changes there.
    """
    mask = cap - 1
    max_payload = cap // 2 - L.RECORD_HEADER_SIZE
    pad = L.PAD_TYPE
    C_HEAD, C_TAIL, C_WRITTEN = L.C_HEAD, L.C_TAIL, L.C_WRITTEN_RECORDS
    S_SLEEPING = L.S_SLEEPING
    wake_fill = cap >> L.WAKE_FILL_SHIFT
    packers = _Packers(max_payload)
    wake = wake if wake is not None else _no_wake
    lock = threading.Lock()
    acquire = lock.acquire
    release = lock.release
    # The writer is the only one that moves the tail, so it keeps its own copy and carries
    # on from whatever the previous owner of the slot published.
    tail = int(control[C_TAIL])
    tag = L.lap_tag(tail, cap)
    limit = 0  # the first record takes the slow path, which loads the head
    written = int(control[C_WRITTEN])
    insane_head = -1  # a head word found inconsistent with our tail (see slow())
    problem_logged = False

    def drop(n: int, oversize: bool) -> None:
        control[L.C_DROPPED_RECORDS] += 1
        control[L.C_DROPPED_BYTES] += n
        if oversize:
            control[L.C_OVERSIZE] += 1

    def slow(rtype: int, payload: bytes) -> str | bool:
        """Everything off the fast path: wrap, full ring, bad input, corrupt head word.

        Called with the lock held. Returns True/False (written/dropped) or a message to log
        (after the lock is released: a log handler may itself write to this ring).
        """
        nonlocal tail, tag, limit, written, insane_head
        n = len(payload)
        span = (n + 15) & -8
        if not 0 < rtype < pad:
            drop(n, False)
            return f"record type {rtype!r} is outside 1..65534"
        if n > max_payload:
            drop(n, True)
            return False
        t = tail
        head = int(control[C_HEAD])
        used = t - head
        # Re-storing our own tail costs nothing here and repairs a garbage tail word, so
        # a reader that waits for us to publish is never left waiting on a full ring.
        control[C_TAIL] = t
        if t & 7 and head < L.POSITION_LIMIT:
            # Our tail is garbage for certain (positions are 8-byte aligned): this writer
            # took it from a garbage word when the slot was claimed. Start at the head.
            t = (head + 7) & -8
            used = t - head
        elif not 0 <= used <= cap:
            # Impossible for a head the reader stored: one of the two words is garbage.
            # A garbage head is rewritten by the reader at its next read, so the first time
            # we only drop. If the same head is still there next time, nobody is repairing
            # it: our tail must be the garbage one (e.g. adopted from a garbage word when
            # the slot was claimed), so we continue from the head instead.
            if head != insane_head or head >= L.POSITION_LIMIT:
                insane_head = head
                limit = 0
                drop(n, False)
                return f"head word {head} is inconsistent with tail {t}"
            insane_head = -1
            t = (head + 7) & -8
            used = t - head
        offset = t & mask
        room = cap - offset
        extra = room if span > room else 0
        if used + extra + span > cap:
            limit = 0
            drop(n, False)
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
        written += 1
        control[C_WRITTEN] = written
        tag = L.lap_tag(t, cap)
        limit = min((t | mask) + 1, head + cap + 1)
        return True

    def write(rtype: int, payload: bytes) -> bool:
        """Append one record; False (counted as dropped) when it does not fit right now."""
        nonlocal tail, written, problem_logged
        acquire()
        try:
            n = len(payload)
            t = tail
            end = t + ((n + 15) & -8)
            if end < limit:
                # Header (u32 length, u16 type, u16 check) and payload in one call. A type
                # outside 0..65535 makes it raise (handled below); types 0 and 65535 are not
                # checked here: the reader skips and counts such records.
                packers[n](data, t & mask, n, rtype, (n ^ rtype ^ tag) & 0xFFFF, payload)
                control[C_TAIL] = tail = end  # publish: one aligned 8-byte store, after the bytes
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
            if status[S_SLEEPING] and tail - int(control[C_HEAD]) >= wake_fill:
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
    records of any other type are skipped and counted as corruption (types 0 and 65535 are
    never delivered). ``mapping``/``base`` let the reader copy payloads straight out of the
    mmap (one copy, no intermediate memoryview).

    Garbage handling (counted in ``corrupt_events``/``skipped_bytes``/``skipped_records``,
    logged once):

    * head word not what this reader stored: rewritten (the writer trusts it for space);
    * tail word implausible (behind the cursor, past head + capacity, unaligned): ignored
      until the writer publishes again, which it does on its next write or drop; if it
      stays behind the cursor but changes, the writer is really there (our cursor came
      from a garbage tail) and the reader moves back to it;
    * a record header that fails its check or bounds: the reader first stops there once
      (the tail may have been garbage and the writer's next store fixes it); if the header
      is still bad at the next read, everything up to the tail is skipped.

    Skipped records: a record skipped for its type counts one. Bytes skipped to the tail
    hold records nobody can parse any more; their number comes from the writer's
    written-records word: the reader remembers that word (``_synced``) the last time it
    had read everything up to the tail, counts the records it took since (``_since``), and
    at the skip counts ``written - synced - since``. Exact unless the writer was storing a
    record at the very moment of the catch-up or the skip (the tail and the counter are two
    stores); before its first catch-up the reader falls back to the slot's lifetime words
    (written - read - skipped), which re-reads after a reporter restart make an undercount.
    """

    __slots__ = (
        "_base",
        "_behind",
        "_cap",
        "_control",
        "_cursor",
        "_head",
        "_high_water",
        "_logged",
        "_shift",
        "_since",
        "_source",
        "_suspect",
        "_synced",
        "_valid",
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
        cap = len(data)
        if cap < 4096 or cap & (cap - 1) or control.format != "Q":
            raise ValueError("ring data must be a power of two >= 4096 bytes, control a u64 view")
        self.slot = slot
        self._control = control
        self._words = data.cast("Q")
        self._cap = cap
        self._shift = cap.bit_length() - 1
        self._source: _ByteSource = mapping if mapping is not None else _ViewSource(data)
        self._base = base if mapping is not None else 0
        # One byte per record type: 1 = deliver. Types 0 and 65535 (padding) never are.
        valid = bytearray(65536)
        for t in range(1, 65535) if types is None else types:
            if 0 < t < 65535:
                valid[t] = 1
        self._valid = bytes(valid)
        head = int(control[L.C_HEAD])
        # A garbage head word must not make us start at an unaligned or absurd position;
        # if we change it, the first read stores ours back for the writer.
        self._head = (head + 7) & -8 if head < L.POSITION_LIMIT else 0
        self._cursor = self._head
        self._high_water = int(control[L.C_HIGH_WATER])
        self._suspect = -1  # position of a bad header seen once (see the class docstring)
        self._behind = -1  # an implausible tail value already counted
        self._logged = False
        # Writer's written-records word when this reader last caught up with the tail (-1:
        # not yet), and records read or skipped since: see "Skipped records" above.
        self._synced = int(control[L.C_WRITTEN_RECORDS]) if int(control[L.C_TAIL]) == self._head else -1
        self._since = 0

    @property
    def cursor(self) -> int:
        """Position just after the last record returned by :meth:`read`."""
        return self._cursor

    @property
    def head(self) -> int:
        """The committed position (everything before it is released to the writer)."""
        return self._head

    def pending(self) -> bool:
        """True when the writer has published records this reader has not read yet."""
        tail = int(self._control[L.C_TAIL])
        if tail <= self._cursor:
            if tail < self._cursor:
                self._tail_behind(tail)
            return False
        return tail - self._head <= self._cap and not tail & 7

    def backlog(self) -> int:
        """Bytes published but not yet committed (0..capacity)."""
        return max(0, min(self._cap, int(self._control[L.C_TAIL]) - self._head))

    def rewind(self) -> None:
        """Forget uncommitted reads: the next :meth:`read` starts at the committed head."""
        self._cursor = self._head
        self._synced = -1  # records are read again: the count since the catch-up is off

    def commit(self, position: int | None = None) -> None:
        """Release everything before ``position`` (default: the cursor) to the writer.

        Positions before the committed head are ignored, and a position past the cursor is
        taken as the cursor.
        """
        pos = self._cursor if position is None else min(position, self._cursor)
        if pos > self._head:
            self._head = pos
            self._control[L.C_HEAD] = pos

    def read(self, max_records: int = 4096, max_bytes: int = 1 << 62) -> list[tuple[int, bytes]]:
        """Return up to ``max_records`` records as ``(type, payload)``; never raises.

        Stops early once the records read take ``max_bytes`` ring bytes (8-byte header and
        alignment included; at least one record is returned when ``max_bytes`` is positive).
        """
        try:
            return self._read(max_records, max_bytes)
        except Exception as exc:  # a torn-down mapping, a bug: cost data, never the caller
            self._log_once(f"reader failed: {exc!r}")
            return []

    def _read(self, max_records: int, max_bytes: int) -> list[tuple[int, bytes]]:
        control = self._control
        head = self._head
        if control[L.C_HEAD] != head:
            self._count(0, "head word changed behind the reader's back; rewritten")
            control[L.C_HEAD] = head
        tail = int(control[L.C_TAIL])
        cursor = self._cursor
        if tail <= cursor:
            if tail < cursor:
                self._tail_behind(tail)
            return []
        cap = self._cap
        if tail - head > cap or tail & 7:  # (our head is always aligned)
            if tail != self._behind:
                self._behind = tail
                self._count(0, f"tail word {tail} is outside the ring (head {head})")
            return []
        self._behind = -1
        if tail - head > self._high_water:
            self._high_water = tail - head
            control[L.C_HIGH_WATER] = tail - head
        words = self._words
        source = self._source
        base = self._base + 8
        valid = self._valid
        mask = cap - 1
        shift = self._shift
        salt = L.CHECK_SALT
        start = cursor
        stop = tail if max_bytes >= tail - cursor else cursor + max(max_bytes, 0)
        out: list[tuple[int, bytes]] = []
        append = out.append
        left = max_records
        while cursor < stop and left > 0:
            # One lap segment at a time: within it the check word's lap tag is constant
            # and a record must end by ``bound``.
            lap_end = (cursor | mask) + 1
            bound = tail if tail < lap_end else lap_end
            seg_stop = stop if stop < bound else bound
            tag = ((cursor >> shift) ^ salt) & 0xFFFF
            for _ in range(left):
                if cursor >= seg_stop:
                    break
                off = cursor & mask
                word = words[off >> 3]
                n = word & 0xFFFFFFFF
                rtype = (word >> 32) & 0xFFFF
                span = (n + 15) & -8
                if word >> 48 != (n ^ rtype ^ tag) & 0xFFFF or cursor + span > bound:
                    # Not a header we wrote at this position, or it runs past the data.
                    self._cursor = cursor
                    self._finish(start, cursor, len(out))
                    self._bad_header(cursor, tail, n, rtype)
                    return out
                if not valid[rtype]:
                    if rtype == 0xFFFF and n == cap - off - 8:
                        cursor += span  # padding to the end of the lap: not in the byte budget
                        if stop < tail:
                            stop = min(tail, stop + span)
                        break
                    self._count(span, f"record of type {rtype} at {cursor} skipped")
                    self._control[L.C_SKIPPED_RECORDS] += 1
                    self._since += 1
                    cursor += span
                    continue
                off += base
                append((rtype, source[off : off + n]))
                cursor += span
            left = max_records - len(out)
        self._cursor = cursor
        self._suspect = -1
        self._finish(start, cursor, len(out))
        if cursor == tail:  # caught up: the writer's count is ours again
            self._synced = int(control[L.C_WRITTEN_RECORDS])
            self._since = 0
        return out

    def _finish(self, start: int, cursor: int, count: int) -> None:
        if cursor != start:
            control = self._control
            control[L.C_READ_RECORDS] += count
            control[L.C_READ_BYTES] += cursor - start
            self._since += count

    def _bad_header(self, cursor: int, tail: int, n: int, rtype: int) -> None:
        if self._suspect != cursor:
            # Maybe the tail word was garbage and we read past the writer: give the writer
            # one chance to publish again before calling the bytes garbage.
            self._suspect = cursor
            self._count(0, f"bad record header at {cursor} (length={n}, type={rtype})")
            return
        self._suspect = -1
        control = self._control
        control[L.C_SKIPPED_BYTES] += tail - cursor
        written = int(control[L.C_WRITTEN_RECORDS])  # loaded after the tail: covers it
        if self._synced >= 0:
            lost = written - self._synced - self._since
        else:
            lost = written - int(control[L.C_READ_RECORDS]) - int(control[L.C_SKIPPED_RECORDS])
        if lost > 0:
            control[L.C_SKIPPED_RECORDS] += lost
        self._synced, self._since = written, 0  # we are at the tail now
        self._log_once(f"bad record header at {cursor} (length={n}, type={rtype}); skipped to {tail}")
        self._cursor = tail

    def _tail_behind(self, tail: int) -> None:
        """The tail word is behind our cursor, which never happens in normal operation."""
        if tail == self._behind:
            return
        if self._behind >= 0 and tail >= self._head:
            # It changed, so the writer stored it: the writer really is there and our cursor
            # came from a garbage tail. Go back to it.
            self._count(0, f"tail {tail} behind the cursor {self._cursor}; following the writer")
            self._cursor = tail
            self._synced = -1
            self._behind = -1
            return
        self._behind = tail
        self._count(0, f"tail word {tail} is behind the cursor {self._cursor}")

    def _count(self, skipped: int, message: str) -> None:
        control = self._control
        control[L.C_CORRUPT] += 1
        if skipped:
            control[L.C_SKIPPED_BYTES] += skipped
        self._log_once(message)

    def _log_once(self, message: str) -> None:
        if not self._logged:
            self._logged = True
            log.error("ring slot %d: %s. Further corruption here is only counted.", self.slot, message)

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
