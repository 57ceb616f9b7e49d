"""A segment: the spans one process recorded for one trace, emitted as ONE record.

Bookkeeping (span ids, open-span count, the finished list) is guarded by a per-segment lock
because a segment can be shared by threads (``contextvars.copy_context().run`` in a thread
pool) and asyncio tasks. The segment is emitted when its last open span finishes; it is
serialized outside the lock, with orjson, in the positional layout of
``reporter_proc.records`` (SEGMENT), and handed to the sink. A full ring drops the record
and counts it; nothing here blocks or raises into the application.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import orjson

from reporter_proc.records import REF_CROSS_PROCESS, REF_CROSS_THREAD, SEGMENT
from swmp import _sink
from swmp.propagation import b64
from swmp.tracing.identity import identity
from swmp.tracing.ids import new_id
from swmp.tracing.limits import limits, stats
from swmp.tracing.span import IgnoredSpan, NoopSpan, Span

log = logging.getLogger("swmp.tracing")

_dumps = orjson.dumps
_allocate_lock = threading.Lock
_logged_errors: set[str] = set()


def _log_once(key: str, msg: str, *args: Any) -> None:
    if key not in _logged_errors:
        _logged_errors.add(key)
        log.error(msg + " (further occurrences are only counted)", *args)


class Segment:
    __slots__ = (
        "_count",
        "_lock",
        "_open",
        "correlation",
        "emitted",
        "encoded",
        "first",
        "finished",
        "segment_id",
        "size_limited",
        "skip_analysis",
        "trace_id",
    )

    def __init__(self, trace_id: str | None = None) -> None:
        sid = new_id()
        self.segment_id = sid
        # A new trace reuses the segment's id as the trace id: both are unique ids, and it
        # saves drawing a second one per request.
        self.trace_id = trace_id or sid
        self.finished: list[Span] = []
        self._count = 0
        self._open = 0
        self._lock = _allocate_lock()
        self.size_limited = False
        self.skip_analysis = False
        self.correlation: dict[str, str] = {}
        self.emitted = False
        self.first: Span | None = None
        self.encoded: tuple[str, str, str] | None = None

    # -- span lifecycle ---------------------------------------------------------------------
    def start_span(
        self, parent_id: int, op: str, kind: int, layer: int, component: int, peer: str
    ) -> Span | NoopSpan:
        """A new span in this segment, or an :class:`IgnoredSpan` once the span limit is hit."""
        with self._lock:
            if self.emitted:
                return continuation(self, parent_id, op, kind, layer, component, peer)
            n = self._count
            if n >= limits.span_limit:
                self.size_limited = True
                stats.spans_over_limit += 1
                return IgnoredSpan()
            self._count = n + 1
            self._open += 1
        span = Span(self, n, parent_id, op, kind, layer, component, peer)
        if n == 0:
            self.first = span
        return span

    def finish_span(self, span: Span, end_ms: int) -> None:
        with self._lock:
            if span.end:
                return
            span.end = end_ms
            self.finished.append(span)
            self._open -= 1
            if self._open > 0 or self.emitted:
                return
            self.emitted = True
        self.emit()

    # -- propagation helpers ----------------------------------------------------------------
    def encode_ids(self) -> tuple[str, str, str]:
        """Base64 of trace id, segment id and endpoint, computed once per segment."""
        first = self.first
        enc = (b64(self.trace_id), b64(self.segment_id), b64(first.op if first is not None else ""))
        self.encoded = enc
        return enc

    @property
    def endpoint(self) -> str:
        return self.first.op if self.first is not None else ""

    # -- output ------------------------------------------------------------------------------
    def to_record(self) -> list[Any]:
        """The SEGMENT record (positional layout of ``reporter_proc.records``)."""
        skip = self.skip_analysis
        return [
            self.trace_id,
            self.segment_id,
            identity.service,
            identity.instance,
            self.size_limited,
            [
                [
                    s.span_id,
                    s.parent_id,
                    s.start,
                    s.end,
                    s.op,
                    s.peer,
                    s.kind,
                    s.layer,
                    s.component,
                    s.is_error,
                    skip,
                    s.tags,
                    s.logs,
                    s.refs,
                ]
                for s in self.finished
            ],
        ]

    def emit(self) -> None:
        try:
            payload = _dumps(self.to_record())
        except Exception as e:
            stats.serialize_errors += 1
            _log_once("serialize", "swmp: could not serialize a segment: %r", e)
            return
        try:
            ok = _sink.get_sink().write(SEGMENT, payload)
        except Exception as e:
            ok = False
            _log_once("sink", "swmp: the sink failed to take a segment: %r", e)
        if ok:
            stats.segments_written += 1
        else:
            stats.segments_dropped += 1


def cross_process_ref(carrier: Any) -> list[Any]:
    return [
        REF_CROSS_PROCESS,
        carrier.trace_id,
        carrier.segment_id,
        carrier.span_id,
        carrier.service,
        carrier.instance,
        carrier.endpoint,
        carrier.address,
    ]


def cross_thread_ref(trace_id: str, segment_id: str, span_id: int, endpoint: str) -> list[Any]:
    return [REF_CROSS_THREAD, trace_id, segment_id, span_id, identity.service, identity.instance, endpoint, ""]


def continuation(
    parent_seg: Segment, parent_id: int, op: str, kind: int, layer: int, component: int, peer: str
) -> Span | NoopSpan:
    """A span whose parent's segment was already emitted: a new segment of the same trace
    with a cross-thread reference to the parent (late work of a finished request)."""
    seg = Segment(parent_seg.trace_id)
    seg.correlation = parent_seg.correlation
    seg.skip_analysis = parent_seg.skip_analysis
    span = seg.start_span(-1, op, kind, layer, component, peer)
    if isinstance(span, Span):
        span.add_ref(cross_thread_ref(parent_seg.trace_id, parent_seg.segment_id, parent_id, parent_seg.endpoint))
    return span
