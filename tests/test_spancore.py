"""The native span core (swmp/_native/spancore.c) behaves as the pure-Python one.

``swmp.tracing.span`` uses ``swmp._spancore`` when it is built (the normal install builds it)
and ``PySpanCore`` otherwise or with ``SWMP_TRACE_PURE=1``. Checked here: the build is in use
and not older than its source; a scenario through every path of a span's life (nesting,
no-op exits, errors, manual and timed finishes, out-of-order ends, other threads, late spans,
the span limit, a lost span, asyncio) gives the same records and counters with either core;
the tracing unit tests pass with the pure core too; no references or memory leak; bad calls
raise TypeError like a Python function would.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from swmp import _sink, tracing
from swmp.config import load
from swmp.tracing import Component, Layer
from swmp.tracing import span as span_module
from swmp.tracing.context import new_entry_span, new_exit_span
from swmp.tracing.span import Kind
from tests.native_build import HAVE_CC, assert_current

ROOT = Path(__file__).resolve().parent.parent
native_only = pytest.mark.skipif(not span_module.NATIVE, reason="the native span core is not built")


def _run_scenario(pure: bool) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SWMP_TRACE_PURE": "1" if pure else "0"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "spancore_scenario.py")],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler: the install falls back to the pure-Python core")
def test_the_native_core_is_built_and_current() -> None:
    assert span_module.NATIVE, "swmp._spancore did not build (pip install -e . builds it)"
    from swmp import _spancore

    for source in sorted(p.name for p in (ROOT / "swmp" / "_native").iterdir() if p.suffix in (".c", ".h")):
        assert_current(_spancore.__file__, ROOT / "swmp" / "_native" / source)
    assert span_module.Span.__mro__[1] is _spancore.SpanCore
    from swmp.tracing import ids
    from swmp.tracing.segment import Segment

    assert Segment.__mro__[1] is _spancore.SegmentCore
    assert ids.new_id is _spancore.new_id


def test_native_and_pure_cores_give_the_same_records() -> None:
    native = _run_scenario(pure=False)
    pure = _run_scenario(pure=True)
    assert (pure["core"], pure["segment_core"]) == ("PySpanCore", "PySegmentCore")
    if span_module.NATIVE:
        assert (native["core"], native["segment_core"]) == ("SpanCore", "SegmentCore")
    assert native["records"] == pure["records"]
    assert native["stats"] == pure["stats"]
    assert pure["stats"] == {"spans_lost": 1, "spans_over_limit": 5, "segments_written": 10}
    # Exit spans over the span limit: not recorded, but they propagate from the recorded span
    # they are under (span 0), inside a dropped local span too, with the same trace and
    # segment as the recorded calls before them.
    assert native["injected"] == pure["injected"]
    (many,) = [seg for _, seg in pure["records"] if any(s[4] == "/many" for s in seg[5])]  # type: ignore[attr-defined]
    assert [s[4] for s in many[5]] == ["/call-0", "/call-1", "/call-2", "/many"]
    ids = [many[0], many[1]]  # trace and segment id (normalized)
    assert pure["injected"] == [
        [*ids, 1, "/many", "p:1", True, True],
        [*ids, 2, "/many", "p:1", True, True],
        [*ids, 3, "/many", "p:1", True, True],
        [*ids, 0, "/many", "p:1", True, True],
        [*ids, 0, "/many", "p:1", True, True],
        [*ids, 0, "/many", "p:1", True, True],
        [*ids, 0, "/many", "p:2", True, True],
    ]


_SURROGATE_SEGMENT = """
import re, sys
from swmp import _sink, tracing
from swmp.config import load
from swmp.tracing import Component, Layer
from swmp.tracing.context import new_entry_span, new_exit_span
sink = _sink.MemorySink()
_sink.set_sink(sink)
tracing.configure(load({}))
tracing.identity.set("svc", "inst")
bad = b"caf\\xff".decode("utf-8", "surrogateescape")
with new_entry_span("/" + bad, None, Component.FLASK, Layer.HTTP) as entry:
    entry.tag(bad, bad)
    with new_exit_span("q", "h-" + bad, Component.REQUESTS, Layer.HTTP) as ex:
        ex.log(bad)
