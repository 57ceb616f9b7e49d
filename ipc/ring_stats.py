"""Counters of one ring, as a snapshot (both ends of the ring read them; see ``ring.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from ipc import _layout as L


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
    # Records the writer's process could not encode (never in the ring; see _layout).
    unbuilt_records: int = 0
    # Records the writer's process made before it had a ring, and records an earlier, disabled
    # writer of that process refused (see _layout); never in the ring.
    prestart_records: int = 0
    stale_records: int = 0
    # Incoming headers the writer's process refused as malformed (see _layout.C_BAD_INPUT).
    bad_input: int = 0

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
        unbuilt_records=control[L.C_UNBUILT_RECORDS],
        prestart_records=control[L.C_PRESTART_RECORDS],
        stale_records=control[L.C_STALE_RECORDS],
        bad_input=control[L.C_BAD_INPUT],
    )
