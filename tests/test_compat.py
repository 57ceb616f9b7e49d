"""Migration from the Apache SkyWalking Python agent: its API under ``swmp.compat``, and its
``SW_*`` variables (the ones swmp has no use for are named once, never ignored silently)."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from reporter_proc import records as R
from swmp import _peer_config, _sink, config
from swmp.config import load

REPO = Path(__file__).resolve().parent.parent


def spans(sink: _sink.MemorySink) -> list[list[Any]]:
    out = []
    for t, p in sink.records:
        if t == R.SEGMENT:
            seg = orjson.loads(p)
            out += [[seg[R.SEG_TRACE_ID], seg[R.SEG_SEGMENT_ID], s] for s in seg[R.SEG_SPANS]]
    return out


def by_op(sink: _sink.MemorySink, op: str) -> list[Any]:
    return [s for _, _, s in spans(sink) if s[R.SPAN_OPERATION] == op]


def test_the_peer_agents_api_doc_example_runs_unchanged(trace_sink: _sink.MemorySink) -> None:
    """The code of the SkyWalking Python agent's API.md, with ``skywalking`` -> ``swmp.compat``."""
    from swmp.compat import Component
    from swmp.compat.trace.context import SpanContext, get_context
    from swmp.compat.trace.tags import Tag

    context: SpanContext = get_context()
    with context.new_entry_span(op="https://github.com/apache") as span:
        span.component = Component.Flask

    class TagSinger(Tag):
        key = "Singer"

    with context.new_exit_span(
        op="https://github.com/apache", peer="localhost:8080", component=Component.Flask
    ) as span:
        span.tag(TagSinger("Nakajima"))

    with context.new_local_span(op="https://github.com/apache") as span:
        span.tag(TagSinger("Nakajima"))

    got = spans(trace_sink)
    assert len(got) == 3
    entry, exit_, local = (s for _, _, s in got)
    assert entry[R.SPAN_COMPONENT] == 7001 and exit_[R.SPAN_COMPONENT] == 7001
    assert exit_[R.SPAN_PEER] == "localhost:8080"
    assert exit_[R.SPAN_TAGS] == ["Singer", "Nakajima"] and local[R.SPAN_TAGS] == ["Singer", "Nakajima"]


def test_decorators_as_the_peer_docs_show_them(trace_sink: _sink.MemorySink) -> None:
    from swmp.compat import Component
    from swmp.compat.decorators import runnable, trace
    from swmp.compat.trace.context import SpanContext, get_context

    @trace()  # the operation name is the method name by default
    def some_other_method() -> str:
        return "other"

    @trace(op="awesome")
    def some_method() -> str:
        return some_other_method()

    @trace(op="async_functions_are_also_supported")
    async def async_func() -> str:
        return "asynchronous"

    @trace()
    async def async_func2() -> str:
        return await async_func()

    @runnable()  # cross thread propagation
    def in_thread() -> None:
        some_other_method()

    context: SpanContext = get_context()
    with context.new_entry_span(op="https://github.com/apache/skywalking") as span:
        span.component = Component.Flask
        assert some_method() == "other"
        assert asyncio.run(async_func2()) == "asynchronous"
        t = threading.Thread(target=in_thread.continue_tracing())
        t.start()
        t.join()
        entry_segment = span._span.segment.segment_id

    assert len(by_op(trace_sink, "awesome")) == 1 and len(by_op(trace_sink, "some_other_method")) == 2
    assert len(by_op(trace_sink, "async_functions_are_also_supported")) == 1
    (thread_span,) = by_op(trace_sink, "Thread/in_thread")
    (ref,) = thread_span[R.SPAN_REFS]
    assert ref[0] == 1 and ref[2] == entry_segment  # a cross-thread reference to the entry's segment
    trace_ids = {tid for tid, _, _ in spans(trace_sink)}
    assert len(trace_ids) == 1  # one trace throughout


