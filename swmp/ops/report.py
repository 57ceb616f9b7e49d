"""The CLI's JSON documents: one builder for ``swmp health``, one for ``swmp status``.

The text renderers read these same dictionaries, so ``--json`` and the tables can never
disagree. The shapes are a public contract (docs/operations.md, ``swmp.ops.schema``): add
fields freely, never rename or remove one without bumping ``v``.
"""

from __future__ import annotations

import time
from typing import Any

from swmp.ops.checks import Check, Thresholds, healthy
from swmp.ops.sample import Sample, counter_sum, delta, number

VERSION = 1
EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_NO_AGENT = 0, 1, 2


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def identity(s: Sample) -> dict[str, Any]:
    """Who the agent is, from the arena header meta (already masked)."""
    m = s.meta
    backends = m.get("backends")
    auth = m.get("authentication")
    return {
        "arena": s.path,
        "service": _str(m.get("service")),
        "namespace": _str(m.get("namespace")),
        "instance": _str(m.get("instance")),
        "protocol": _str(m.get("protocol")) or _str((s.document or {}).get("protocol")),
        "mode": _str(m.get("mode")) or _str((s.document or {}).get("mode")),
        "backends": [b for b in backends if isinstance(b, str)] if isinstance(backends, list) else [],
        "authentication": auth if isinstance(auth, str) else "",
        "owner_pid": s.owner_pid,
        "owner_alive": s.owner_alive,
        "created_ns": s.created_ns,
    }


# -- health -------------------------------------------------------------------------------
def health_report(
    results: list[tuple[Sample, list[Check]]],
    *,
    mode: str,
    limits: Thresholds,
    interval_s: float,
    notes: list[str],
    error: str = "",
) -> dict[str, Any]:
    agents = []
    for sample, checks in results:
        ident = identity(sample)
        agents.append(
            {
                "arena": ident["arena"],
                "service": ident["service"],
                "namespace": ident["namespace"],
                "owner_pid": ident["owner_pid"],
                "reporter_pid": sample.reporter_pid,
                "healthy": healthy(checks),
                "checks": [c.as_dict() for c in checks],
            }
        )
    if error or not agents:
        code = EXIT_NO_AGENT
    elif all(a["healthy"] for a in agents):
        code = EXIT_HEALTHY
    else:
        code = EXIT_UNHEALTHY
    return {
        "v": VERSION,
        "command": "health",
        "mode": mode,
        "healthy": code == EXIT_HEALTHY,
        "exit_code": code,
        "time_ns": time.time_ns(),
        "interval_s": interval_s,
        "thresholds": limits.as_dict(),
        "agents": agents,
        "error": error or None,
        "notes": list(notes),
    }


# -- status -------------------------------------------------------------------------------
def _age(now_ns: int, then: Any) -> float | None:
    if isinstance(then, int) and not isinstance(then, bool) and then > 0:
        return max(0.0, (now_ns - then) / 1e9)
    return None


def _per_s(after: int, before: int, seconds: float | None) -> float | None:
    if seconds is None or seconds <= 0:
        return None
    return delta(after, before) / seconds


