"""One shape for traces from either source (the local collector or an OAP), and the tree.

:class:`TreeSpan` carries what the terminal tree shows; :func:`build_tree` links spans across
segments (an entry span's ref names the parent span in another segment) and orders children
by start time. Spans whose parent never arrived become extra roots, so a partial trace still
shows everything that is there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TreeSpan:
    segment_id: str
    span_id: int
    parent_span_id: int
    parent_ref: tuple[str, int] | None  # (parent segment id, parent span id) across processes
    service: str
    instance: str
    start: int  # epoch ms
    end: int
    operation: str
    type: str  # Entry | Exit | Local
    peer: str
    component: str
    is_error: bool
    tags: list[tuple[str, str]] = field(default_factory=list)
    children: list[TreeSpan] = field(default_factory=list)

    @property
    def duration_ms(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True)
class TraceSummary:
    trace_id: str
    start: int  # epoch ms
    duration_ms: int
    endpoint: str
    is_error: bool
    services: tuple[str, ...] = ()


def spans_from_segments(segments: Iterable[dict[str, Any]]) -> list[TreeSpan]:
    """Collector segment documents (``/api/trace/<id>``) -> spans."""
    out = []
    for seg in segments:
        for s in seg["spans"]:
            ref = s["refs"][0] if s["refs"] else None
            out.append(
                TreeSpan(
                    segment_id=seg["segment_id"],
                    span_id=s["span_id"],
                    parent_span_id=s["parent_span_id"],
                    parent_ref=(ref["parent_segment_id"], ref["parent_span_id"]) if ref else None,
                    service=seg["service"],
                    instance=seg["instance"],
                    start=s["start"],
                    end=s["end"],
                    operation=s["operation"],
                    type=s["type"],
                    peer=s["peer"],
                    component=str(s["component_id"]),
                    is_error=bool(s["is_error"]),
                    tags=[(k, v) for k, v in s["tags"]],
                )
            )
    return out


def build_tree(spans: list[TreeSpan]) -> list[TreeSpan]:
    """Link ``spans`` into trees; the roots, oldest first."""
    by_key = {(s.segment_id, s.span_id): s for s in spans}
    roots = []
    for s in spans:
        s.children = []
    for s in spans:
        parent = by_key.get((s.segment_id, s.parent_span_id)) if s.parent_span_id >= 0 else None
        if parent is None and s.parent_ref is not None:
            parent = by_key.get(s.parent_ref)
        if parent is None or parent is s:
            roots.append(s)
        else:
            parent.children.append(s)
    for s in spans:
        s.children.sort(key=lambda c: (c.start, c.span_id))
    roots.sort(key=lambda r: (r.start, r.span_id))
    return roots