def test_the_trace_decorator_keeps_generators_and_takes_classmethods_and_callables(
    trace_sink: _sink.MemorySink,
) -> None:
    """As ``swmp.trace`` (the same wrappers): a generator function stays one, its span
    covering the iteration; ``@trace()`` above ``@classmethod`` and on a callable without
    ``__name__`` works instead of raising at the call or at the application's import."""
    import contextlib
    import functools
    import inspect

    from swmp.compat.decorators import runnable, trace
    from swmp.compat.trace.context import get_context
    from swmp.compat.trace.tags import TagHttpMethod

    @trace(op="gen", tags=[TagHttpMethod("GET")])
    def numbers(n: int) -> Iterator[int]:
        for i in range(n):
            with get_context().new_local_span(f"inner{i}"):
                yield i

    @trace()
    async def resource() -> Any:
        yield "r"

    class Shop:
        @trace()
        @classmethod
        def make(cls) -> type:
            return cls

        @trace(op="static")
        @staticmethod
        def price() -> int:
            return 2

    def add(a: int, b: int) -> int:
        return a + b

    plus_one = trace()(functools.partial(add, 1))
    plus_two = runnable()(functools.partial(add, 2))
    assert inspect.isgeneratorfunction(numbers) and inspect.isasyncgenfunction(resource)

    async def use() -> str:
        async with contextlib.asynccontextmanager(resource)() as r:
            return str(r)

    with get_context().new_entry_span(op="/req") as entry:
        assert list(numbers(2)) == [0, 1]
        assert asyncio.run(use()) == "r"
        assert Shop.make() is Shop and Shop.price() == 2
        assert plus_one(2) == 3 and plus_two(2) == 4
    root = entry.sid
    (gen,) = by_op(trace_sink, "gen")
    assert gen[R.SPAN_PARENT_ID] == root and gen[R.SPAN_TAGS] == ["http.method", "GET"]
    assert by_op(trace_sink, "inner0")[0][R.SPAN_PARENT_ID] == gen[R.SPAN_ID]
    assert by_op(trace_sink, "inner1")[0][R.SPAN_PARENT_ID] == gen[R.SPAN_ID]
    assert gen[R.SPAN_END] >= by_op(trace_sink, "inner1")[0][R.SPAN_END]
    for op in ("resource", "make", "static", "partial", "Thread/partial"):
        assert len(by_op(trace_sink, op)) == 1, op


def test_the_decorators_on_methods_bind_as_the_functions_they_wrap(trace_sink: _sink.MemorySink) -> None:
    """``@runnable()`` on a method binds ``self`` (in the call and in
    ``obj.method.continue_tracing()``), and above ``@classmethod`` / ``@staticmethod`` it is
    named and called as the peer agent's would be (``Thread/<name>``, ``cls`` bound);
    ``@trace()`` on a method binds ``self`` too. Plain functions are unchanged."""
    from swmp.compat.decorators import runnable, trace
    from swmp.compat.trace.context import get_context

    class Worker:
        def __init__(self, base: int) -> None:
            self.base = base

        @runnable()
        def add(self, x: int) -> int:
            return self.base + x

        @runnable(op="Thread/make")
        @classmethod
        def make(cls, base: int) -> Worker:
            return cls(base)

        @runnable()
        @staticmethod
        def double(x: int) -> int:
            return 2 * x

        @trace()
        def traced_add(self, x: int) -> int:
            return self.base + x

        @runnable()
        @classmethod
        def kind(cls) -> type:
            return cls

    @runnable()
    def plain(x: int) -> int:
        return x

    w = Worker(10)
    results: list[int] = []
    with get_context().new_entry_span(op="/methods") as entry:
        assert w.add(1) == 11 and Worker.add(w, 2) == 12
        assert Worker.make(5).base == 5 and w.make(6).base == 6
        assert Worker.double(4) == 8 and w.double(5) == 10
        assert w.traced_add(3) == 13
        assert Worker.kind() is Worker and w.kind() is Worker
        assert plain(7) == 7 and plain.continue_tracing()(8) == 8
        t = threading.Thread(target=lambda f: results.append(f(100)), args=(w.add.continue_tracing(),))
        t.start()
        t.join()
        entry_segment = entry._span.segment.segment_id
    assert results == [110]
    assert w.add.__name__ == "add" and Worker.kind.__name__ == "kind"
    assert len(by_op(trace_sink, "Thread/add")) == 3 and len(by_op(trace_sink, "Thread/make")) == 2
    assert len(by_op(trace_sink, "Thread/double")) == 2 and len(by_op(trace_sink, "Thread/kind")) == 2
    assert len(by_op(trace_sink, "traced_add")) == 1 and len(by_op(trace_sink, "Thread/plain")) == 2
    (in_thread,) = [s for _, seg, s in spans(trace_sink) if seg != entry_segment]
    assert in_thread[R.SPAN_OPERATION] == "Thread/add"
    (ref,) = in_thread[R.SPAN_REFS]
    assert ref[0] == 1 and ref[2] == entry_segment  # the bound form continues the trace across threads


