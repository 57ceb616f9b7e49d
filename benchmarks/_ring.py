"""The agent's sink for the benchmarks: a real shared-memory ring (an ipc Arena in a private
temporary directory), as a worker writes into, drained by the benchmark where the reporter
would read it (untimed: the reporter's part is not the worker's cost).

The ring is the one the agent makes (``SW_AGENT_RING_SIZE``, 4 MiB by default) and it has
gone round once (:meth:`Ring.warm`), as the ring of a worker that has served for a while has.
Writes then pay what a worker's writes pay on every lap: the ring gives the pages the reader
has read back at every stretch (``ipc/ring_pages.py``), and the kernel allocates and zeroes
a tmpfs page for each one written again, ~4 us per 4 KiB on this project's VM (~0.3 us per
300-byte segment; docs/performance.md). A benchmark that never drains while it times pays it
on the first lap only.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

# Records of one page each (header included): a lap is then one write per page.
_FILLER = bytes(4096 - 8)
_FILLER_TYPE = 1


def agent_ring_size() -> int:
    """The ring size the agent would use here (``SW_AGENT_RING_SIZE`` or its default)."""
    from swmp.config import load

    return int(load().agent_ring_size)


def ring_size_for(records: int, record_bytes: int = 2048) -> int:
    """The agent's ring size, or the power of two above ``records`` records of up to
    ``record_bytes`` when a benchmark writes that many between two drains."""
    return max(agent_ring_size(), 1 << (records * record_bytes).bit_length())


class Ring:
    """Installed as swmp's sink on creation; :meth:`close` takes it out and removes the arena."""

    def __init__(self, capacity: int | None = None) -> None:
        import ipc
        from swmp import _sink

        self._tmp = tempfile.TemporaryDirectory(prefix="swmp-bench-")
        self.capacity = capacity if capacity is not None else agent_ring_size()
        self.arena = ipc.Arena.create(
            str(Path(self._tmp.name) / "b.arena"), slots=1, ring_capacity=self.capacity
        )
        writer = self.arena.claim_slot()
        assert writer is not None
        self.writer = writer
        self.reader = self.arena.reader(writer.slot)
        self.warm()
        _sink.set_sink(writer)

    def warm(self) -> None:
        """Go round the ring once (filler records, drained as a reporter would), so that the
        next writes pay what a worker's pay on every lap (see the module's docstring)."""
        self.drain()
        write = self.writer.write
        for written in range(1, self.capacity // 4096 + 2):
            if not write(_FILLER_TYPE, _FILLER):
                self.drain()  # full: read it, as the reporter would, and carry on
                write(_FILLER_TYPE, _FILLER)
            if written % 64 == 0:
                self.drain()
        self.drain()

    def drain(self) -> int:
        """Read everything written so far, as the reporter would; the number of records."""
        n = 0
        while records := self.reader.read(100_000):
            n += len(records)
            self.reader.commit()
        return n

    def discard(self) -> None:
        """Take the ring out and remove its arena without reading it back (a measured
        process about to exit: reading the ring is the reporter's cost, not the one measured)."""
        from swmp import _sink

        _sink.set_sink(None)
        self.arena.unlink()
        self._tmp.cleanup()

    def close(self) -> None:
        from swmp import _sink

        _sink.set_sink(None)
        self.drain()
        dropped = self.writer.stats().dropped_records
        if dropped:
            print(f"warning: the ring dropped {dropped} records", file=sys.stderr)
        self.arena.unlink()
        self._tmp.cleanup()
