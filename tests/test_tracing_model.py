"""The tracing model: segments/spans as records, errors, logs, refs, limits, sampling, ignore rules."""

from __future__ import annotations

import threading
from typing import Any

import orjson
import pytest

from reporter_proc import encode
from reporter_proc import records as R
from swmp import _sink, tracing
from swmp.config import load
from swmp.propagation import ContextCarrier
from swmp.tracing import Component, Kind, Layer, ignore, sampling
from swmp.tracing.context import (
    capture,
    new_entry_span,
    new_exit_span,
    new_local_span,
    policy,
    trace_id,
    trace_position,
)
from swmp.tracing.span import NOOP, IgnoredSpan, Span


def segments(sink: _sink.MemorySink) -> list[list[Any]]:
    assert all(t == R.SEGMENT for t, _ in sink.records)
    return [orjson.loads(p) for _, p in sink.records]


def spans_by_op(seg: list[Any]) -> dict[str, list[Any]]:
    return {s[R.SPAN_OPERATION]: s for s in seg[R.SEG_SPANS]}


def test_segment_record_layout(trace_sink: _sink.MemorySink) -> None:
    tracing.identity.set("svc", "inst-1")
    with new_entry_span("/orders", None, Component.FLASK, Layer.HTTP) as entry:
        entry.tag("http.method", "GET")
        with (
            new_local_span("price") as local,
            new_exit_span("/stock", "stock:80", Component.REQUESTS, Layer.HTTP) as ex,
        ):
            ex.tag("http.status_code", 200)
    (seg,) = segments(trace_sink)
    assert seg[R.SEG_TRACE_ID] and seg[R.SEG_SEGMENT_ID]
    assert seg[R.SEG_SERVICE] == "svc" and seg[R.SEG_INSTANCE] == "inst-1"
    assert seg[R.SEG_SIZE_LIMITED] is False
    spans = spans_by_op(seg)
    e, lo, x = spans["/orders"], spans["price"], spans["/stock"]
    assert len(e) == 14
    assert (e[R.SPAN_ID], e[R.SPAN_PARENT_ID], e[R.SPAN_TYPE]) == (0, -1, Kind.ENTRY)
    assert (lo[R.SPAN_ID], lo[R.SPAN_PARENT_ID], lo[R.SPAN_TYPE]) == (local.span_id, 0, Kind.LOCAL)
    assert (x[R.SPAN_PARENT_ID], x[R.SPAN_TYPE], x[R.SPAN_PEER]) == (local.span_id, Kind.EXIT, "stock:80")
    assert e[R.SPAN_COMPONENT] == 7001 and x[R.SPAN_COMPONENT] == 7002 and x[R.SPAN_LAYER] == R.LAYER_HTTP
    assert e[R.SPAN_TAGS] == ["http.method", "GET"]
    assert x[R.SPAN_TAGS] == ["http.status_code", "200"]
    assert e[R.SPAN_START] <= e[R.SPAN_END]
    assert x[R.SPAN_LOGS] == [] and x[R.SPAN_REFS] == []
    assert tracing.stats.segments_written == 1


def test_error_with_stack_and_logs(trace_sink: _sink.MemorySink) -> None:
    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError), new_local_span("work") as span:
        span.log("step one", attempt=2)
        fail()
    (seg,) = segments(trace_sink)
    (s,) = seg[R.SEG_SPANS]
    assert s[R.SPAN_IS_ERROR] is True
    first, err = s[R.SPAN_LOGS]
    assert first[1] == ["message", "step one", "attempt", "2"]
    data = dict(zip(err[1][::2], err[1][1::2], strict=True))
    assert data["event"] == "error" and data["error.kind"] == "ValueError" and data["message"] == "boom"
    assert "in fail" in data["stack"] and "ValueError: boom" in data["stack"]


