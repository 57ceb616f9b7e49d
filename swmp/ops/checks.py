"""The health checks behind ``swmp health``.

Each check looks at two readings of one arena (``before`` is None when ``--interval 0``
asks for totals instead of an interval) and returns a :class:`Check`: a name, ``ok`` /
``fail`` / ``skip``, one sentence saying why, and the figures it used. Every check is
always evaluated so ``--json`` shows the whole picture; the probe mode only decides which
ones count towards the exit status:

* liveness  - what restarting the pod would fix: reporter alive, heartbeat fresh, rings
  drained;
* readiness - liveness plus the backend being reachable;
* all       - readiness plus the drop ratio, the spool's size and the supervisor (which
  restarts a reporter that dies).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ipc import process_alive
from swmp.ops import fmt
from swmp.ops.sample import Sample, counter_sum, delta, number

CHECKS: tuple[str, ...] = ("reporter", "heartbeat", "rings", "backend", "drops", "spool", "supervisor")
MODES: dict[str, tuple[str, ...]] = {
    "liveness": ("reporter", "heartbeat", "rings"),
    "readiness": ("reporter", "heartbeat", "rings", "backend"),
    "all": CHECKS,
}
OK, FAIL, SKIP = "ok", "fail", "skip"


@dataclass(frozen=True)
class Thresholds:
    """The limits of the checks. These defaults are the only declaration of them: ``swmp
    health``'s options (``--max-heartbeat-age``...) default to them and show them in --help."""

    max_heartbeat_age_s: float = 10.0
    backend_window_s: float = 60.0
    backend_failures: int = 3  # consecutive failed attempts that fail the check at once; 0 = off
    max_drop_ratio: float = 0.01

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Check:
    name: str
    status: str
    message: str
    figures: dict[str, Any] = field(default_factory=dict)
    selected: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "selected": self.selected,
            "message": self.message,
            "figures": self.figures,
        }


def evaluate(before: Sample | None, after: Sample, limits: Thresholds, mode: str = "all") -> list[Check]:
    """Run every check; mark the ones outside ``mode`` as not selected."""
    selected = set(MODES[mode])
    checks = [
        check_reporter(after),
        check_heartbeat(after, limits),
        check_rings(before, after),
        check_backend(after, limits),
        check_drops(before, after, limits),
        check_spool(after),
        check_supervisor(after),
    ]
    for c in checks:
        c.selected = c.name in selected
    return checks


def healthy(checks: list[Check]) -> bool:
    return not any(c.selected and c.status == FAIL for c in checks)


# -- reporter -----------------------------------------------------------------------------
def check_reporter(s: Sample) -> Check:
    # The status block forgets the pid on a clean exit; the last document still names it.
    last = int(s.status.reporter_pid) or (s.doc_int("pid") or 0)
    restarts = s.doc_int("restarts")
    figures = {
        "pid": s.reporter_pid,
        "last_pid": last or None,
        "starts": int(s.status.reporter_starts),
        "restarts": restarts,
        "uptime_s": s.reporter_uptime_s() if s.reporter_pid else None,
    }
    if s.reporter_pid is None:
        # "Holds the reporter lock" is the definition of a live reporter (see ipc.arena).
        why = "no live reporter process"
        if last:
            why += f" (the last one, pid {last}, is gone)"
        elif not s.status.reporter_starts:
            why += " (none has ever started)"
        return Check("reporter", FAIL, why, figures)
    up = fmt.duration(figures["uptime_s"])
    extra = f", {restarts} restart(s)" if restarts else ""
    return Check("reporter", OK, f"pid {s.reporter_pid}, up {up}{extra}", figures)


# -- heartbeat ----------------------------------------------------------------------------
def check_heartbeat(s: Sample, limits: Thresholds) -> Check:
    age = s.status.heartbeat_age_s(s.wall_ns)
    figures = {"age_s": age, "max_age_s": limits.max_heartbeat_age_s}
    if age is None:
        return Check("heartbeat", FAIL, "the reporter has never written a heartbeat", figures)
    if age > limits.max_heartbeat_age_s:
        why = f"last heartbeat {fmt.ago(age)} (max {fmt.duration(limits.max_heartbeat_age_s)})"
        return Check("heartbeat", FAIL, why, figures)
    return Check("heartbeat", OK, f"last heartbeat {fmt.ago(age)}", figures)