def test_context_api_correlation_active_span_and_carrier(trace_sink: _sink.MemorySink) -> None:
    from swmp.compat import Component, Kind, Layer
    from swmp.compat.trace.carrier import Carrier
    from swmp.compat.trace.context import get_context

    ctx = get_context()
    assert ctx.active_span is None and ctx.capture() is None
    with ctx.new_entry_span(op="/in") as entry:
        assert ctx.active_span is not None and ctx.active_span.sid == entry.sid == 0
        assert entry.kind is Kind.Entry
        ctx.put_correlation("tenant", "t1")
        assert ctx.get_correlation("tenant") == "t1"
        ctx.put_correlation("tenant", None)  # None removes, as in the peer agent
        assert ctx.get_correlation("tenant") is None
        ctx.put_correlation("user", "u1")
        with ctx.new_exit_span(op="/out", peer="b:80", component=Component.Requests) as out:
            out.layer = Layer.Http
            headers = {item.key: item.val for item in out.inject() if item.val}
        try:
            raise ValueError("boom")
        except ValueError:
            entry.raised()
    assert out.layer is Layer.Http and out.component is Component.Requests
    assert entry.error_occurred
    # The downstream side, as the peer's plugins read a carrier.
    carrier = Carrier()
    for item in carrier:
        item.val = headers.get(item.key, "")
    with ctx.new_entry_span(op="/downstream", carrier=carrier) as down:
        assert ctx.get_correlation("user") == "u1"
    (down_span,) = by_op(trace_sink, "/downstream")
    assert down_span[R.SPAN_REFS][0][3] == out.sid  # parent span id: the exit span
    assert down._span.segment.trace_id == entry._span.segment.trace_id


def test_context_api_names_and_peers_that_are_not_text(trace_sink: _sink.MemorySink) -> None:
    """Names and peers of another type are recorded as their text: never raised, never lost."""
    from reporter_proc import encode
    from swmp.compat.trace.context import get_context

    context = get_context()
    with context.new_entry_span(op=1) as entry:  # type: ignore[arg-type]
        with context.new_exit_span(op=2, peer=3):  # type: ignore[arg-type]
            pass
        with context.new_local_span(op=4) as local:  # type: ignore[arg-type]
            local.op = 5  # type: ignore[assignment]
            local.peer = 6  # type: ignore[assignment]
        entry.op = 7  # type: ignore[assignment]
    ops = {s[R.SPAN_OPERATION]: s[R.SPAN_PEER] for _, _, s in spans(trace_sink)}
    assert ops == {"7": "", "2": "3", "5": "6"}
    assert all(encode.segment_payload(p) for _, p in trace_sink.records)