def _counts(value: Any) -> dict[str, int]:
    return {str(k): number(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def status_agent(before: Sample | None, s: Sample) -> dict[str, Any]:
    doc = s.document or {}
    now = s.wall_ns
    seconds = (s.mono_s - before.mono_s) if before is not None else None
    instances = doc.get("instances") if isinstance(doc.get("instances"), dict) else {}
    backend = s.backend()
    spool = s.doc_dict("spool")

    slots = []
    prev = {sl.slot: sl for sl in before.slots} if before is not None else {}
    for sl in s.slots:
        if not sl.in_use:
            continue
        st = sl.stats
        inst = instances.get(str(sl.slot)) if isinstance(instances, dict) else None
        inst = inst if isinstance(inst, dict) else {}
        p = prev.get(sl.slot)
        slots.append(
            {
                "slot": sl.slot,
                "pid": sl.pid,
                "alive": sl.pid is not None,
                "last_pid": sl.last_pid or None,
                "instance": _str(inst.get("instance")),
                "last_keepalive_age_s": _age(now, inst.get("last_keepalive_ns")),
                "written": st.written_records,
                "dropped": st.dropped_records,
                # Records the slot's worker could not encode (never in the ring).
                "unbuilt": st.unbuilt_records,
                # Records its workers sent to a writer they had given up (lost), and records
                # they made before they had a ring (the agent not started: not reported).
                "stale": st.stale_records,
                "prestart": st.prestart_records,
                # Incoming headers its workers refused as malformed (not records: not a loss).
                "bad_input": st.bad_input,
                "read": st.read_records,
                "used_bytes": st.used,
                "capacity": st.capacity,
                "fill_ratio": st.fill_ratio,
                "high_water": st.high_water,
                "records_per_s": _per_s(st.written_records, p.stats.written_records, seconds) if p else None,
            }
        )

    written = sum(sl.stats.written_records for sl in s.slots)
    ring_dropped = sum(sl.stats.dropped_records for sl in s.slots)
    # Records lost to corruption recovery (bytes the reader had to skip).
    ring_skipped = sum(sl.stats.skipped_records for sl in s.slots)
    # Records the workers could not encode (a value the encoder refuses even escaped).
    unbuilt = sum(sl.stats.unbuilt_records for sl in s.slots)
    stale = sum(sl.stats.stale_records for sl in s.slots)
    prestart = sum(sl.stats.prestart_records for sl in s.slots)
    bad_input = sum(sl.stats.bad_input for sl in s.slots)
    written_before = sum(sl.stats.written_records for sl in before.slots) if before is not None else 0
    rates = s.doc_dict("rates")
    ident = identity(s)
    return {
        **ident,
        "reporter": {
            "pid": s.reporter_pid,
            "alive": s.reporter_pid is not None,
            "last_pid": int(s.status.reporter_pid) or s.doc_int("pid") or None,
            "started_ns": s.reporter_started_ns(),
            "uptime_s": s.reporter_uptime_s() if s.reporter_pid is not None else None,
            "starts": int(s.status.reporter_starts),
            "restarts": s.doc_int("restarts"),
            "heartbeat_age_s": s.status.heartbeat_age_s(now),
            "sleeping": s.status.reader_sleeping,
            "document": s.document is not None,
            "document_error": s.document_error or None,
        },
        "backend": {
            "address": _str(backend.get("address")),
            "state": s.backend_state(),
            "last_success_age_s": _age(now, backend.get("last_success_ns")),
            "last_error": _str(backend.get("last_error")) or "",
            "last_error_age_s": _age(now, backend.get("last_error_ns")),
            "consecutive_failures": number(backend.get("consecutive_failures")),
        },
        "totals": {
            "written": written,
            "ring_dropped": ring_dropped,
            "ring_skipped": ring_skipped,
            "unbuilt": unbuilt,
            "stale": stale,
            "prestart": prestart,
            "bad_input": bad_input,
            "read": counter_sum(doc.get("read")),
            "sent": counter_sum(doc.get("sent")),
            "retried": number(doc.get("retried")),
            "failed": number(doc.get("failed")),
            "reporter_dropped": counter_sum(doc.get("dropped")),
            # Records no ring took: workers that found every slot taken (lost), helpers
            # forked by workers (inert by design), the prefork master's (no ring for them),
            # those of a process after its goodbye at exit (late). Thread mode: the
            # application's, shown with one of its processes.
            "no_slot_dropped": s.lost.no_slot_records,
            "no_slot_workers": s.lost.no_slot_workers,
            "helper_dropped": s.lost.helper_records,
            "master_dropped": s.lost.master_records,
            "late_dropped": s.lost.late_records,
            # Records ever spooled, when the reporter says; else what the spool holds now.
            "spooled": number(spool.get("spooled", spool.get("records"))),
        },
        "read": _counts(doc.get("read")),
        "sent": _counts(doc.get("sent")),
        "dropped": _counts(doc.get("dropped")),
        "spool": {
            "enabled": bool(spool.get("enabled")),
            "bytes": number(spool.get("bytes")),
            "cap": number(spool.get("cap")),
            "records": number(spool.get("records")),
        },
        "pending_bytes": number(doc.get("pending_bytes")),
        "rates": {
            "written_per_s": _per_s(written, written_before, seconds),
            "read_per_s": _float(rates.get("read_per_s")),
            "sent_per_s": _float(rates.get("sent_per_s")),
        },
        "slots": slots,
        "idle_slots": sum(1 for sl in s.slots if not sl.in_use),
        # Profile tasks the OAP sent that the reporter did not run (0 from older reporters).
        "profile": {"commands_refused": number(s.doc_dict("profile").get("commands_refused"))},
    }


def status_report(
    pairs: list[tuple[Sample | None, Sample]], *, interval_s: float, notes: list[str], error: str = ""
) -> dict[str, Any]:
    return {
        "v": VERSION,
        "command": "status",
        "time_ns": time.time_ns(),
        "interval_s": interval_s,
        "agents": [status_agent(b, a) for b, a in pairs],
        "error": error or None,
        "notes": list(notes),
    }
