"""Terminal output of ``swmp traces``: the recent-traces table and one trace as a tree.

Errors are marked with the word ``ERROR`` (and red when colour is on), so the output reads
the same in a log file as on a terminal. Each span that starts a segment names its service
and instance in brackets: that is where the trace crossed a process.

Every name, tag and id comes from whoever reported the trace: each goes through
:func:`terminal_safe` (an ESC, CR or BEL in an operation name is printed as ``\\x1b``, not
sent to the terminal).
"""

from __future__ import annotations

import time

from swmp.ops.fmt import terminal_safe as _safe
from swmp.traceview.model import TraceSummary, TreeSpan, build_tree

RED = "\x1b[31;1m"
DIM = "\x1b[2m"
RESET = "\x1b[0m"


def _paint(text: str, code: str, color: bool) -> str:
    return f"{code}{text}{RESET}" if color else text


def _ms(v: int) -> str:
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v} ms"


def summary_table(rows: list[TraceSummary], *, color: bool = False) -> list[str]:
    if not rows:
        return ["no traces"]
    head = ("start", "duration", "", "endpoint", "services", "trace id")
    table = [
        (
            time.strftime("%H:%M:%S", time.localtime(r.start / 1000)),
            _ms(r.duration_ms),
            "ERROR" if r.is_error else "",
            _safe(r.endpoint) or "-",
            _safe(",".join(r.services)) or "-",
            _safe(r.trace_id),
        )
        for r in rows
    ]
    widths = [max(len(head[i]), *(len(t[i]) for t in table)) for i in range(len(head) - 1)]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)) + "  " + cells[-1]

    out = [line(head).rstrip()]
    for cells, r in zip(table, rows, strict=True):
        text = line(cells)
        out.append(_paint(text, RED, color) if r.is_error else text)
    return out


def trace_tree(trace_id: str, spans: list[TreeSpan], *, color: bool = False) -> list[str]:
    """The trace as indented lines, one per span."""
    if not spans:
        return [f"trace {_safe(trace_id)}: not found"]
    roots = build_tree(spans)
    t0 = min(s.start for s in spans)
    total = max(s.end for s in spans) - t0
    segments = {s.segment_id for s in spans}
    services = sorted({_safe(s.service) for s in spans})
    errors = sum(1 for s in spans if s.is_error)
    head = (
        f"trace {_safe(trace_id)}  {len(segments)} segment{'s' * (len(segments) != 1)}, "
        f"{len(spans)} spans, {_ms(total)}, services: {', '.join(services)}"
        + (f", {errors} error span{'s' * (errors != 1)}" if errors else "")
    )
    out = [head]

    def label(s: TreeSpan, parent: TreeSpan | None) -> str:
        parts = [_safe(s.operation) or "(unnamed)", _safe(s.type)]
        if s.peer:  # an entry span's peer is its caller, an exit span's the callee
            parts.append(f"<- {_safe(s.peer)}" if s.type == "Entry" else f"-> {_safe(s.peer)}")
        if parent is None or parent.segment_id != s.segment_id:
            parts.append(f"[{_safe(s.service)} @ {_safe(s.instance)}]")
        parts.append(f"+{s.start - t0} ms" if s.start > t0 else "+0 ms")
        parts.append(_ms(s.duration_ms))
        status = next((v for k, v in s.tags if k == "http.status_code"), "")
        if status:
            parts.append(f"status {_safe(status)}")
        text = "  ".join(parts)
        if s.is_error:
            return _paint(text + "  ERROR", RED, color)
        return text

    def walk(s: TreeSpan, parent: TreeSpan | None, prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└─ " if last else "├─ ")
        out.append(prefix + branch + label(s, parent))
        child_prefix = prefix if top else prefix + ("   " if last else "│  ")
        for i, c in enumerate(s.children):
            walk(c, s, child_prefix, i == len(s.children) - 1, False)

    for r in roots:
        walk(r, None, "", True, True)
    return out