def test_unsupported_peer_variables_are_named_once_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    env = {
        "SW_AGENT_NAME": "svc",
        "SW_AGENT_QUEUE_TIMEOUT": "5",
        "SW_AGENT_EXPERIMENTAL_FORK_SUPPORT": "true",
        "SW_AGENT_TRACE_REPORTER_MAX_BUFFER_SIZE": "100",
    }
    config._load._reported.clear()
    with caplog.at_level(logging.WARNING, logger="swmp.config"):
        load(env)
        load(env)  # workers load again: not repeated
    lines = [r.getMessage() for r in caplog.records if "no effect in swmp" in r.getMessage()]
    assert lines == [
        "swmp: these SkyWalking Python agent settings have no effect in swmp: "
        "SW_AGENT_EXPERIMENTAL_FORK_SUPPORT, SW_AGENT_QUEUE_TIMEOUT, SW_AGENT_TRACE_REPORTER_MAX_BUFFER_SIZE "
        "(see docs/migrating.md)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="swmp.config"):
        load({"SW_AGENT_NAME": "svc", "SW_AGENT_LOG_REPORTER_LEVEL": "ERROR"})  # all supported
    assert not [r for r in caplog.records if "no effect" in r.getMessage()]


def test_every_peer_variable_is_listed_and_documented() -> None:
    """The table matches the peer agent's config module (when it is installed) and every
    variable has its line in docs/migrating.md, with what swmp does with it."""
    try:
        spec = importlib.util.find_spec("skywalking.config")
    except ModuleNotFoundError:  # the peer agent (the bench extra) is not installed
        spec = None
    if spec is not None and spec.origin:
        source = Path(spec.origin).read_text()
        peer = set(re.findall(r"os\.getenv\('(SW_[A-Z0-9_]+)'", source))
        peer.discard("SW_AGENT_ACTUAL_OPTION")  # the example in that module's docstring
        assert peer == set(_peer_config.PEER_VARIABLES)
    doc = (REPO / "docs" / "migrating.md").read_text()
    declared = {name for s in config.settings() for name in (s.env, *s.aliases)}
    for var, why in _peer_config.PEER_VARIABLES.items():
        row = [line for line in doc.splitlines() if line.startswith(f"| `{var}`")]
        assert len(row) == 1, var
        if var in declared:
            assert "supported" in row[0], row[0]
        else:
            assert "no effect" in row[0] and why and why.split(":")[0] in row[0], row[0]


def test_the_compat_surface_is_pinned_and_stays_out_of_swmps_own_api() -> None:
    import swmp
    import swmp.compat
    import swmp.compat.decorators
    import swmp.compat.trace.context

    assert swmp.compat.__all__ == ["Component", "Kind", "Layer"]
    assert swmp.compat.decorators.__all__ == ["runnable", "trace"]
    assert swmp.compat.trace.context.__all__ == ["Snapshot", "Span", "SpanContext", "get_context"]
    assert "compat" not in swmp.__all__  # swmp's curated API is unchanged (tests/test_public_api.py)


def test_inject_from_a_span_without_a_peer_gives_an_empty_carrier(trace_sink: _sink.MemorySink) -> None:
    """``sw8`` with an empty peer is refused by every receiver (swmp, the Java and the Python
    agents): an entry or local span, or an exit span whose peer is empty, injects nothing, as
    ``swmp.inject()`` does (before: a full ``sw8`` with an empty peer). The peer agent raised."""
    from swmp.compat.trace.context import get_context
    from swmp.propagation import decode_sw8

    ctx = get_context()
    with ctx.new_entry_span(op="/in") as entry, ctx.new_local_span(op="work") as local:
        with ctx.new_exit_span(op="/out", peer="") as no_peer:
            empty = [entry.inject(), local.inject(), no_peer.inject()]
        with ctx.new_exit_span(op="/out", peer="b:80") as out:
            full = out.inject()
    for carrier in empty:
        assert [(item.key, item.val) for item in carrier] == [
            ("sw8", ""),
            ("sw8-correlation", ""),
            ("sw8-x", ""),
        ]
        assert not carrier.is_valid
    headers = {item.key: item.val for item in full if item.val}
    assert decode_sw8(headers["sw8"]) is not None  # a receiver takes the exit span's
