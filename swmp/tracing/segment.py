"""A segment: the spans one process recorded for one trace, emitted as ONE record.

A segment can be shared by threads (``contextvars.copy_context().run`` in a thread pool)
and asyncio tasks, so its bookkeeping must survive concurrent use. It takes no lock: every
shared step is one C-level operation the GIL makes atomic, which costs a fraction of a
lock round trip on the hot path:

* span ids come from ``next()`` on an ``itertools.count``;
* each open span holds one token in the ``_open`` list (``append`` on start, ``pop`` on
  finish), and the finished span was appended to ``finished`` before its pop;
* whoever sees ``_open`` empty after its pop takes the single emit token (``list.pop`` on a
  one-element list succeeds exactly once) and emits.

So the segment is emitted exactly once, with every span that finished before it. The one
race left is a span started in one thread at the very moment the last open span finishes
in another: it can miss the emitted segment; it is then dropped and counted
(``stats.spans_lost``), never written into a second record under the same segment id.

Emission serializes the segment with orjson in the positional layout of
``reporter_proc.records`` (SEGMENT) and hands it to the sink; a full ring drops the record
and counts it. Text orjson refuses (lone surrogates) is sent backslash-escaped
(``swmp.tracing.utf8``). Nothing here blocks or raises into the application.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import orjson

from reporter_proc.records import REF_CROSS_PROCESS, REF_CROSS_THREAD, SEGMENT
from swmp import _sink
from swmp.propagation import b64
from swmp.tracing.constants import Kind
from swmp.tracing.identity import identity
from swmp.tracing.ids import new_id
from swmp.tracing.limits import limits, stats
from swmp.tracing.span import (
    UNRECORDED,
    IgnoredSpan,
    NoopSpan,
    Span,
    SpanPosition,
    b64_cached,
    native_core,
    span_rows,
)
from swmp.tracing.utf8 import dumps_escaping

log = logging.getLogger("swmp.tracing")

_dumps = orjson.dumps
_count = itertools.count
_logged_errors: set[str] = set()
_EXIT = Kind.EXIT

# Shared read-only default: most traces carry no correlation context.
NO_CORRELATION: Mapping[str, str] = MappingProxyType({})


def _log_once(key: str, msg: str, *args: Any) -> None:
    if key not in _logged_errors:
        _logged_errors.add(key)
        log.error(msg + " (further occurrences are only counted)", *args)


class PySegmentCore:
    """A segment's fields and creation in pure Python: what ``swmp._spancore.SegmentCore``
    does in C (used when the native module is not built, or with ``SWMP_TRACE_PURE=1``).
    Rarely changed fields are class-level defaults (set on the instance only when they
    change), which keeps creating a segment per request cheap."""

    # Defaults, overridden per instance when they change.
    size_limited = False
    skip_analysis = False
    encoded: tuple[str, str, str] | None = None
    correlation: Mapping[str, str] = NO_CORRELATION
    profile: Any = None  # swmp.profiling's Profiled while a profile task samples this segment
    ended_op = ""  # the first span's operation name, kept when the segment lets go of its spans

    def __init__(self, trace_id: str | None = None) -> None:
        if identity.unbound:
            identity.bind()
        sid = new_id()
        self.segment_id = sid
        # A new trace reuses the segment's id as the trace id: both are unique ids, and it
        # saves drawing a second one per request.
        self.trace_id = trace_id or sid
        self.finished: list[Span] = []
        self._ids = _count(1)  # id 0 is the first span's
        self._open: list[None] = [None]  # the first span's token
        self._token = [True]  # the right to emit, taken once
        self.first: Span | None = None


if TYPE_CHECKING:
    _SegmentBase = PySegmentCore  # the fields both cores have
else:
    _SegmentBase = native_core.SegmentCore if native_core is not None else PySegmentCore


class Segment(_SegmentBase):
    """Bookkeeping of one segment (its fields and creation: :class:`PySegmentCore` or the
    native ``SegmentCore``, which make the same segments)."""

    __slots__ = ()  # the native core's fields are all there is: no per-segment dict

    def start_first(self, op: str, kind: int, layer: int, component: int, peer: str) -> Span:
        """The segment's first span (its token is already in ``_open``)."""
        span = self.first = Span(self, 0, -1, op, kind, layer, component, peer)
        return span

    # -- span lifecycle ---------------------------------------------------------------------
    def start_span(  # noqa: PLR0917 (hot path: positional calls are cheaper)
        self, parent_id: int, op: str, kind: int, layer: int, component: int, peer: str
    ) -> Span | NoopSpan:
        """A child span in this segment; once the span limit is hit, an :class:`IgnoredSpan`,
        or for an exit span a stand-in (not recorded) that still propagates the trace."""
        if not self._token:
            return continuation(self, parent_id, op, kind, layer, component, peer)
        n = next(self._ids)
        if n >= limits.span_limit:
            self.size_limited = True
            stats.spans_over_limit += 1
            if kind == _EXIT:
                # As the Java agent's NoopExitSpan: the call still carries sw8, so the service
                # called joins this trace; its parent is the recorded span the call is under
                # (span_id), as a snapshot taken there would be. Not recorded: UNRECORDED.
                return Span(self, parent_id, UNRECORDED, op, kind, layer, component, peer)
            return IgnoredSpan(SpanPosition(self, parent_id))
        self._open.append(None)
        return Span(self, n, parent_id, op, kind, layer, component, peer)

    def closed(self, span: Span) -> None:
        """Bookkeeping after ``span`` got its end time (called by the span, once)."""
        self.finished.append(span)
        try:
            self._open.pop()
        except IndexError:
            stats.spans_lost += 1
            return
        if self._open:
            return
        try:
            self._token.pop()
        except IndexError:
            # Already emitted (a span that raced the segment's end): counted, not re-emitted.
            stats.spans_lost += 1
            return
        self.emit()

    def correlation_for_update(self) -> dict[str, str]:
        """This segment's own, mutable correlation dict (created on first write)."""
        corr = self.correlation
        if corr is NO_CORRELATION or not isinstance(corr, dict):
            corr = self.correlation = dict(corr)
        return corr

    # -- propagation helpers ----------------------------------------------------------------
    def encode_ids(self) -> tuple[str, str, str]:
        """Base64 of trace id, segment id and endpoint, computed once per segment."""
        sid = b64(self.segment_id)
        tid = sid if self.trace_id is self.segment_id else b64(self.trace_id)
        op = self.endpoint
        enc = (tid, sid, b64_cached(op) if op else "")
        self.encoded = enc
        return enc

    @property
    def endpoint(self) -> str:
        first = self.first
        return first.op if first is not None else self.ended_op

    # -- output ------------------------------------------------------------------------------
    def to_record(self) -> list[Any]:
        """The SEGMENT record (positional layout of ``reporter_proc.records``)."""
        return [
            self.trace_id,
            self.segment_id,
            identity.service,
            identity.instance,
            self.size_limited,
            span_rows(self.finished, self.skip_analysis),
        ]

    def emit(self) -> None:
        try:
            # Text that is not valid UTF-8 (lone surrogates: surrogateescape-decoded file
            # names, argv, environ) in a name, tag or log: sent escaped, not lost with every
            # span of the segment.
            payload = dumps_escaping(self.to_record())
        except Exception as e:
            stats.serialize_errors += 1
            _sink.count_unbuilt()  # where ``swmp status`` shows it (this count is the process's)
            _log_once("serialize", "swmp: could not serialize a segment: %r", e)
            self._release()
            return
        try:
            ok = _sink.get_sink().write(SEGMENT, payload)
        except Exception as e:
            ok = False
            _log_once("sink", "swmp: the sink failed to take a segment: %r", e)
        self._release()
        if ok:
            stats.segments_written += 1
        else:
            stats.segments_dropped += 1

    def _release(self) -> None:
        """Let go of the spans once the record is written or given up: the segment held them
        (``finished``, ``first``) and each span holds its segment, a reference cycle per
        traced request that only the garbage collector could free. The first span's name
        stays (``ended_op``) for the endpoint of late work referring to this segment. The
        native core does the same after its own emit (spancore.c, ``release_spans``)."""
        first = self.first
        if first is not None:
            self.ended_op = first.op
            self.first = None
        self.finished = []


if native_core is not None:
    native_core.set_segments(identity, NO_CORRELATION)
    # The native span core emits a native segment itself, as emit() below does, while
    # Segment still has this emit (it falls back to it when a step fails: the accounting
    # and logging of failures stay here).
    native_core.set_emit(Segment.emit, identity, _dumps, vars(_sink), stats, SEGMENT)


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
    return [
        REF_CROSS_THREAD,
        trace_id,
        segment_id,
        span_id,
        identity.service,
        identity.instance,
        endpoint,
        "",
    ]


def continuation(  # noqa: PLR0917
    parent_seg: Segment, parent_id: int, op: str, kind: int, layer: int, component: int, peer: str
) -> Span | NoopSpan:
    """A span whose parent's segment was already emitted: a new segment of the same trace
    with a cross-thread reference to the parent (late work of a finished request)."""
    seg = Segment(parent_seg.trace_id)
    if parent_seg.correlation:
        seg.correlation = parent_seg.correlation
    if parent_seg.skip_analysis:
        seg.skip_analysis = True
    span = seg.start_first(op, kind, layer, component, peer)
    span.add_ref(cross_thread_ref(parent_seg.trace_id, parent_seg.segment_id, parent_id, parent_seg.endpoint))
    return span
