"""The arena's board: one small blob the reporter publishes to every writer of the arena.

The reverse direction of the rings: the reporter (the only writer, it holds the reporter
role) posts a document, every application process reads it. What the bytes mean is the
users' business (the agent posts its active profiling tasks).

The generation word is a seqlock sequence: odd while the blob is being rewritten, +2 for
every publication. A reader that only wants to know "has anything changed?" loads that
one word (:meth:`Board.generation`, a ``memoryview`` element read: tens of nanoseconds)
and compares it with the generation it last read; only on a change does it copy the blob,
retrying while the sequence is odd or moved under it. Readers never block the writer, and
a writer killed mid-update leaves an odd sequence that the next writer's publication
repairs (see the status block, which uses the same scheme).
"""

from __future__ import annotations

from ipc import _layout as L

GENERATION = L.B_GENERATION


class BoardTooLarge(ValueError):
    """The document does not fit in the board."""


class Board:
    def __init__(self, words: memoryview, raw: memoryview) -> None:
        self._w = words  # the board as u64 words
        self._raw = raw  # the board as bytes
        # For hot paths that check for changes without a method call:
        # ``board.words[GENERATION]`` is :meth:`generation`.
        self.words = words

    # -- writer side (the reporter) --------------------------------------------------------
    def publish(self, document: bytes) -> int:
        """Replace the document; returns its generation. Raises BoardTooLarge."""
        if len(document) > L.BOARD_DATA_MAX:
            raise BoardTooLarge(f"{len(document)} bytes, the board holds {L.BOARD_DATA_MAX}")
        w = self._w
        seq = w[L.B_GENERATION]
        seq += 1 if seq & 1 else 0  # a writer died mid-update: start from the next even value
        w[L.B_GENERATION] = seq + 1
        self._raw[L.BOARD_DATA_OFFSET : L.BOARD_DATA_OFFSET + len(document)] = document
        w[L.B_LEN] = len(document)
        w[L.B_GENERATION] = seq + 2
        return seq + 2

    # -- reader side (anyone) --------------------------------------------------------------
    def generation(self) -> int:
        """The current generation (odd: a publication is under way)."""
        return self._w[L.B_GENERATION]

    def read(self, attempts: int = 1000) -> tuple[int, bytes] | None:
        """``(generation, document)``, or None if no stable copy could be taken."""
        w = self._w
        for _ in range(attempts):
            seq = w[L.B_GENERATION]
            if seq & 1:
                continue
            n = min(w[L.B_LEN], L.BOARD_DATA_MAX)
            doc = bytes(self._raw[L.BOARD_DATA_OFFSET : L.BOARD_DATA_OFFSET + n])
            if w[L.B_GENERATION] == seq:
                return seq, doc
        return None

    def release(self) -> None:
        self._w.release()
        self._raw.release()