# -- rings --------------------------------------------------------------------------------
def check_rings(before: Sample | None, after: Sample) -> Check:
    waiting = [sl for sl in after.slots if sl.stats.used > 0]
    figures: dict[str, Any] = {
        "slots_with_data": len(waiting),
        "waiting_bytes": sum(sl.stats.used for sl in waiting),
        "stuck_slots": [],
        "held_by_backend": False,
    }
    if before is None:
        return Check("rings", SKIP, "needs an interval (--interval > 0) to see the reader move", figures)
    stuck = []
    for b, a in zip(before.slots, after.slots, strict=False):
        # Records that were already waiting at the start are still unread at the end, and
        # the reader neither read nor released anything in between: nobody is draining.
        # (A reader that has read everything and waits for a delivery before releasing is
        # the backend's business, not a stuck ring.)
        if b.stats.used > 0 and a.stats.head < b.stats.tail:
            moved = a.stats.head > b.stats.head or a.stats.read_records > b.stats.read_records
            unread = a.stats.read_records < b.stats.written_records
            if not moved and unread:
                stuck.append(a.slot)
    figures["stuck_slots"] = stuck
    seconds = after.mono_s - before.mono_s
    if not stuck:
        if waiting:
            return Check("rings", OK, f"{len(waiting)} ring(s) with data, all draining", figures)
        return Check("rings", OK, "all rings drained", figures)
    names = ", ".join(str(n) for n in stuck[:8]) + (", ..." if len(stuck) > 8 else "")
    if after.backend_state() == "failing":
        # The reporter holds back while the backend is down: a restart would not help, and
        # the backend check reports the cause.
        figures["held_by_backend"] = True
        return Check("rings", OK, f"ring(s) {names} held back while the backend is failing", figures)
    why = f"ring(s) {names} not drained for {fmt.duration(seconds)}: data waiting, reader not moving"
    return Check("rings", FAIL, why, figures)


# -- backend ------------------------------------------------------------------------------
def check_backend(s: Sample, limits: Thresholds) -> Check:
    b = s.backend()
    now = s.wall_ns
    last_ok = _ns(b.get("last_success_ns"))
    last_err = _ns(b.get("last_error_ns"))
    failures = _ns(b.get("consecutive_failures"))
    address = b.get("address") if isinstance(b.get("address"), str) else ""
    error = b.get("last_error") if isinstance(b.get("last_error"), str) else ""
    uptime = s.reporter_uptime_s()
    figures: dict[str, Any] = {
        "address": address or None,
        "state": s.backend_state(),
        "last_success_age_s": (now - last_ok) / 1e9 if last_ok else None,
        "last_error_age_s": (now - last_err) / 1e9 if last_err else None,
        "last_error": error,
        "consecutive_failures": failures,
        "window_s": limits.backend_window_s,
        "in_grace": False,
    }
    where = f"{address}: " if address else ""
    # The error text goes last: the text output clips long lines, JSON has it whole.
    last_error_txt = f": {error}" if error else ""
    if s.document is None:
        if uptime is not None and uptime <= limits.backend_window_s and s.reporter_pid is not None:
            figures["in_grace"] = True
            return Check("backend", OK, f"no status yet (reporter up {fmt.duration(uptime)})", figures)
        why = f"the reporter publishes no backend status ({s.document_error})"
        return Check("backend", FAIL, why, figures)

    failing_now = (
        limits.backend_failures > 0
        and figures["state"] == "failing"
        and failures >= limits.backend_failures
        and last_err >= last_ok
    )
    if failing_now:
        why = f"{where}failing, {_failures(failures)} in a row{last_error_txt}"
        return Check("backend", FAIL, why, figures)
    if last_ok:
        age = (now - last_ok) / 1e9
        if age <= limits.backend_window_s:
            return Check("backend", OK, f"{where}last success {fmt.ago(age)}", figures)
        window = fmt.duration(limits.backend_window_s)
        why = f"{where}no success for {fmt.duration(age)} (window {window}){last_error_txt}"
        return Check("backend", FAIL, why, figures)
    # Never reached yet. A young, live reporter that has not failed either is just starting.
    young = uptime is not None and uptime <= limits.backend_window_s and s.reporter_pid is not None
    if not failures and not last_err and young:
        figures["in_grace"] = True
        why = f"{where}not contacted yet (reporter up {fmt.duration(uptime)})"
        return Check("backend", OK, why, figures)
    if failures or last_err:
        why = f"{where}never reached, {_failures(failures)} in a row{last_error_txt}"
    else:
        why = f"{where}never reached in {fmt.duration(uptime)} since the reporter started"
    return Check("backend", FAIL, why, figures)


def _failures(n: int) -> str:
    return f"{n} failure" if n == 1 else f"{n} failures"


def _ns(value: Any) -> int:
    """A positive integer (timestamp, count) from the document, else 0."""
    return max(0, number(value)) if isinstance(value, int) else 0


