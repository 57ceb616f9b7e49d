"""Text output for ``swmp health`` and ``swmp status``, built from the JSON documents.

Every line fits in :data:`fmt.WIDTH` columns: long values are clipped (the JSON output has
them whole) and prose (notes, errors) is wrapped.
"""

from __future__ import annotations

import textwrap
from typing import Any

from swmp.ops import fmt

W = fmt.WIDTH
_LABEL = 10  # width of the left-hand labels in the status block


def wrap(text: str, indent: str = "", width: int = W) -> list[str]:
    # Never break inside a word: paths and names must stay copyable, so a single path
    # longer than the line is the one thing allowed past 80 columns.
    lines = textwrap.wrap(
        fmt.clip(text, 10 * width),
        width=width,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_on_hyphens=False,
        break_long_words=False,
    )
    return lines or [indent.rstrip()]


def _who(agent: dict[str, Any]) -> str:
    service = agent.get("service") or "?"
    return f"service {service}, pid {agent.get('owner_pid')}"


# -- health -------------------------------------------------------------------------------
def health_text(report: dict[str, Any], verbose: bool = False) -> list[str]:
    """stdout lines: a verdict per agent, then one line per failed (or, verbose, every) check."""
    out: list[str] = []
    mode = report["mode"]
    for agent in report["agents"]:
        selected = [c for c in agent["checks"] if c["selected"]]
        failed = [c for c in selected if c["status"] == "fail"]
        if failed:
            out.append(fmt.line(f"UNHEALTHY ({mode}): {_who(agent)}: {len(failed)} check(s) failed"))
        else:
            ok = sum(1 for c in selected if c["status"] == "ok")
            skipped = len(selected) - ok
            tail = f", {skipped} skipped" if skipped else ""
            out.append(fmt.line(f"healthy ({mode}): {_who(agent)}: {ok} check(s) ok{tail}"))
        for c in selected if verbose else failed:
            out.append(fmt.line(f"  {c['status'].upper():<4} {c['name']}: {c['message']}"))
    return out


def problems_text(command: str, report: dict[str, Any], verbose: bool = True) -> list[str]:
    """stderr lines: why nothing was found, and arenas that were skipped."""
    out: list[str] = []
    if report.get("error"):
        out.extend(wrap(f"swmp {command}: {report['error']}"))
    if verbose or report.get("error"):
        for note in report.get("notes", []):
            out.extend(wrap(f"note: {note}", "  "))
    return out


# -- status -------------------------------------------------------------------------------
def _row(label: str, text: str) -> str:
    return fmt.line(f"{label:<{_LABEL}}{text}")


def _join(*parts: str) -> str:
    return "  ".join(p for p in parts if p)


SLOT_HEADER = (
    f"{'SLOT':>4} {'PID':<9} {'INSTANCE':<23} {'WRITTEN':>11} {'DROPPED':>9} {'FILL':>6} {'REC/S':>8}"
)


def _slot_row(sl: dict[str, Any]) -> str:
    # A slot whose worker is gone shows the last pid in parentheses.
    pid = str(sl["pid"]) if sl["alive"] else (f"({sl['last_pid']})" if sl.get("last_pid") else "-")
    instance = fmt.clip(sl.get("instance") or "-", 23)
    return (
        f"{sl['slot']:>4} {fmt.clip(pid, 9):<9} {instance:<23} {fmt.clip(fmt.count(sl['written']), 11):>11} "
        f"{fmt.clip(fmt.count(sl['dropped']), 9):>9} {fmt.percent(sl['fill_ratio']):>6} "
        f"{fmt.clip(fmt.rate(sl['records_per_s']), 8):>8}"
    )


# Rows of records counted in the rings' words that never reached a ring, beside "unbuilt".
_RING_ROWS = (
    ("stale", "written after their process gave its ring up (lost)"),
    ("prestart", "made before the agent started in their process (not reported)"),
)