def test_an_exception_that_cannot_be_printed_is_the_one_raised(trace_sink: _sink.MemorySink) -> None:
    """An application's exception whose ``__str__`` fails: the span still ends (its segment
    is recorded, the context given back) and the ``with`` raises the application's
    exception, not the agent's failure to read it."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise AttributeError("no message")

    with pytest.raises(Unprintable), new_entry_span("/x", None, Component.FLASK, Layer.HTTP):
        raise Unprintable
    (seg,) = segments(trace_sink)
    (s,) = seg[R.SEG_SPANS]
    assert s[R.SPAN_IS_ERROR] is True
    data = dict(zip(s[R.SPAN_LOGS][0][1][::2], s[R.SPAN_LOGS][0][1][1::2], strict=True))
    assert data["error.kind"] == "Unprintable" and data["message"] == "<unprintable Unprintable object>"
    assert tracing.context.active_span() is None


def test_cross_process_ref_from_carrier(trace_sink: _sink.MemorySink) -> None:
    carrier = ContextCarrier("t-1", "seg-9", 3, "up-svc", "up-inst", "/up", "me:80")
    carrier.correlation = {"k": "v"}
    with new_entry_span("/in", carrier) as entry, new_exit_span("/next", "next:80") as ex:
        headers = ex.inject()
    (seg,) = segments(trace_sink)
    assert seg[R.SEG_TRACE_ID] == "t-1"
    e = spans_by_op(seg)["/in"]
    assert e[R.SPAN_REFS] == [[R.REF_CROSS_PROCESS, "t-1", "seg-9", 3, "up-svc", "up-inst", "/up", "me:80"]]
    assert entry.trace_id == "t-1"
    assert "sw8-correlation" in headers


def test_not_sampled_carrier_records_nothing(trace_sink: _sink.MemorySink) -> None:
    carrier = ContextCarrier("t", "s", 1, "a", "b", "/", "x:1", sampled=False)
    with new_entry_span("/in", carrier) as span:
        assert isinstance(span, IgnoredSpan)
        assert new_local_span("inner") is NOOP
        assert new_exit_span("/x", "h:1") is NOOP
        assert span.inject() == {}
    assert trace_sink.records == []
    assert tracing.stats.sampled_out == 1


def test_nested_exit_and_entry_are_one_span(trace_sink: _sink.MemorySink) -> None:
    with new_entry_span("/a") as outer:
        assert new_entry_span("/a-again") is NOOP
        with new_exit_span("/x", "h:1") as ex:
            assert new_exit_span("/x-lower-level", "h:1") is NOOP
            assert isinstance(ex, Span)
    (seg,) = segments(trace_sink)
    assert len(seg[R.SEG_SPANS]) == 2
    assert outer.span_id == 0


def test_span_limit_flags_segment_and_counts(trace_sink: _sink.MemorySink) -> None:
    tracing.configure(load({}, agent_span_limit=5))
    with new_entry_span("/a"):
        for i in range(10):
            with new_local_span(f"l{i}") as s:
                if i >= 4:
                    assert not s.recording
                    assert new_local_span("nested-in-dropped") is NOOP
    (seg,) = segments(trace_sink)
    assert len(seg[R.SEG_SPANS]) == 5
    assert seg[R.SEG_SIZE_LIMITED] is True
    assert tracing.stats.spans_over_limit == 6


def test_work_over_the_span_limit_stays_in_the_trace(trace_sink: _sink.MemorySink) -> None:
    """A span dropped over the limit is not recorded, but the work under it is still in the
    trace (as in the Java agent): its trace id (logs), and a snapshot that continues the trace
    from the recorded span it is under. A trace not recorded at all has neither."""
    tracing.configure(load({}, agent_span_limit=2))
    with new_entry_span("/a") as root:
        with new_local_span("kept"):
            pass
        with new_local_span("dropped") as dropped:
            assert not dropped.recording
            assert trace_id() == root.segment.trace_id
            assert trace_position() == (root.segment.trace_id, root.segment.segment_id, 0, "/a")
            snap = capture()
        assert snap is not None and (snap.segment_id, snap.span_id) == (root.segment.segment_id, 0)

        recording: list[bool] = []

        def in_a_thread() -> None:
            with new_local_span("in-a-thread", carrier=snap) as later:
                recording.append(later.recording)

        t = threading.Thread(target=in_a_thread)
        t.start()
        t.join()
        assert recording == [True]
    first, second = segments(trace_sink)
    assert len(first[R.SEG_SPANS]) == 1 and first[R.SEG_SPANS][0][R.SPAN_REFS][0][:4] == [
        R.REF_CROSS_THREAD,
        root.segment.trace_id,
        root.segment.segment_id,
        0,
    ]
    assert second[R.SEG_SIZE_LIMITED] is True and len(second[R.SEG_SPANS]) == 2
    tracing.configure(load({}, sample_n_per_3_secs=1))
    with new_entry_span("/sampled"):
        pass
    with new_entry_span("/sampled-out") as out:
        assert not out.recording and trace_id() == "" and capture() is None


def test_tag_and_log_values_are_truncated(trace_sink: _sink.MemorySink) -> None:
    tracing.configure(load({}, agent_tag_value_max_length=8, agent_log_value_max_length=5))
    with new_local_span("a") as s:
        s.tag("k", "x" * 100)
        s.tag("short", "ok")
        s.log("abcdefghij")
    (seg,) = segments(trace_sink)
    (span,) = seg[R.SEG_SPANS]
    assert span[R.SPAN_TAGS] == ["k", "x" * 8, "short", "ok"]
    assert span[R.SPAN_LOGS][0][1] == ["message", "abcde"]
    assert seg[R.SEG_SIZE_LIMITED] is True
    assert tracing.stats.values_truncated == 2


def test_unserializable_tag_is_converted_not_fatal(trace_sink: _sink.MemorySink) -> None:
    class Weird:
        def __str__(self) -> str:
            raise RuntimeError("no")

    with new_local_span("a") as s:
        s.tag("obj", Weird())
        s.tag("num", 1.5)
    (seg,) = segments(trace_sink)
    assert seg[R.SEG_SPANS][0][R.SPAN_TAGS] == ["obj", "<unprintable>", "num", "1.5"]


def test_a_tag_key_that_is_not_text_does_not_lose_the_segment(trace_sink: _sink.MemorySink) -> None:
    """A tag key of another type (an enum member, a number) is recorded as its text: kept as
    it was, the reporter could not encode the segment and dropped every span of it."""
    with new_local_span("a") as s:
        s.tag(7, "x")  # type: ignore[arg-type]
        s.tag("ok", "y")
    (payload,) = [p for _, p in trace_sink.records]
    assert orjson.loads(payload)[R.SEG_SPANS][0][R.SPAN_TAGS] == ["7", "x", "ok", "y"]
    assert len(encode.segment_payload(payload)) > 0


def test_text_that_is_not_utf8_is_sent_escaped_not_lost(trace_sink: _sink.MemorySink) -> None:
    """Lone surrogates (bytes decoded with surrogateescape: file names, sys.argv, os.environ)
    in an operation name, peer, tag, log or exception: orjson refuses them, and the segment
    with every span of it was lost. They are sent backslash-escaped, as the log reporter does."""
    bad = b"caf\xff".decode("utf-8", "surrogateescape")
    esc = "caf\\udcff"
    with new_entry_span("/" + bad, None, Component.FLASK, Layer.HTTP) as entry:
        entry.tag("file", bad)
        entry.tag(bad, "v")
        with new_exit_span("q", "host-" + bad, Component.REQUESTS, Layer.HTTP) as ex:
            ex.log(bad, path=bad)
        try:
            with new_local_span("l"):
                raise OSError(bad)
        except OSError:
            pass
    (payload,) = [p for _, p in trace_sink.records]
    assert tracing.stats.serialize_errors == 0 and tracing.stats.segments_written == 1
    spans = spans_by_op(orjson.loads(payload))
    assert set(spans) == {"/" + esc, "q", "l"}
    assert spans["/" + esc][R.SPAN_TAGS] == ["file", esc, esc, "v"]
    assert spans["q"][R.SPAN_PEER] == "host-" + esc
    assert spans["q"][R.SPAN_LOGS][0][1] == ["message", esc, "path", esc]
    fields = spans["l"][R.SPAN_LOGS][0][1]
    assert fields[fields.index("message") + 1] == esc
    assert len(encode.segment_payload(payload)) > 0


def test_full_sink_drops_and_counts(trace_sink: _sink.MemorySink) -> None:
    class Full:
        def write(self, rtype: int, payload: bytes) -> bool:
            return False

    _sink.set_sink(Full())
    with new_local_span("a"):
        pass
    assert tracing.stats.segments_dropped == 1


def test_a_segment_that_cannot_be_serialized_or_written_is_counted_never_raised(
    trace_sink: _sink.MemorySink, caplog: pytest.LogCaptureFixture
) -> None:
    """The emit's failures (the native core hands them to the Python emit, which counts and
    logs them once): nothing reaches the application, nothing half-written is left."""
    with new_local_span("a") as s:
        s.tags = ["k", object()]  # bypassing tag(), which would have made it text
    assert tracing.stats.serialize_errors == 1 and not trace_sink.records

    class Broken:
        def write(self, rtype: int, payload: bytes) -> bool:
            raise OSError("gone")

    _sink.set_sink(Broken())
    with new_local_span("b"):
        pass
    assert tracing.stats.segments_dropped == 1 and tracing.stats.segments_written == 0
    assert sum("could not serialize" in r.getMessage() for r in caplog.records) <= 1


def test_sampling_n_per_3_seconds(trace_sink: _sink.MemorySink, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(sampling.time, "monotonic", lambda: now[0])
    tracing.configure(load({}, sample_n_per_3_secs=2))
    recorded = []
    for _ in range(5):
        with new_entry_span("/a") as s:
            recorded.append(s.recording)
    assert recorded == [True, True, False, False, False]
    now[0] += 3.01
    with new_entry_span("/a") as s:
        assert s.recording
    # A caller's decision is followed, whatever the local budget.
    with new_entry_span("/a", ContextCarrier("t", "s", 0, "a", "b", "/", "x")) as s:
        assert s.recording
    assert len(trace_sink.records) == 4
    assert tracing.stats.sampled_out == 3


def test_sampler_off_means_everything() -> None:
    s = sampling.Sampler(0)
    assert all(s.allow() for _ in range(1000))


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("/health", "/health", True),
        ("/health", "/healthz", False),
        ("/static/**", "/static", True),
        ("/static/**", "/static/a/b.txt", True),
        ("/static/**", "/staticx", False),
        ("/api/*/ping", "/api/v1/ping", True),
        ("/api/*/ping", "/api/v1/x/ping", False),
        ("/api/**/ping", "/api/ping", True),
        ("/api/**/ping", "/api/a/b/ping", True),
        ("/v?/x", "/v1/x", True),
        ("/v?/x", "/v12/x", False),
        ("/a.b", "/aXb", False),
        # The peer agent's own cases (skywalking-python tests/unit/test_ant_matcher.py), where
        # the semantics agree: "*" and "?" stay within one segment, "**" spans segments.
        ("/eureka/*", "/eureka/apps", True),
        ("/eureka/*", "/eureka/", True),
        ("/eureka/*", "/eureka/apps/", False),
        ("/eureka/*/", "/eureka/apps/", True),
        ("/eureka/*/", "/eureka/", False),
        ("/eureka/*/", "/eureka/apps/list", False),
        ("/eureka/**", "/eureka/", True),
        ("/eureka/**", "/eureka/apps/test", True),
        ("eureka/apps/?", "eureka/apps/list", False),
        ("eureka/apps/?", "eureka/apps/", False),
        ("eureka/apps/?", "eureka/apps/a", True),
        ("eureka/**/lists", "eureka/apps/lists", True),
        ("eureka/**/lists", "eureka/apps/test/lists", True),
        ("eureka/**/lists", "eureka/apps/test/", False),
        ("eureka/**/lists", "eureka/apps/test", False),
        ("eureka/**/test/**", "eureka/apps/test/list", True),
        ("eureka/**/test/**", "eureka/apps/foo/test/list/bar", True),
        ("eureka/**/test/**", "eureka/test/list", True),
        ("eureka/*/**/test/**", "eureka/test/list", False),
        ("/eureka/**/b/**/*.txt", "/eureka/a/aa/aaa/b/bb/bbb/xxxxxx.txt", True),
        ("/eureka/**/b/**/*.txt", "/eureka/a/aa/aaa/b/bb/bbb/xxxxxx", False),
    ],
)
def test_ant_patterns(pattern: str, path: str, matches: bool) -> None:
    assert ignore.IgnoreRules(paths=[pattern]).ignore_operation(path) is matches


def test_ignored_paths_suffixes_and_methods(trace_sink: _sink.MemorySink) -> None:
    tracing.configure(
        load({}, agent_trace_ignore_path="/health,/static/**", plugin_http_ignore_method="options")
    )
    for op in ("/health", "/static/app.js", "/logo.png", "/style.css"):
        with new_entry_span(op) as s:
            assert isinstance(s, IgnoredSpan)
            assert new_exit_span("/x", "h:1") is NOOP
    with new_entry_span("/orders") as s:
        assert s.recording
    assert len(trace_sink.records) == 1
    assert tracing.stats.ignored == 4
    assert policy.rules.ignore_method("OPTIONS") and not policy.rules.ignore_method("GET")


def test_finish_without_context_manager_and_idempotent(trace_sink: _sink.MemorySink) -> None:
    s = new_exit_span("/x", "h:1")
    s.finish()
    s.finish()
    assert len(trace_sink.records) == 1
