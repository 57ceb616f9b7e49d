"""The arena's status block: the reporter's heartbeat, named counters and a status document.

Only the process holding the reporter role writes here, so a seqlock is enough for
readers in other processes (``swmp status``, ``swmp health``, the agent's supervisor):
the writer makes the sequence odd, rewrites the document, then makes it even again; a
reader retries while the sequence is odd or changed under it. Readers never block the
writer, and a writer killed mid-update leaves an odd sequence that the next writer resets.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ipc import _layout as L

_barrier_lock = threading.Lock()
_ENTRY = struct.Struct(f"<{L.COUNTER_NAME_MAX}sQ")


def full_barrier() -> None:
    """A full memory barrier from pure Python.

    CPython's lock is a glibc semaphore on Linux: acquiring and releasing it are atomic
    read-modify-write instructions (``lock``-prefixed on x86-64), which order every
    earlier store before every later load.
    """
    _barrier_lock.acquire()
    _barrier_lock.release()


@dataclass(frozen=True)
class StatusSnapshot:
    reporter_pid: int
    heartbeat_ns: int  # time.time_ns() of the last heartbeat, 0 = never
    reporter_started_ns: int
    reporter_starts: int
    reader_sleeping: bool
    wakeups: int
    document: bytes  # whatever the reporter published (the agent uses JSON)
    counters: dict[str, int] = field(default_factory=dict)  # totals since the arena was created

    def heartbeat_age_s(self, now_ns: int | None = None) -> float | None:
        if not self.heartbeat_ns:
            return None
        now = time.time_ns() if now_ns is None else now_ns
        return max(0.0, (now - self.heartbeat_ns) / 1e9)


class StatusBlock:
    def __init__(self, words: memoryview, raw: memoryview) -> None:
        self._w = words  # the block as u64 words
        self._raw = raw  # the block as bytes
        self._entries: dict[str, int] = {}  # writer side: counter name -> table entry
        self.unstored = 0  # counters the last store could not keep (table full, name too long)

    # -- writer side (the reporter) --------------------------------------------------------
    def begin_reporter(self, pid: int) -> None:
        w = self._w
        if w[L.S_SEQ] & 1:  # a previous reporter died mid-update
            w[L.S_SEQ] = w[L.S_SEQ] + 1
        w[L.S_REPORTER_PID] = pid
        w[L.S_REPORTER_STARTED_NS] = time.time_ns()
        w[L.S_REPORTER_STARTS] = w[L.S_REPORTER_STARTS] + 1
        w[L.S_SLEEPING] = 0
        self.heartbeat()

    def heartbeat(self) -> None:
        self._w[L.S_HEARTBEAT_NS] = time.time_ns()

    def publish(self, document: bytes, counters: Mapping[str, int] | None = None) -> bool:
        """Replace the status document and store ``counters`` (see :meth:`store_counters`)
        in one seqlock update; False (document not written) if it is too large."""
        fits = len(document) <= L.DOC_MAX
        w = self._w
        seq = w[L.S_SEQ]
        w[L.S_SEQ] = seq + 1
        if fits:
            self._raw[L.DOC_OFFSET : L.DOC_OFFSET + len(document)] = document
            w[L.S_DOC_LEN] = len(document)
        if counters:
            self._store(counters)
        w[L.S_SEQ] = seq + 2
        return fits

    def store_counters(self, counters: Mapping[str, int]) -> int:
        """Set the named totals (a name seen for the first time takes a new entry); returns
        how many did not fit (table full, name longer than ``COUNTER_NAME_MAX`` bytes)."""
        w = self._w
        seq = w[L.S_SEQ]
        w[L.S_SEQ] = seq + 1
        left = self._store(counters)
        w[L.S_SEQ] = seq + 2
        return left

    def _store(self, counters: Mapping[str, int]) -> int:
        if not self._entries:
            self._entries = {name: i for i, (name, _) in enumerate(self._table())}
        raw, entries, left = self._raw, self._entries, 0
        for name, value in counters.items():
            i = entries.get(name)
            if i is None:
                key = name.encode("ascii", "replace")
                used = len(entries)
                if len(key) > L.COUNTER_NAME_MAX or used >= L.COUNTERS_MAX:
                    left += 1
                    continue
                i = entries[name] = used
                _ENTRY.pack_into(raw, L.COUNTERS_OFFSET + i * L.COUNTER_ENTRY, key, 0)
                self._w[L.S_COUNTERS] = used + 1
            self._w[(L.COUNTERS_OFFSET + i * L.COUNTER_ENTRY + L.COUNTER_NAME_MAX) // 8] = max(0, value)
        self.unstored = left
        return left

    def _table(self) -> list[tuple[str, int]]:
        out = []
        raw = self._raw
        for i in range(min(int(self._w[L.S_COUNTERS]), L.COUNTERS_MAX)):
            key, value = _ENTRY.unpack_from(raw, L.COUNTERS_OFFSET + i * L.COUNTER_ENTRY)
            out.append((key.rstrip(b"\0").decode("ascii", "replace"), int(value)))
        return out

    def set_sleeping(self, sleeping: bool) -> None:
        """Tell writers whether to ring the doorbell.

        Protocol for the reader: ``set_sleeping(True)``, then check every ring for pending
        records, and only then wait (with a timeout: the bounded poll). The full barrier
        after the store keeps the x86-64 store buffer from delaying it past those checks;
        writers load the flag after their own barrier (their lock release), so either the
        reader sees the record or the writer sees the flag (no lost wake-up), and the
        timeout covers any platform where that reasoning does not hold.
        """
        self._w[L.S_SLEEPING] = 1 if sleeping else 0
        if sleeping:
            full_barrier()

    def count_wakeup(self) -> None:
        self._w[L.S_WAKEUPS] = self._w[L.S_WAKEUPS] + 1

    def release(self) -> None:
        """Drop this block's views of the mapping (the arena is closing)."""
        self._w.release()
        self._raw.release()

    def end_reporter(self) -> None:
        self._w[L.S_REPORTER_PID] = 0
        self._w[L.S_SLEEPING] = 0

    # -- reader side (anyone) --------------------------------------------------------------
    def snapshot(self, attempts: int = 1000) -> StatusSnapshot:
        w = self._w
        doc = b""
        table: list[tuple[str, int]] = []
        for _ in range(attempts):
            seq = w[L.S_SEQ]
            if seq & 1:
                continue
            n = w[L.S_DOC_LEN]
            doc = bytes(self._raw[L.DOC_OFFSET : L.DOC_OFFSET + min(n, L.DOC_MAX)])
            table = self._table()
            if w[L.S_SEQ] == seq:
                break
        else:
            # The writer died mid-update or is rewriting constantly: no document; the
            # counters are still worth showing (each value is one atomic word).
            doc = b""
            table = self._table()
        return StatusSnapshot(
            reporter_pid=w[L.S_REPORTER_PID],
            heartbeat_ns=w[L.S_HEARTBEAT_NS],
            reporter_started_ns=w[L.S_REPORTER_STARTED_NS],
            reporter_starts=w[L.S_REPORTER_STARTS],
            reader_sleeping=bool(w[L.S_SLEEPING]),
            wakeups=w[L.S_WAKEUPS],
            document=doc,
            counters=dict(table),
        )
