"""A process's counts of the records it dropped for want of a ring (``swmp._runtime``), and
the shared arena header words they are added to (``ipc.Arena.add_counts``)."""

from __future__ import annotations

from ipc import _layout as L

__all__ = ["LABELS", "header_counts", "no_counts"]


def no_counts() -> dict[str, int]:
    return {"no_slot": 0, "helper": 0, "master": 0, "late": 0, "workers": 0}


# How ``swmp status`` names each count (the report at exit uses the same words).
LABELS = {"no_slot": "no slot", "helper": "helpers", "master": "master", "late": "after exit"}


def header_counts(counts: dict[str, int]) -> dict[int, int]:
    """A process's drop counts as increments of the shared arena's header words."""
    return {
        L.H_NO_SLOT_RECORDS: counts["no_slot"],
        L.H_NO_SLOT_WORKERS: counts["workers"],
        L.H_HELPER_RECORDS: counts["helper"],
        L.H_MASTER_RECORDS: counts["master"],
        L.H_LATE_RECORDS: counts["late"],
    }
