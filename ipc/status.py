"""The arena's status block: the reporter's heartbeat and an opaque status document.

Only the process holding the reporter role writes here, so a seqlock is enough for
readers in other processes (``swmp status``, ``swmp health``, the agent's supervisor):
the writer makes the sequence odd, rewrites the document, then makes it even again; a
reader retries while the sequence is odd or changed under it. Readers never block the
writer, and a writer killed mid-update leaves an odd sequence that the next writer resets.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from ipc import _layout as L

_barrier_lock = threading.Lock()


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

    def heartbeat_age_s(self, now_ns: int | None = None) -> float | None:
        if not self.heartbeat_ns:
            return None
        now = time.time_ns() if now_ns is None else now_ns
        return max(0.0, (now - self.heartbeat_ns) / 1e9)


class StatusBlock:
    def __init__(self, words: memoryview, raw: memoryview) -> None:
        self._w = words  # the block as u64 words
        self._raw = raw  # the block as bytes

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

    def publish(self, document: bytes) -> bool:
        """Replace the status document; False (nothing written) if it is too large."""
        if len(document) > L.DOC_MAX:
            return False
        w = self._w
        seq = w[L.S_SEQ]
        w[L.S_SEQ] = seq + 1
        self._raw[L.DOC_OFFSET : L.DOC_OFFSET + len(document)] = document
        w[L.S_DOC_LEN] = len(document)
        w[L.S_SEQ] = seq + 2
        return True

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
        for _ in range(attempts):
            seq = w[L.S_SEQ]
            if seq & 1:
                continue
            n = w[L.S_DOC_LEN]
            doc = bytes(self._raw[L.DOC_OFFSET : L.DOC_OFFSET + min(n, L.DOC_MAX)])
            if w[L.S_SEQ] == seq:
                break
        else:
            doc = b""  # the writer died mid-update or is rewriting constantly: no document
        return StatusSnapshot(
            reporter_pid=w[L.S_REPORTER_PID],
            heartbeat_ns=w[L.S_HEARTBEAT_NS],
            reporter_started_ns=w[L.S_REPORTER_STARTED_NS],
            reporter_starts=w[L.S_REPORTER_STARTS],
            reader_sleeping=bool(w[L.S_SLEEPING]),
            wakeups=w[L.S_WAKEUPS],
            document=doc,
        )
