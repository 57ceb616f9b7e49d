"""Creating spans in the right place: the current context decides the parent.

* No current span: a new segment starts. An entry span with a carrier (decoded ``sw8``)
  joins the caller's trace; otherwise ignore rules and sampling decide whether the trace
  is recorded at all. A trace that is not recorded gets an :class:`IgnoredSpan`, and
  everything nested in it gets the shared :data:`NOOP`: a non-sampled request does one
  decision and allocates one tiny object.
* A current span: the new span is its child in the same segment, except that an entry
  span directly inside an entry span, or an exit span directly inside an exit span, is
  :data:`NOOP`. That is what keeps ``requests`` -> ``urllib3`` -> ``http.client`` to one
  exit span (the outermost library records and injects the headers), and a framework
  hook inside the WSGI middleware to one entry span.
* A :class:`Snapshot` taken with :func:`capture` continues a trace in another thread
  or task as a new segment with a cross-thread reference.
* :func:`inherit` makes a snapshot the starting point of a thread (or a work item run by a
  pool): the context holds an :class:`Inherited` marker instead of a span, and every span
  opened there with no open span around it starts a segment that refers to the snapshot.
  No span is created for the thread itself, so nothing is held open for a thread's life.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swmp.profiling.gate import gate as _gate
from swmp.propagation import ContextCarrier
from swmp.tracing.constants import Component, Kind, Layer
from swmp.tracing.ignore import IgnoreRules
from swmp.tracing.ignore import rules as _rules_holder
from swmp.tracing.limits import limits, stats
from swmp.tracing.sampling import sampler as _sampler_holder
from swmp.tracing.segment import Segment, cross_process_ref, cross_thread_ref
from swmp.tracing.span import NOOP, IgnoredSpan, NoopSpan, Span, SpanPosition, current_span, native_core
from swmp.tracing.span import exit_child as _exit_child

_get_current = current_span.get
_ENTRY = Kind.ENTRY
_EXIT = Kind.EXIT
_LOCAL = Kind.LOCAL


class _Policy:
    """The ignore rules and sampler in force (replaced as a whole by ``configure``)."""

    __slots__ = ("rules", "sampler", "sampling")

    def __init__(self) -> None:
        self.rules = _rules_holder
        self.sampler = _sampler_holder
        self.sampling = _sampler_holder.n > 0  # skip the sampler call entirely when off


policy = _Policy()

# entry_root(op, component, layer, carrier): the native common case of new_entry_span (no
# span current; a new trace, or the caller's from a ContextCarrier; a cached "record it"
# decision, no sampling, no profiling board), None otherwise and when the core is pure Python.
_entry_root: Any = None
if native_core is not None and issubclass(Segment, native_core.SegmentCore):
    native_core.setup_entry(Segment, _ENTRY, policy, IgnoreRules, _gate, ContextCarrier, cross_process_ref)
    _entry_root = native_core.entry_root


def _no_root(op: str, component: int, layer: int, carrier: ContextCarrier | None) -> Span | None:
    return None


# For the per-request entry points (WSGI, ASGI): new_entry_span's first step called directly,
# without its frame; None: call decide_entry_span.
entry_root: Callable[[str, int, int, ContextCarrier | None], Span | None] = _entry_root or _no_root


class Snapshot:
    """Where a trace is, captured to continue it in another thread or task."""

    __slots__ = ("correlation", "endpoint", "segment_id", "skip_analysis", "span_id", "trace_id")

    def __init__(self, span: Span | SpanPosition) -> None:
        seg = span.segment
        self.trace_id = seg.trace_id
        self.segment_id = seg.segment_id
        self.span_id = span.span_id
        self.endpoint = seg.endpoint
        self.correlation = dict(seg.correlation)
        self.skip_analysis = seg.skip_analysis


class Inherited:
    """Stands in the context of a thread started inside a trace (see :func:`inherit`).

    It looks like an open span to the code that walks the context (``end`` is 0, ``_prev``
    is None) but is never recorded; new spans see it as their parent and continue the
    snapshot's trace in a new segment.
    """

    __slots__ = ("snapshot",)
    end = 0
    _prev = None

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot


def inherit(snapshot: Snapshot) -> Any:
    """Make ``snapshot`` the parent of what this context does next; returns the token to
    give to :func:`disinherit` (for a pool's work item: the thread outlives it)."""
    return current_span.set(Inherited(snapshot))


def disinherit(token: Any) -> None:
    try:
        current_span.reset(token)
    except ValueError:  # a token of another context (never raise into the caller)
        current_span.set(None)


def _innermost() -> Any:
    s = _get_current()
    while s is not None and s.end:
        s = s._prev
    return s


def active_span() -> Span | None:
    """The innermost open recorded span of this context, or None."""
    s = _innermost()
    return s if s.__class__ is Span else None


def trace_position() -> tuple[str, str, int, str] | None:
    """``(trace id, segment id, span id, endpoint)`` of where this context is in a trace:
    the innermost open recorded span, else the snapshot a thread inherited; None outside."""
    s = _innermost()
    if s is None:
        return None
    if s.__class__ is Span:
        seg = s.segment
        return seg.trace_id, seg.segment_id, s.span_id, seg.endpoint
    if s.__class__ is Inherited:
        snap = s.snapshot
        return snap.trace_id, snap.segment_id, snap.span_id, snap.endpoint
    if s.__class__ is IgnoredSpan and s.at is not None:  # dropped over the span limit: in the trace
        seg = s.at.segment
        return seg.trace_id, seg.segment_id, s.at.span_id, seg.endpoint
    return None


def capture() -> Snapshot | None:
    """A snapshot of the current span to continue the trace elsewhere (None outside a trace).

    In a thread that inherited a trace and has no span open, the inherited snapshot."""
    s = _innermost()
    if s is None:
        return None
    if s.__class__ is Span:
        return Snapshot(s)
    if s.__class__ is Inherited:
        return s.snapshot
    if s.__class__ is IgnoredSpan and s.at is not None:  # dropped over the span limit
        return Snapshot(s.at)  # continues from the recorded span it is under
    return None


def _parent() -> Any:
    """The current span if still open; else its nearest open ancestor; else the last one seen."""
    s = _get_current()
    if s is None or not s.end:
        return s
    last = s
    while s is not None and s.end:
        last = s
        s = s._prev
    # All of this context's spans are finished (it outlived them, e.g. a task that kept
    # running after the request returned): continue their trace rather than start a new one.
    return s if s is not None else _Late(last)


class _Late:
    """Marks a finished span that a new span would have had as parent."""

    __slots__ = ("span",)

    def __init__(self, span: Any) -> None:
        self.span = span


def _start_trace(  # noqa: PLR0917 (hot path: positional calls are cheaper)
    kind: int, op: str, layer: int, component: int, peer: str, carrier: Any
) -> Span | NoopSpan:
    """First span of a new segment, if the trace is to be recorded."""
    pol = policy
    if pol.rules.ignore_operation(op):
        stats.ignored += 1
        return IgnoredSpan()
    if carrier is None:
        if pol.sampling and not pol.sampler.allow():
            stats.sampled_out += 1
            return IgnoredSpan()
        seg = Segment()
        span = seg.first = Span(seg, 0, -1, op, kind, layer, component, peer)  # start_first(), inlined
        if _gate.board is not None:  # profile tasks: one word compared when nothing changed
            _gate.first_span(span)
        return span
    is_snapshot = carrier.__class__ is Snapshot
    if not is_snapshot and not carrier.sampled:
        stats.sampled_out += 1
        return IgnoredSpan()
    seg = Segment(carrier.trace_id)
    if carrier.correlation:
        # A snapshot may start several segments (a thread's spans): each gets its own copy.
        seg.correlation = dict(carrier.correlation) if is_snapshot else carrier.correlation
    if carrier.skip_analysis:
        seg.skip_analysis = True
    span = seg.start_first(op, kind, layer, component, peer)
    if is_snapshot:
        span.add_ref(
            cross_thread_ref(carrier.trace_id, carrier.segment_id, carrier.span_id, carrier.endpoint)
        )
    elif kind == _ENTRY:
        span.add_ref(cross_process_ref(carrier))
    if _gate.board is not None:
        _gate.first_span(span)
    return span


def _late(  # noqa: PLR0917
    late: Any, kind: int, op: str, layer: int, component: int, peer: str
) -> Span | NoopSpan:
    if late.__class__ is Inherited:
        return _start_trace(kind, op, layer, component, peer, late.snapshot)
    parent = late.span
    if parent.__class__ is not Span:
        return _start_trace(kind, op, layer, component, peer, None)
    return parent.segment.start_span(parent.span_id, op, kind, layer, component, peer)


def new_entry_span(
    op: str,
    carrier: ContextCarrier | Snapshot | None = None,
    component: int = Component.PYTHON,
    layer: int = Layer.HTTP,
) -> Span | NoopSpan:
    if _entry_root is not None:
        root: Span | None = _entry_root(op, component, layer, carrier)
        if root is not None:
            return root
    return decide_entry_span(op, carrier, component, layer)


def decide_entry_span(
    op: str, carrier: ContextCarrier | Snapshot | None, component: int, layer: int
) -> Span | NoopSpan:
    """new_entry_span past its native first step (:data:`entry_root`): every case in Python.
    The WSGI and ASGI entry points call it when they made that step themselves."""
    parent = _get_current()
    if parent is not None and parent.end:
        parent = _parent()
    if parent is None or (carrier is not None and parent.__class__ is Inherited):
        # Work that arrived from outside continues its caller's trace, not the thread's.
        return _start_trace(_ENTRY, op, layer, component, "", carrier)
    if parent.__class__ is not Span:
        return NOOP if parent.__class__ is IgnoredSpan else _late(parent, _ENTRY, op, layer, component, "")
    if parent.kind == _ENTRY:
        return NOOP
    span = parent.segment.start_span(parent.span_id, op, _ENTRY, layer, component, "")
    if carrier is not None and carrier.__class__ is ContextCarrier and span.__class__ is Span:
        span.add_ref(cross_process_ref(carrier))
    return span


def new_exit_span(
    op: str,
    peer: str,
    component: int = Component.PYTHON,
    layer: int = Layer.HTTP,
    carrier: Snapshot | None = None,
) -> Span | NoopSpan:
    if _exit_child is not None and carrier is None:
        # The common cases (a child of an open span, or the first span of a new trace) in C;
        # None: the cases below decide. A carrier (a snapshot to continue) is theirs.
        span = _exit_child(op, peer, component, layer)
        if span is not None:
            return span
    return decide_exit_span(op, peer, component, layer, carrier)


def decide_exit_span(
    op: str, peer: str, component: int, layer: int, carrier: Snapshot | None
) -> Span | NoopSpan:
    """new_exit_span past its native first step (exit_child): every other case in Python."""
    parent = _get_current()
    if parent is not None and parent.end:
        parent = _parent()
    if parent is None:
        return _start_trace(_EXIT, op, layer, component, peer, carrier)
    if parent.__class__ is not Span:
        if parent.__class__ is IgnoredSpan:
            at = parent.at
            if at is None:  # a trace not recorded
                return NOOP
            # Under a span dropped over the limit: a stand-in that propagates (start_span).
            return at.segment.start_span(at.span_id, op, _EXIT, layer, component, peer)
        return _late(parent, _EXIT, op, layer, component, peer)
    if parent.kind == _EXIT:
        return NOOP
    # Segment.start_span(), inlined: exit spans are on every traced request's path.
    seg = parent.segment
    if seg._token:
        n = next(seg._ids)
        if n < limits.span_limit:
            seg._open.append(None)
            return Span(seg, n, parent.span_id, op, _EXIT, layer, component, peer)
    return seg.start_span(parent.span_id, op, _EXIT, layer, component, peer)  # the rare cases


if native_core is not None and _exit_child is not None:
    # Called by every exit point: the native form takes exit_child's cases without this
    # module's frame and hands every other call to the functions above.
    native_core.setup_new_exit(new_exit_span, decide_exit_span)
    new_exit_span = native_core.new_exit_span


def new_local_span(
    op: str,
    component: int = Component.PYTHON,
    layer: int = Layer.UNKNOWN,
    carrier: Snapshot | None = None,
) -> Span | NoopSpan:
    parent = _get_current()
    if parent is not None and parent.end:
        parent = _parent()
    if parent is None:
        return _start_trace(_LOCAL, op, layer, component, "", carrier)
    if parent.__class__ is not Span:
        return NOOP if parent.__class__ is IgnoredSpan else _late(parent, _LOCAL, op, layer, component, "")
    return parent.segment.start_span(parent.span_id, op, _LOCAL, layer, component, "")


def trace_id() -> str:
    """The current trace id, or "" outside a recorded trace (a thread that inherited a
    trace is inside it)."""
    pos = trace_position()
    return pos[0] if pos is not None else ""
