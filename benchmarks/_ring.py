"""The agent's sink for the benchmarks: a real shared-memory ring (an ipc Arena in a private
temporary directory), as a worker writes into, drained by the benchmark where the reporter
would read it (untimed: the reporter's part is not the worker's cost)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path


class Ring:
    """Installed as swmp's sink on creation; :meth:`close` takes it out and removes the arena."""

    def __init__(self, capacity: int = 32 << 20) -> None:
        import ipc
        from swmp import _sink

        self._tmp = tempfile.TemporaryDirectory(prefix="swmp-bench-")
        self.arena = ipc.Arena.create(str(Path(self._tmp.name) / "b.arena"), slots=1, ring_capacity=capacity)
        writer = self.arena.claim_slot()
        assert writer is not None
        self.writer = writer
        self.reader = self.arena.reader(writer.slot)
        _sink.set_sink(writer)

    def drain(self) -> None:
        while self.reader.read(100_000):
            self.reader.commit()

    def close(self) -> None:
        from swmp import _sink

        _sink.set_sink(None)
        self.drain()
        dropped = self.writer.stats().dropped_records
        if dropped:
            print(f"warning: the ring dropped {dropped} records", file=sys.stderr)
        self.arena.unlink()
        self._tmp.cleanup()