def status_agent_text(a: dict[str, Any]) -> list[str]:
    out = []
    ns = f"(namespace {a['namespace']})" if a.get("namespace") else ""
    out.append(
        _row(
            "service",
            _join(
                a.get("service") or "?",
                ns,
                a.get("protocol") or "",
                f"{a['mode']} mode" if a.get("mode") else "",
                f"owner pid {a['owner_pid']}" + ("" if a["owner_alive"] else " (gone)"),
            ),
        )
    )

    b = a["backend"]
    address = b.get("address") or ", ".join(a.get("backends") or []) or "?"
    failures = f"{b['consecutive_failures']} failures" if b["consecutive_failures"] else ""
    out.append(
        _row(
            "backend",
            _join(address, b["state"], f"last success {fmt.ago(b['last_success_age_s'])}", failures),
        )
    )
    if b.get("last_error"):
        out.append(_row("", f"last error {fmt.ago(b['last_error_age_s'])}: {b['last_error']}"))

    r = a["reporter"]
    if r["alive"]:
        restarts = r["restarts"] if r["restarts"] is not None else max(0, r["starts"] - 1)
        reporter = _join(
            f"pid {r['pid']}",
            f"up {fmt.duration(r['uptime_s'])}",
            f"restarts {restarts}",
            f"heartbeat {fmt.ago(r['heartbeat_age_s'])}",
        )
    else:
        last = f" (last pid {r['last_pid']})" if r.get("last_pid") else ""
        reporter = f"NOT RUNNING{last}  heartbeat {fmt.ago(r['heartbeat_age_s'])}"
    out.append(_row("reporter", reporter))

    t = a["totals"]
    dropped = t["ring_dropped"] + t["ring_skipped"] + t["reporter_dropped"] + t.get("no_slot_dropped", 0)
    dropped += t.get("unbuilt", 0) + t.get("stale", 0)
    out.append(
        _row(
            "totals",
            _join(
                f"sent {fmt.count(t['sent'])}",
                f"retried {fmt.count(t['retried'])}",
                f"failed {fmt.count(t['failed'])}",
                f"spooled {fmt.count(t['spooled'])}",
                f"dropped {fmt.count(dropped)}",
            ),
        )
    )
    kinds = ("no_slot_dropped", "no_slot_workers", "helper_dropped", "master_dropped", "late_dropped")
    if any(t.get(k) for k in kinds):
        # Thread mode has a ring per process that reports: "no slot" there is a process that
        # could not start reporting (its log says why), not a lack of arena slots.
        why = "see the agent's log" if a.get("mode") == "thread" else "raise SW_AGENT_ARENA_SLOTS"
        # Only the figures that are not 0: all three do not fit in a line (the row is clipped).
        parts = [
            f"no slot: {fmt.count(t.get('no_slot_dropped', 0))} dropped "
            f"by {fmt.count(t.get('no_slot_workers', 0))} worker(s) ({why})"
            if t.get("no_slot_dropped") or t.get("no_slot_workers")
            else "",
            f"helpers: {fmt.count(t['helper_dropped'])} not reported" if t.get("helper_dropped") else "",
            f"master: {fmt.count(t['master_dropped'])} not reported" if t.get("master_dropped") else "",
            f"after exit: {fmt.count(t['late_dropped'])} not reported" if t.get("late_dropped") else "",
        ]
        out.append(_row("no ring", _join(*parts)))
    if t.get("unbuilt"):  # only then: a worker met a value it cannot encode (its log says which)
        slots = [sl for sl in a["slots"] if sl.get("unbuilt")]
        per_slot = ", ".join(f"slot {sl['slot']}: {fmt.count(sl['unbuilt'])}" for sl in slots)
        text = f"{fmt.count(t['unbuilt'])} records workers could not encode ({per_slot}; see their log)"
        out.append(_row("unbuilt", text))
    for key, what in _RING_ROWS:  # only when not 0
        if t.get(key):
            slots = [sl for sl in a["slots"] if sl.get(key)]
            per_slot = ", ".join(f"slot {sl['slot']}: {fmt.count(sl[key])}" for sl in slots)
            out.append(_row(key, f"{fmt.count(t[key])} records {what} ({per_slot})"))
    if t.get("bad_input"):  # only then: a caller sent headers that could not be decoded
        slots = [sl for sl in a["slots"] if sl.get("bad_input")]
        per_slot = ", ".join(f"slot {sl['slot']}: {fmt.count(sl['bad_input'])}" for sl in slots)
        text = f"{fmt.count(t['bad_input'])} malformed sw8 headers refused ({per_slot}; see their log)"
        out.append(_row("bad input", text))
    rates = a["rates"]
    sp = a["spool"]
    out.append(
        _row(
            "rates",
            _join(
                f"written {fmt.rate(rates['written_per_s'])}/s",
                f"read {fmt.rate(rates['read_per_s'])}/s",
                f"sent {fmt.rate(rates['sent_per_s'])}/s",
            ),
        )
    )
    if sp["enabled"]:
        spool = f"spool {fmt.size(sp['bytes'])} of {fmt.size(sp['cap'])} ({fmt.count(sp['records'])} records)"
    else:
        spool = "no spool"
    out.append(_row("buffers", _join(f"pending {fmt.size(a['pending_bytes'])}", spool)))
    refused = a.get("profile", {}).get("commands_refused")
    if refused:  # only then: most agents never see one
        why = "(not run; see the reporter's log)"
        out.append(_row("profile", f"commands refused {fmt.count(refused)} {why}"))
    out.append(SLOT_HEADER)
    out.extend(_slot_row(sl) for sl in a["slots"])
    if not a["slots"]:
        out.append("   (no worker has claimed a slot yet)")
    if a.get("idle_slots"):
        out.append(f"   + {a['idle_slots']} free slot(s)")
    return out


def status_text(report: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for i, agent in enumerate(report["agents"]):
        if i:
            out.append("")
        out.extend(status_agent_text(agent))
    return out