# -- drops --------------------------------------------------------------------------------
def check_drops(before: Sample | None, after: Sample, limits: Thresholds) -> Check:
    def totals(s: Sample) -> tuple[int, int, int, int, int, int]:
        written = sum(sl.stats.written_records for sl in s.slots)
        # Writers' drops (ring full...) and records lost to corruption recovery.
        ring_dropped = sum(sl.stats.dropped_records + sl.stats.skipped_records for sl in s.slots)
        reporter_dropped = counter_sum((s.document or {}).get("dropped"))
        # Records the workers could not encode (never in a ring): lost like a ring's drops.
        unbuilt = sum(sl.stats.unbuilt_records for sl in s.slots)
        # Records refused by a writer its process had given up: lost too. Records made before
        # the agent started in a process are shown, never a loss: nothing was running to lose them.
        stale = sum(sl.stats.stale_records for sl in s.slots)
        prestart = sum(sl.stats.prestart_records for sl in s.slots)
        return written, ring_dropped, reporter_dropped, unbuilt, stale, prestart

    w1, rd1, pd1, ub1, st1, ps1 = totals(after)
    # Records of workers that found no free ring slot: any of them fails the check, whatever
    # the ratio (a worker without a slot loses everything it does, which a ratio hides).
    # Helpers' records (forked by a worker, inert by design) are shown, never a failure.
    ns1, hp1 = after.lost.no_slot_records, after.lost.helper_records
    if before is None:
        written, ring_dropped, reporter_dropped, unbuilt, over = w1, rd1, pd1, ub1, "totals"
        stale, prestart = st1, ps1
        no_slot, helpers = ns1, hp1
        seconds = None
    else:
        w0, rd0, pd0, ub0, st0, ps0 = totals(before)
        written, ring_dropped, unbuilt = delta(w1, w0), delta(rd1, rd0), delta(ub1, ub0)
        stale, prestart = delta(st1, st0), delta(ps1, ps0)
        reporter_dropped = delta(pd1, pd0)
        no_slot = delta(ns1, before.lost.no_slot_records)
        helpers = delta(hp1, before.lost.helper_records)
        over = "interval"
        seconds = after.mono_s - before.mono_s
    offered = written + ring_dropped + unbuilt + stale + no_slot  # every record a worker tried to write
    dropped = ring_dropped + unbuilt + stale + reporter_dropped + no_slot
    # Reporter drops can concern records offered before the interval: keep the ratio in 0..1.
    ratio = dropped / max(offered, dropped) if dropped else 0.0
    figures = {
        "over": over,
        "seconds": seconds,
        "offered": offered,
        "dropped": dropped,
        "ring_dropped": ring_dropped,
        "unbuilt": unbuilt,
        "stale": stale,
        "prestart": prestart,
        "reporter_dropped": reporter_dropped,
        "no_slot_dropped": no_slot,
        "helper_dropped": helpers,
        "ratio": ratio,
        "max_ratio": limits.max_drop_ratio,
    }
    span = f"over {fmt.duration(seconds)}" if seconds is not None else "in total"
    if ratio > limits.max_drop_ratio or no_slot:
        why = (
            f"{fmt.percent(ratio)} of records dropped {span} "
            f"({ring_dropped} in rings, {unbuilt} unencodable, {stale} after a ring was given up, "
            f"{reporter_dropped} by reporter, "
            f"{no_slot} for want of "
            f"a ring slot, of {offered}; max {fmt.percent(limits.max_drop_ratio)}, and none "
            f"for want of a slot)"
        )
        return Check("drops", FAIL, why, figures)
    if not offered and not dropped:
        return Check("drops", OK, f"no records {span}", figures)
    return Check("drops", OK, f"{fmt.percent(ratio)} of {offered} records dropped {span}", figures)


# -- spool --------------------------------------------------------------------------------
def check_spool(s: Sample) -> Check:
    spool = s.doc_dict("spool")
    used = _ns(spool.get("bytes"))
    cap = _ns(spool.get("cap"))
    figures = {
        "enabled": bool(spool.get("enabled")),
        "bytes": used,
        "cap": cap,
        "records": _ns(spool.get("records")),
        "fill_ratio": used / cap if cap else None,
    }
    if not figures["enabled"]:
        why = "no status document" if s.document is None else "no spool configured"
        return Check("spool", SKIP, why, figures)
    if cap and used >= cap:
        return Check("spool", FAIL, f"spool full: {fmt.size(used)} of {fmt.size(cap)}", figures)
    if not cap:
        return Check("spool", OK, f"spool holds {fmt.size(used)} (no cap)", figures)
    why = f"spool {fmt.percent(used / cap)} full ({fmt.size(used)} of {fmt.size(cap)})"
    return Check("spool", OK, why, figures)


# -- supervisor ---------------------------------------------------------------------------
def check_supervisor(s: Sample) -> Check:
    sup = s.doc_dict("supervisor")
    pid = _ns(sup.get("pid"))
    figures: dict[str, Any] = {"pid": pid or None, "alive": None, "replaced": _ns(sup.get("replaced"))}
    if s.reporter_pid is None or not sup:
        why = "no live reporter" if s.reporter_pid is None else "the reporter runs without a supervisor"
        return Check("supervisor", SKIP, why, figures)
    alive = pid > 0 and process_alive(pid, _ns(sup.get("start_ticks"))) and not _zombie(pid)
    figures["alive"] = alive
    if not alive:
        why = f"supervisor pid {pid} is gone: a reporter that dies now is not restarted until it is replaced"
        return Check("supervisor", FAIL, why, figures)
    extra = f" (replaced {figures['replaced']} time(s))" if figures["replaced"] else ""
    return Check("supervisor", OK, f"pid {pid}{extra}", figures)


def _zombie(pid: int) -> bool:
    """Dead but not yet reaped (its parent is busy): gone for our purpose."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] in (b"Z", b"X")
