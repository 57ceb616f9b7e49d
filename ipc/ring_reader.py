"""The reader's end of a ring: drains records, releases space, repairs garbage words.

The protocol (publication order, ownership of the control words) is described in
``ipc/ring.py``; the byte layout in ``ipc/_layout.py``.
"""

from __future__ import annotations

import functools
import logging
import mmap
from collections.abc import Collection, Iterable
from typing import Protocol

from ipc import _layout as L
from ipc.ring_stats import RingStats, read_stats

log = logging.getLogger("ipc")


class _ByteSource(Protocol):
    def __getitem__(self, key: slice, /) -> bytes: ...


class _ViewSource:
    """Byte source over a plain memoryview (rings not backed by an mmap)."""

    __slots__ = ("_view",)

    def __init__(self, view: memoryview) -> None:
        self._view = view

    def __getitem__(self, key: slice, /) -> bytes:
        return bytes(self._view[key])


@functools.lru_cache(maxsize=8)
def _valid_table(types: frozenset[int] | None) -> bytes:
    """One byte per record type, 1 = deliver; types 0 and 65535 (padding) never are.

    Built with slice stores and shared by the readers of one reporter (an arena has up to
    4,096 of them): a Python loop over the 65,534 types took ~6 ms a reader, 0.4 s of the
    reporter's start with 64 slots and half a minute with 4,096."""
    if types is None:
        valid = bytearray(b"\x01") * 65536
        valid[0] = valid[65535] = 0
    else:
        valid = bytearray(65536)
        for t in types:
            if 0 < t < 65535:
                valid[t] = 1
    return bytes(valid)


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
        self._valid = _valid_table(None if types is None else frozenset(types))
        head = int(control[L.C_HEAD])
        # A garbage head word must not make us start at an unaligned or absurd position;
        # if we change it, the first read stores ours back for the writer.
        aligned = (head + 7) & -8  # checked after rounding: 2**62 - 7 rounds up to the limit
        self._head = aligned if aligned < L.POSITION_LIMIT else 0
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

    def release(self) -> None:
        """Let go of the ring's memory, before its arena is closed (a view still out keeps
        the mapping from being unmapped); the reader is unusable afterwards."""
        self._control.release()
        self._words.release()


def moved(readers: Iterable[RingReader]) -> list[RingReader]:
    """The readers whose ring's tail word is not at their cursor, in the given order.

    Only these can have anything to read or a tail word to look into: for every other
    reader :meth:`RingReader.pending` is False and does nothing (tail == cursor), and
    :meth:`RingReader.backlog` matters only together with ``pending``. A reporter calls this
    once per pass over an arena's 64 rings, most of them never claimed or long quiet:
    one comprehension over two words each, where a ``pending()`` and a ``backlog()`` call
    per ring were about half of an idle reporter's Python calls (docs/performance.md). No
    list of "live" slots is kept: a slot claimed later, or given back with records left,
    shows by its tail word alone, read on every pass.
    """
    tail = L.C_TAIL
    return [r for r in readers if r._control[tail] != r._cursor]