(_, payload), = sink.records
seg_id = entry.segment.segment_id.encode()
sys.stdout.write(re.sub(rb"[0-9]{13}", b"T", payload.replace(seg_id, b"ID")).decode())
"""


def test_text_that_is_not_utf8_is_escaped_the_same_by_both_cores() -> None:
    """A lone surrogate in a segment: both cores send the same bytes (the native one declines
    such text and hands the segment to the Python emit, which escapes it)."""
    out = []
    for pure in ("0", "1"):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SWMP_TRACE_PURE": pure}
        proc = subprocess.run(
            [sys.executable, "-c", _SURROGATE_SEGMENT],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0 and not proc.stderr, proc.stderr
        out.append(proc.stdout)
    assert out[0] == out[1]
    assert out[0].count("caf\\\\udcff") == 5, out[0]


def test_tracing_unit_tests_pass_with_the_pure_core() -> None:
    env = {**os.environ, "SWMP_TRACE_PURE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_tracing_model.py", "tests/test_tracing_context.py", "tests/test_public_api.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout


@native_only
def test_no_reference_or_memory_leak() -> None:
    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    tracing.configure(load({}))
    op = "leak-check-" + str(os.getpid())  # a string only this test (and name caches) hold

    def requests(n: int) -> None:
        for _ in range(n):
            with new_entry_span(op, None, Component.FLASK, Layer.HTTP) as entry:
                entry.tag("k", "v")
                with new_exit_span(op, "peer:1", Component.REQUESTS, Layer.HTTP):
                    pass
                try:
                    with new_exit_span(op, "peer:2", Component.REQUESTS, Layer.HTTP):
                        raise ValueError("x")
                except ValueError:
                    pass
                manual = new_exit_span(op, "peer:3", Component.REQUESTS, Layer.HTTP)
                manual.finish(end_ms=manual.start + 1)
            sink.clear()

    try:
        requests(2000)  # warm up: caches (of operation names too), free lists
        gc.collect()
        before_refs = sys.getrefcount(op)
        tracemalloc.start()
        first = tracemalloc.take_snapshot()
        requests(20000)
        gc.collect()
        grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(first, "filename"))
        tracemalloc.stop()
        assert grown < 64 * 1024, f"memory grew by {grown} bytes over 20,000 requests"
        assert sys.getrefcount(op) == before_refs
    finally:
        _sink.set_sink(None)


@native_only
def test_bad_calls_raise_type_errors() -> None:
    from swmp import _spancore
    from swmp.tracing.segment import Segment

    seg = object()
    with pytest.raises(TypeError):
        span_module.Span(seg, 1, 0, "op")  # too few
    with pytest.raises(TypeError):
        span_module.Span(seg, 1, 0, "op", 1, 1, 1, "peer", extra=1)
    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    try:
        with new_entry_span("/x", None, Component.FLASK, Layer.HTTP) as entry:
            with pytest.raises(TypeError):
                entry.finish(1, 2)
            with pytest.raises(TypeError):
                entry.finish(when=5)
            with pytest.raises(TypeError):
                _spancore.exit_child("op", "peer")
            with pytest.raises(TypeError):
                _spancore.rows([object()], False)
            with pytest.raises(TypeError):
                Segment("t", "extra")
            with pytest.raises(TypeError):
                Segment(trace_id="t")
        assert len(sink.records) == 1
    finally:
        _sink.set_sink(None)


@native_only
def test_a_segments_entry_span_is_made_natively_only_in_the_plain_case() -> None:
    """``entry_root`` (the native start of a segment) answers only when no span is current,
    the ignore rules have decided to record this name before, no profiling board is attached
    and, for a new trace, no sampler is on or, for a caller's, the caller sampled it; for
    anything else it answers None and new_entry_span's Python path decides, counts and names
    exactly as before. With the caller's headers the segment joins its trace: trace id,
    correlation, skip-analysis flag and the cross-process reference, as the Python path."""
    from swmp import _spancore
    from swmp.profiling.gate import gate
    from swmp.propagation import ContextCarrier
    from swmp.tracing import context, stats
    from swmp.tracing.context import capture
    from swmp.tracing.segment import cross_process_ref

    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    try:
        tracing.configure(load({}, agent_ignore_suffix=(".png",), sample_n_per_3_secs=-1))
        root = _spancore.entry_root
        assert root("/first", Component.FLASK, Layer.HTTP, None) is None  # not decided yet: Python
        with new_entry_span("/first", None, Component.FLASK, Layer.HTTP):
            snapshot = capture()
        span = root("/first", Component.FLASK, Layer.HTTP, None)  # decided: native
        assert isinstance(span, span_module.Span) and span.segment.first is span
        assert (span.span_id, span.parent_id, span.kind, span.peer, span.refs) == (0, -1, 0, "", ())
        assert (span.op, span.component, span.layer) == ("/first", Component.FLASK, Layer.HTTP)
        assert span.segment.trace_id == span.segment.segment_id  # a new trace
        with span:
            assert root("/first", Component.FLASK, Layer.HTTP, None) is None  # a span is current
        caller = ContextCarrier("t.9", "s.9", 4, "svc", "inst", "/up", "h:1", True, {"k": "v"}, True)
        joined = root("/first", Component.FLASK, Layer.HTTP, caller)
        assert joined is not None
        seg = joined.segment
        assert (seg.trace_id, seg.correlation, seg.skip_analysis) == ("t.9", {"k": "v"}, True)
        assert joined.refs == [cross_process_ref(caller)]
        joined.finish()
        plain = ContextCarrier("t.8", "s.8", 1, "svc", "inst", "/up", "h:1")
        with root("/first", Component.FLASK, Layer.HTTP, plain) as other:  # type: ignore[union-attr]
            assert (other.segment.correlation, other.segment.skip_analysis) == ({}, False)
        unsampled = ContextCarrier("t.7", "s.7", 1, "svc", "inst", "/up", "h:1", False)
        assert root("/first", Component.FLASK, Layer.HTTP, unsampled) is None  # Python counts it
        assert root("/first", Component.FLASK, Layer.HTTP, snapshot) is None  # not a carrier
        ignored = stats.ignored
        for _ in range(2):
            assert root("/logo.png", Component.FLASK, Layer.HTTP, None) is None
            with new_entry_span("/logo.png", None, Component.FLASK, Layer.HTTP):
                pass
        assert stats.ignored == ignored + 2  # counted each time, by the Python path
        gate.board, board = object(), gate.board  # type: ignore[assignment]
        try:
            assert root("/first", Component.FLASK, Layer.HTTP, None) is None  # profiling: Python
            assert root("/first", Component.FLASK, Layer.HTTP, plain) is None
        finally:
            gate.board = board
        tracing.configure(load({}, sample_n_per_3_secs=5))  # new rules: nothing decided yet
        assert context.policy.sampling
        with new_entry_span("/first", None, Component.FLASK, Layer.HTTP):
            pass
        assert root("/first", Component.FLASK, Layer.HTTP, None) is None  # sampling: Python
        with root("/first", Component.FLASK, Layer.HTTP, plain):  # type: ignore[union-attr]
            pass  # the caller decided: no sampler for it
        assert len(sink.records) == 6
    finally:
        tracing.configure(load({}))
        _sink.set_sink(None)


@native_only
def test_an_exit_span_outside_any_trace_starts_its_segment_natively() -> None:
    """``exit_child`` with no span current makes the first span of a new segment (a client
    call, query or message sent outside any request), as ``_start_trace`` would: exit kind,
    the peer, span id 0 under -1, a new trace; it answers None, for the Python path to
    decide and count, when the ignore rules have not decided the name yet or ignore it, a
    sampler is on, a profiling board is attached or the current context is not plain (an
    inherited snapshot). ``new_exit_span`` with a snapshot to continue never takes it."""
    from swmp import _spancore
    from swmp.profiling.gate import gate
    from swmp.tracing import context, stats
    from swmp.tracing.context import capture

    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    try:
        tracing.configure(load({}, agent_ignore_suffix=(".png",), sample_n_per_3_secs=-1))
        child = _spancore.exit_child
        args = ("/svc/Get", "db:5432", Component.GRPC, Layer.RPC_FRAMEWORK)
        assert child(*args) is None  # not decided yet: Python
        with new_exit_span("/svc/Get", "db:5432", Component.GRPC, Layer.RPC_FRAMEWORK) as python:
            pass
        span = child(*args)  # decided: native
        assert isinstance(span, span_module.Span) and span.segment.first is span
        assert (span.span_id, span.parent_id, span.kind, span.peer, span.refs) == (
            0,
            -1,
            Kind.EXIT,
            "db:5432",
            (),
        )
        assert (span.op, span.component, span.layer) == ("/svc/Get", Component.GRPC, Layer.RPC_FRAMEWORK)
        assert span.segment.trace_id == span.segment.segment_id != python.segment.trace_id
        with span:
            nested = child(*args)
            assert nested is None  # the current span is an exit span: Python decides (a no-op)
            with new_entry_span("/in", None, Component.FLASK, Layer.HTTP) as entry:
                snapshot = capture()
                inner = child(*args)
                assert inner is not None and inner.segment is entry.segment  # a child
                inner.finish()
        via_context = new_exit_span(*args)
        assert isinstance(via_context, span_module.Span) and via_context.span_id == 0
        via_context.finish()
        # A snapshot to continue: the Python path, whatever is current.
        continued = new_exit_span(*args, carrier=snapshot)
        assert continued.segment.trace_id == entry.segment.trace_id and continued.refs
        continued.finish()
        with _inherit(context, snapshot):
            assert child(*args) is None  # an inherited trace: Python continues it
        ignored = stats.ignored
        for _ in range(2):
            assert child("/logo.png", "cdn:80", Component.GRPC, Layer.RPC_FRAMEWORK) is None
            new_exit_span("/logo.png", "cdn:80", Component.GRPC, Layer.RPC_FRAMEWORK).finish()
        assert stats.ignored == ignored + 2  # counted each time, by the Python path
        assert child(1, "p", Component.GRPC, Layer.RPC_FRAMEWORK) is None  # not a str: Python
        gate.board, board = object(), gate.board  # type: ignore[assignment]
        try:
            assert child(*args) is None  # profiling: Python
        finally:
            gate.board = board
        tracing.configure(load({}, sample_n_per_3_secs=5))
        new_exit_span(*args).finish()
        assert child(*args) is None  # sampling: Python
        recs = [json.loads(p) for _, p in sink.records]
        assert len(recs) == 5 and all(r[5][-1][1] == -1 for r in recs)  # each its own segment
    finally:
        tracing.configure(load({}))
        _sink.set_sink(None)


class _inherit:
    """The current context continues ``snapshot``'s trace for the block (a thread's start)."""

    def __init__(self, context: object, snapshot: object) -> None:
        self.context, self.snapshot = context, snapshot

    def __enter__(self) -> None:
        self.token = self.context.inherit(self.snapshot)  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        self.context.disinherit(self.token)  # type: ignore[attr-defined]


@native_only
def test_new_exit_span_is_native_and_hands_every_other_call_to_python() -> None:
    """``context.new_exit_span`` is the native function: four positional arguments take
    exit_child's cases in C and every case it declines goes to ``decide_exit_span``;
    keywords, defaults and a carrier go to the Python function as given."""
    from swmp import _spancore
    from swmp.tracing import context
    from swmp.tracing.context import capture
    from swmp.tracing.span import NOOP

    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    try:
        tracing.configure(load({}))
        assert context.new_exit_span is _spancore.new_exit_span
        with new_entry_span("/in", None, Component.FLASK, Layer.HTTP) as entry:
            child = context.new_exit_span("q", "db:1", Component.GRPC, Layer.DATABASE)
            assert child.segment is entry.segment and child.parent_id == entry.span_id
            with child:
                assert context.new_exit_span("q2", "db:1", Component.GRPC, Layer.DATABASE) is NOOP
            by_default = context.new_exit_span("q", "db:1")
            assert (by_default.component, by_default.layer) == (Component.PYTHON, Layer.HTTP)
            by_default.finish()
            named = context.new_exit_span(
                op="q", peer="p:2", component=Component.GRPC, layer=Layer.RPC_FRAMEWORK
            )
            assert (named.op, named.peer, named.segment) == ("q", "p:2", entry.segment)
            named.finish()
            snapshot = capture()
        continued = context.new_exit_span("q", "db:1", Component.GRPC, Layer.DATABASE, snapshot)
        assert continued.segment.trace_id == entry.segment.trace_id and continued.refs
        continued.finish()
        with pytest.raises(TypeError):
            context.new_exit_span("q")  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            context.new_exit_span("q", "p", 1, 2, None, "extra")  # type: ignore[call-arg]
        assert len(sink.records) == 2
    finally:
        tracing.configure(load({}))
        _sink.set_sink(None)


@native_only
def test_the_callers_reference_is_the_one_python_builds() -> None:
    """A continued trace's cross-process reference, built from the carrier's slots in C
    (after the Python function's first call gave the kind), equals
    ``segment.cross_process_ref`` for every caller, and is a list of its own each time."""
    from swmp import _spancore
    from swmp.propagation import ContextCarrier
    from swmp.tracing.segment import cross_process_ref

    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    try:
        tracing.configure(load({}))
        with new_entry_span("/r", None, Component.FLASK, Layer.HTTP):
            pass  # the name is decided: entry_root answers from now on
        callers = [
            ContextCarrier(f"t.{i}", f"s.{i}", i, "svc", f"inst-{i}", "/up", "h:1", True, {}, bool(i % 2))
            for i in range(5)
        ] + [ContextCarrier("t.x", "s.x", 2**40, "ünï", "ïnst", "", "")]
        refs = []
        for caller in callers * 2:
            span = _spancore.entry_root("/r", Component.FLASK, Layer.HTTP, caller)
            assert span is not None
            assert span.refs == [cross_process_ref(caller)]
            refs.append(span.refs[0])
            span.finish()
        assert len({id(r) for r in refs}) == len(refs)
    finally:
        tracing.configure(load({}))
        _sink.set_sink(None)


@native_only
def test_a_spans_or_segments_fields_cannot_be_deleted() -> None:
    """The C paths read a span's and a segment's fields without a NULL check; ``del`` on one
    (a user holds spans) is refused with AttributeError instead of leaving a NULL to crash
    on. Setting them, and deleting a subclass instance's own attributes, work as before."""
    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    try:
        with new_entry_span("/x", None, Component.FLASK, Layer.HTTP) as entry:
            for name in ("end", "_prev", "tags", "segment", "span_id", "op", "is_error"):
                with pytest.raises(AttributeError, match="cannot be deleted"):
                    delattr(entry, name)
            seg = entry.segment
            for name in ("_open", "_token", "finished", "profile", "trace_id", "encoded"):
                with pytest.raises(AttributeError, match="cannot be deleted"):
                    delattr(seg, name)
            entry.op = "/renamed"
            with pytest.raises(AttributeError):
                del entry.not_a_field
        (record,) = sink.records
        assert b"/renamed" in record[1]
    finally:
        _sink.set_sink(None)


@native_only
def test_errors_of_odd_values_are_raised_not_left_set() -> None:
    """A trace id whose truth test raises, a span id past a C long: the error is raised (or
    the value taken as it is), never left set behind a result (a SystemError)."""
    from swmp.tracing.segment import Segment

    class Undecided:
        def __bool__(self) -> bool:
            raise ValueError("no truth")

    with pytest.raises(ValueError, match="no truth"):
        Segment(Undecided())
    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    try:
        with new_entry_span("/x", None, Component.FLASK, Layer.HTTP):
            child = new_exit_span("op", "peer:1", Component.REQUESTS, Layer.HTTP)
            child.span_id = 2**63  # past a C long, within what the record takes
            assert child.finish() is None
        assert len(sink.records) == 1
    finally:
        _sink.set_sink(None)
