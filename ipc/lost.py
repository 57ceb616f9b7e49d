"""Counts of the records that no ring took, kept in the arena header.

Such a record was written in a process that has no ring (and so no slot counters to count
it in); the process adds its counts to the application's arena header instead
(``Arena.add_counts``, under a byte-range lock: several processes add). Words an older arena
never had read 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from ipc import _layout as L


@dataclass(frozen=True)
class LostCounts:
    """Records written where no ring could take them, counted in the arena header."""

    no_slot_records: int  # by workers that found every slot taken: lost telemetry
    no_slot_workers: int  # workers that found every slot taken (once each)
    helper_records: int  # in helpers (forked by a worker): inert by design
    master_records: int = 0  # in a prefork master without a ring for them (thread mode: all)
    late_records: int = 0  # in a process after its goodbye (at exit): its ring is given back

    @classmethod
    def read(cls, header: memoryview) -> LostCounts:
        """The counts in ``header`` (the arena header viewed as u64 words)."""
        return cls(
            no_slot_records=int(header[L.H_NO_SLOT_RECORDS]),
            no_slot_workers=int(header[L.H_NO_SLOT_WORKERS]),
            helper_records=int(header[L.H_HELPER_RECORDS]),
            master_records=int(header[L.H_MASTER_RECORDS]),
            late_records=int(header[L.H_LATE_RECORDS]),
        )
