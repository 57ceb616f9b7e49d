"""The ledger: which ring bytes may be handed back to the writers.

Delivery is at-least-once: a ring position is committed only when every record before it
has been *resolved* (sent, spooled, or deliberately given up and counted). A reporter that
dies leaves its unresolved records in the rings, and the next one reads them again (a ring
reader starts at the committed head).

Records travel in :class:`Batch` es (one kind each) that mix records of many ring reads;
each read is a :class:`Chunk` that knows how many of its records are still unresolved.
The ledger also counts the payload bytes held in memory (``pending_bytes``): the memory cap
compares real payload bytes, since a batch keeps its records as the raw bytes read from the
ring until the moment it is sent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any


def _nothing() -> None:
    pass


def _ignore(slot: int, position: int) -> None:
    pass


class Chunk:
    """The records one ``read()`` took from one ring; the ring head may pass ``end`` once
    every record in it is resolved."""

    __slots__ = ("end", "left", "slot")

    def __init__(self, slot: int, end: int) -> None:
        self.slot = slot
        self.end = end
        self.left = 0


class Batch:
    """Records of one kind on their way out, as raw ring payloads until they are sent."""

    __slots__ = ("chunks", "decoded", "kind", "nbytes", "payloads", "spilled")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.payloads: list[bytes] = []
        # Decoded records, filled by delivery just before the first send attempt.
        self.decoded: list[list[Any]] | None = None
        self.chunks: dict[Chunk, int] = {}
        self.nbytes = 0
        self.spilled = False  # already copied to the spool (and resolved)

    def __len__(self) -> int:
        return len(self.payloads) if self.decoded is None else len(self.decoded)


class Ledger:
    """Chunks per ring slot, in read order; commits each ring as far as it is resolved.

    ``commit(slot, position)`` hands ring space back (``RingReader.commit``); ``on_freed``
    is called when a batch is resolved (memory was freed: a reader held back may go on).
    """

    def __init__(self, commit: Callable[[int, int], None], on_freed: Callable[[], None] = _nothing) -> None:
        self._commit = commit
        self.on_freed = on_freed
        self._chunks: dict[int, deque[Chunk]] = {}
        self.pending_bytes = 0
        # Commits of negative keys: rings not of the arena (``reporter_proc.adoption``).
        self.foreign: Callable[[int, int], None] = _ignore

    def open(self, slot: int, end: int) -> Chunk:
        """A new read from ``slot`` that ended at ring position ``end``."""
        chunk = Chunk(slot, end)
        self._chunks.setdefault(slot, deque()).append(chunk)
        return chunk

    def hold(self, batch: Batch, chunk: Chunk, payload: bytes) -> None:
        """``payload`` (read in ``chunk``) joins ``batch``: unresolved until the batch is."""
        batch.payloads.append(payload)
        n = len(payload)
        batch.nbytes += n
        self.pending_bytes += n
        batch.chunks[chunk] = batch.chunks.get(chunk, 0) + 1
        chunk.left += 1

    def close(self, chunk: Chunk) -> None:
        """The read is fully dispatched: commit now if nothing of it is held."""
        if chunk.left == 0:
            self._advance(chunk.slot)

    def release(self, batch: Batch) -> None:
        """Hand ``batch``'s ring bytes back before it is resolved: from now on it lives only in
        the reporter's memory (still counted in ``pending_bytes``), so the writers can go on
        while the backend is down. The price: a reporter killed now loses it."""
        for chunk, n in batch.chunks.items():
            chunk.left -= n
            if chunk.left == 0:
                self._advance(chunk.slot)
        batch.chunks = {}

    def resolve(self, batch: Batch) -> None:
        """Every record of ``batch`` is sent, spooled or counted: its ring bytes may go."""
        for chunk, n in batch.chunks.items():
            chunk.left -= n
            if chunk.left == 0:
                self._advance(chunk.slot)
        batch.chunks = {}
        self.pending_bytes -= batch.nbytes
        batch.nbytes = 0
        self.on_freed()

    def _advance(self, slot: int) -> None:
        """Commit the ring head past every leading chunk that is fully resolved."""
        dq = self._chunks[slot]
        last = None
        while dq and dq[0].left == 0:
            last = dq.popleft()
        if last is not None:
            (self._commit if slot >= 0 else self.foreign)(slot, last.end)

    def forget(self, slot: int) -> None:
        """``slot``'s ring is gone (an adopted one, read to the end): drop its empty queue."""
        self._chunks.pop(slot, None)
