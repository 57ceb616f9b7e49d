"""The reporter's counters and the JSON status document built from them.

The document is what ``swmp status`` / ``swmp health`` read from the arena's status block,
so its key names are a contract (docs/reporter.md lists them). It must fit the block's
document area (just under 8 KiB): the instance list is capped and, as a last resort,
trimmed further and the error text shortened.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from ipc import _layout as L

DOC_LIMIT = L.DOC_MAX - 64  # the status block's document area, with a margin
_MAX_ERROR_CHARS = 300


@dataclass
class Counters:
    """Everything the reporter counts. Plain ints and dicts: updated on the hot path."""

    read: dict[str, int] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)
    retried: int = 0
    failed: int = 0  # batches given up (dropped or spooled after the retry budget)
    dropped: dict[str, int] = field(
        default_factory=lambda: {"invalid": 0, "backend": 0, "unsupported": 0, "spool": 0}
    )
    spooled: int = 0
    replayed: int = 0
    backend_state: str = "unknown"  # unknown | ok | failing
    last_success_ns: int = 0
    last_error: str = ""
    last_error_ns: int = 0
    consecutive_failures: int = 0
    # ProfileTaskQuery commands not run (out of range, incomplete), heard by this reporter. Not
    # in the counter table: a restarted reporter hears the OAP's cached commands again.
    profile_commands_refused: int = 0

    def add(self, table: dict[str, int], key: str, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n

    # -- the arena's counter table (totals that outlive this reporter) ----------------------
    _TABLES = ("read", "sent", "dropped")
    _SCALARS = ("retried", "failed", "spooled", "replayed")

    def flat(self) -> dict[str, int]:
        """Every count under its table name (``sent.segment``, ``dropped.backend``...)."""
        out = {f"{t}.{k}": n for t in self._TABLES for k, n in getattr(self, t).items()}
        out.update((name, getattr(self, name)) for name in self._SCALARS)
        return out

    def seed(self, carried: dict[str, int]) -> None:
        """Start from the totals an earlier reporter of this arena left (``read.*`` and
        ``dropped.spool`` are recomputed from their sources: the publisher adds those)."""
        for name, n in carried.items():
            table, _, key = name.partition(".")
            if table in ("sent", "dropped") and key and name != "dropped.spool":
                self.add(getattr(self, table), key, n)
            elif not key and name in self._SCALARS:
                setattr(self, name, getattr(self, name) + n)

    def success(self) -> None:
        self.backend_state = "ok"
        self.last_success_ns = time.time_ns()
        self.consecutive_failures = 0

    def failure(self, error: str) -> None:
        self.backend_state = "failing"
        self.last_error = error[:_MAX_ERROR_CHARS]
        self.last_error_ns = time.time_ns()
        self.consecutive_failures += 1


class Rates:
    """Records per second over the last status period."""

    def __init__(self) -> None:
        self._t = time.monotonic()
        self._read = 0
        self._sent = 0
        self.read_per_s = 0.0
        self.sent_per_s = 0.0
        self._behind = True  # no totals taken yet, or the last update() could not (no time passed)

    def update(self, read_total: int, sent_total: int) -> None:
        now = time.monotonic()
        dt = now - self._t
        if dt <= 0:
            self._behind = True
            return
        self.read_per_s = round((read_total - self._read) / dt, 1)
        self.sent_per_s = round((sent_total - self._sent) / dt, 1)
        self._t, self._read, self._sent = now, read_total, sent_total
        self._behind = False

    def at_rest(self) -> bool:
        """Both rates are 0 and the last update took its totals: while the totals stay
        those, every update leaves the rates 0."""
        return not self._behind and self.read_per_s == 0.0 and self.sent_per_s == 0.0

    def restart(self, now: float) -> None:
        """What :meth:`update` does when the rates are at rest and neither total moved
        (they stay 0): the next period starts at ``now`` (``time.monotonic()``)."""
        self._t = now


@dataclass(frozen=True)
class InstanceView:
    slot: int
    pid: int
    instance: str
    last_keepalive_ns: int


def build_document(
    *,
    pid: int,
    service: str,
    protocol: str,
    mode: str,
    started_ns: int,
    restarts: int,
    address: str,
    counters: Counters,
    spool_enabled: bool,
    spool_bytes: int,
    spool_cap: int,
    spool_records: int,
    pending_bytes: int,
    instances: list[InstanceView],
    max_instances: int,
    rates: Rates,
    extra: dict[str, Any] | None = None,
) -> bytes:
    c = counters
    doc: dict[str, Any] = {
        "v": 1,
        "pid": pid,
        "service": service,
        "protocol": protocol,
        "mode": mode,
        "started_ns": started_ns,
        "restarts": restarts,
        "backend": {
            "address": address,
            "state": c.backend_state,
            "last_success_ns": c.last_success_ns,
            "last_error": c.last_error,
            "last_error_ns": c.last_error_ns,
            "consecutive_failures": c.consecutive_failures,
        },
        "read": c.read,
        "sent": c.sent,
        "retried": c.retried,
        "failed": c.failed,
        "dropped": c.dropped,
        "spool": {
            "enabled": spool_enabled,
            "bytes": spool_bytes,
            "cap": spool_cap,
            "records": spool_records,
            "spooled": c.spooled,
            "replayed": c.replayed,
        },
        "pending_bytes": pending_bytes,
        "instances": _instances(instances, max_instances),
        "instances_total": len(instances),
        "rates": {"read_per_s": rates.read_per_s, "sent_per_s": rates.sent_per_s},
        "profile": {"commands_refused": c.profile_commands_refused},
    }
    if extra:
        doc.update(extra)
    out = orjson.dumps(doc)
    limit = max_instances
    while len(out) > DOC_LIMIT and limit > 0:
        limit //= 2
        doc["instances"] = _instances(instances, limit)
        out = orjson.dumps(doc)
    if len(out) > DOC_LIMIT:
        doc["backend"]["last_error"] = c.last_error[:40]
        out = orjson.dumps(doc)
    return out


def _instances(instances: list[InstanceView], limit: int) -> dict[str, dict[str, Any]]:
    chosen = sorted(instances, key=lambda i: i.slot)[: max(0, limit)]
    return {
        str(i.slot): {"pid": i.pid, "instance": i.instance, "last_keepalive_ns": i.last_keepalive_ns}
        for i in chosen
    }


# Records the application chose not to send are counted but not "lost".
_NOT_LOST = frozenset({"disabled"})


def exit_summary(
    totals: dict[str, int],
    data_kinds: frozenset[str],
    ring_dropped: int,
    ring_skipped: int,
    ring_unbuilt: int = 0,
    *,
    ring_stale: int = 0,
) -> tuple[int, str]:
    """The one line a reporter logs as it exits: ``(level, message)``.

    ``totals`` are the arena's counter table (since the arena was created); ring drops
    (a full ring, a record too large), records skipped by corruption recovery, records the
    writers could not encode and records a writer's process sent to a writer it had given up
    (``stale``) are counted in the rings' words. Records made before the agent started in a
    process (``prestart``) are not lost to the agent: not listed. WARNING when anything was lost, else INFO.
    """
    sent = [f"{k} {totals.get('sent.' + k, 0)}" for k in sorted(data_kinds) if totals.get("sent." + k)]
    lost = {
        k[8:]: n
        for k, n in sorted(totals.items())
        if k.startswith("dropped.") and n and k[8:] not in _NOT_LOST
    }
    if ring_dropped:
        lost["ring"] = ring_dropped
    if ring_skipped:
        lost["corrupt"] = ring_skipped
    if ring_unbuilt:
        lost["unbuilt"] = ring_unbuilt
    if ring_stale:  # refused by a writer its process had given up (a race at its leave)
        lost["stale"] = ring_stale
    total_lost = sum(lost.values())
    detail = " (" + ", ".join(f"{k} {n}" for k, n in lost.items()) + ")" if lost else ""
    message = (
        f"delivered {', '.join(sent) or 'nothing'}; spooled {totals.get('spooled', 0)}, "
        f"replayed {totals.get('replayed', 0)}; lost {total_lost}{detail}"
    )
    return (logging.WARNING if total_lost else logging.INFO), message
