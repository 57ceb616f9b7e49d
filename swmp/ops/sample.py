"""One reading of an arena: header meta, the reporter's status block and every ring's counters.

Health and status compare two readings taken ``--interval`` apart, so a reading carries
both clocks: wall time (heartbeats and the status document use ``time.time_ns()``) and a
monotonic time for the length of the interval.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import orjson

from ipc import RingStats, StatusSnapshot
from ipc.lost import LostCounts
from swmp.ops.locate import Target
from swmp.ops.mask import mask

NOTHING_LOST = LostCounts(0, 0, 0)


@dataclass(frozen=True)
class SlotSample:
    slot: int
    pid: int | None  # live holder of the slot lock; None when nobody holds it
    last_pid: int  # last process that claimed the slot (may be gone)
    claims: int
    stats: RingStats

    @property
    def in_use(self) -> bool:
        """Worth showing: held now, or holding data, or ever written to."""
        return self.pid is not None or self.stats.used > 0 or self.claims > 0


@dataclass(frozen=True)
class Sample:
    path: str
    wall_ns: int
    mono_s: float
    owner_pid: int
    owner_alive: bool
    created_ns: int
    meta: dict[str, Any]
    reporter_pid: int | None  # holder of the reporter lock: the one live reporter
    status: StatusSnapshot
    document: dict[str, Any] | None  # the reporter's published status (masked), if any
    document_error: str
    slots: tuple[SlotSample, ...]
    # Records no ring took (arena header): workers without a slot, and inert helpers.
    lost: LostCounts = NOTHING_LOST

    # -- conveniences over the status document (which may be missing or partial) -------------
    def doc_dict(self, key: str) -> dict[str, Any]:
        value = (self.document or {}).get(key)
        return value if isinstance(value, dict) else {}

    def doc_int(self, key: str) -> int | None:
        value = (self.document or {}).get(key)
        return number(value) if isinstance(value, int) and not isinstance(value, bool) else None

    def reporter_started_ns(self) -> int:
        started = self.doc_int("started_ns")
        return started if started else int(self.status.reporter_started_ns)

    def reporter_uptime_s(self) -> float | None:
        started = self.reporter_started_ns()
        if not started:
            return None
        return max(0.0, (self.wall_ns - started) / 1e9)

    def backend(self) -> dict[str, Any]:
        return self.doc_dict("backend")

    def backend_state(self) -> str:
        """``ok``, ``failing`` or ``unknown`` (also for anything a reporter might invent)."""
        state = self.backend().get("state")
        return state if state in ("ok", "failing") else "unknown"


def parse_document(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    if not raw:
        return None, "no status document published"
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, f"unreadable status document: {exc}"
    if not isinstance(value, dict):
        return None, "status document is not a JSON object"
    return mask(value), ""


def take(target: Target) -> Sample:
    """Read everything the CLI needs from ``target``'s arena, as one snapshot."""
    arena = target.arena
    mono = time.monotonic()
    wall = time.time_ns()
    status = arena.status.snapshot()
    reporter = arena.reporter_pid()
    slots = []
    for slot in range(arena.slots):
        last_pid, claims, _claimed_ns = arena.slot_identity(slot)
        slots.append(
            SlotSample(
                slot=slot,
                pid=arena.slot_owner(slot),
                last_pid=last_pid,
                claims=claims,
                stats=arena.ring_stats(slot),
            )
        )
    document, error = parse_document(status.document)
    info = target.info
    return Sample(
        path=target.path,
        wall_ns=wall,
        mono_s=mono,
        owner_pid=info.owner_pid,
        owner_alive=info.owner_alive,
        created_ns=info.created_ns,
        meta=target.meta,
        reporter_pid=reporter,
        status=status,
        document=document,
        document_error=error,
        slots=tuple(slots),
        lost=_lost(target),
    )


def _lost(target: Target) -> LostCounts:
    """What no ring took: the arena's header counts, plus (thread mode) the application's
    from its name registry, on the one target that carries it."""
    own = target.arena.lost_counts()
    if target.registry is None:
        return own
    app = target.registry.lost_counts()
    return LostCounts(
        no_slot_records=own.no_slot_records + app.no_slot_records,
        no_slot_workers=own.no_slot_workers + app.no_slot_workers,
        helper_records=own.helper_records + app.helper_records,
        master_records=own.master_records + app.master_records,
        late_records=own.late_records + app.late_records,
    )


_I64 = (1 << 63) - 1


def number(value: Any) -> int:
    """An integer counter from the document; anything else counts as 0.

    Clamped to the signed 64-bit range, which is all a JSON consumer can be trusted with.
    """
    if isinstance(value, bool):
        return 0
    if isinstance(value, float) and math.isfinite(value):
        value = int(value)
    if isinstance(value, int):
        return _clamp(value)
    return 0


def _clamp(value: int) -> int:
    return max(-_I64, min(_I64, value))


def counter_sum(value: Any) -> int:
    """Sum of a counter or a ``{kind: counter}`` map (the document uses both), clamped like
    each of its terms (two terms near the limits would sum past it)."""
    if isinstance(value, dict):
        return _clamp(sum(number(v) for v in value.values()))
    return number(value)


def delta(after: int, before: int) -> int:
    """Growth of a counter; a counter that went backwards was reset (a new reporter)."""
    return _clamp(after - before) if after >= before else after
