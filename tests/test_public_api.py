"""The public API: a small, deliberate ``__all__``, and the functions behind it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

import swmp
from reporter_proc import records as R
from swmp import _sink
from swmp.config import Config

EXPECTED = {
    "Component",
    "Config",
    "Counter",
    "CounterMode",
    "Gauge",
    "Histogram",
    "Layer",
    "capture",
    "current_span",
    "entry_span",
    "error",
    "exit_span",
    "extract",
    "get_correlation",
    "inject",
    "local_span",
    "log",
    "set_correlation",
    "start",
    "stop",
    "tag",
    "trace",
    "trace_id",
}


def segments(sink: _sink.MemorySink) -> list[list[Any]]:
    return [orjson.loads(p) for t, p in sink.records if t == R.SEGMENT]


def test_all_is_small_and_exact() -> None:
    assert set(swmp.__all__) == EXPECTED, (
        "changing the public API is a decision: update EXPECTED deliberately"
    )
    assert len(swmp.__all__) == len(set(swmp.__all__))
    for name in swmp.__all__:
        assert getattr(swmp, name) is not None
    public = {n for n in vars(swmp) if not n.startswith("_") and not isinstance(getattr(swmp, n), type(swmp))}
    assert public == EXPECTED  # nothing else leaks at the top level


def test_start_maps_keywords_to_config_and_calls_agent_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    import swmp.agent

    got: list[Config] = []
    monkeypatch.setattr(swmp.agent, "start", got.append)
    cfg = swmp.start(agent_name="svc", sample_n_per_3_secs=5)
    assert got == [cfg]
    assert cfg.agent_name == "svc" and cfg.sample_n_per_3_secs == 5
    stopped: list[bool] = []
    monkeypatch.setattr(swmp.agent, "stop", lambda: stopped.append(True))
    swmp.stop()
    assert stopped == [True]


def test_manual_spans_headers_and_helpers(trace_sink: _sink.MemorySink) -> None:
    assert swmp.trace_id() == ""
    swmp.tag("ignored", "outside any span")  # no-op, no error
    with swmp.entry_span("/in", {"no": "sw8"}) as entry:
        assert swmp.current_span() is entry
        swmp.tag("user", "u1")
        swmp.log("hello", n=1)
        assert swmp.set_correlation("tenant", "t1")
        assert swmp.get_correlation("tenant") == "t1"
        with swmp.exit_span("/out", "svc-b:80", component=swmp.Component.REQUESTS) as ex:
            headers = ex.inject()
            plain: dict[str, str] = {}
            swmp.inject(plain)
        # The entry span has no peer: sw8 without the address used at the client is refused
        # by its receivers (swmp, the Java and Python agents), so none is given.
        assert swmp.inject() == {}
        tid = swmp.trace_id()
    assert tid
    carrier = swmp.extract(headers)
    assert carrier is not None and carrier.trace_id == tid and carrier.span_id == ex.span_id
    assert carrier.correlation == {"tenant": "t1"}
    assert swmp.extract(plain).span_id == ex.span_id  # type: ignore[union-attr]
    with swmp.entry_span("/downstream", headers) as down:
        assert swmp.get_correlation("tenant") == "t1"
    up, dn = segments(trace_sink)
    assert dn[R.SEG_TRACE_ID] == up[R.SEG_TRACE_ID]
    assert dn[R.SEG_SPANS][0][R.SPAN_REFS][0][3] == ex.span_id
    assert down.segment.trace_id == tid
    # WSGI environ and ASGI header lists work for extract too.
    assert swmp.extract({"HTTP_SW8": headers["sw8"]}) is not None
    assert swmp.extract([(b"sw8", headers["sw8"].encode())]) is not None


def test_correlation_limits(trace_sink: _sink.MemorySink) -> None:
    with swmp.local_span("a"):
        assert all(swmp.set_correlation(f"k{i}", "v") for i in range(3))
        assert not swmp.set_correlation("k3", "v")  # default: at most 3 entries
        assert not swmp.set_correlation("k0", "x" * 129)  # default: values up to 128
        assert swmp.set_correlation("k0", "new")
    assert not swmp.set_correlation("k", "v")  # no span


def test_correlation_of_other_types_is_refused_not_raised_later(trace_sink: _sink.MemorySink) -> None:
    """A key or value that is not text is refused (False) rather than stored: stored, it made
    every outgoing call of the trace raise into the application from inject()."""
    with swmp.entry_span("/in"):
        assert swmp.set_correlation("ok", "v")
        assert not swmp.set_correlation("k", ["x"])  # type: ignore[arg-type]
        assert not swmp.set_correlation(7, "v")  # type: ignore[arg-type]
        assert not swmp.set_correlation("k", None)  # type: ignore[arg-type]
        with swmp.exit_span("/out", "svc-b:80") as ex:
            headers = ex.inject()
    carrier = swmp.extract(headers)
    assert carrier is not None and carrier.correlation == {"ok": "v"}


def test_trace_decorator_sync_async_and_error(trace_sink: _sink.MemorySink) -> None:
    @swmp.trace
    def add(a: int, b: int) -> int:
        return a + b

    @swmp.trace(op="fetch")
    async def fetch() -> str:
        await asyncio.sleep(0)
        return swmp.trace_id()

    @swmp.trace
    def broken() -> None:
        raise KeyError("k")

    assert add(1, 2) == 3
    assert asyncio.run(fetch())
    with pytest.raises(KeyError):
        broken()
    ops = [seg[R.SEG_SPANS][0][R.SPAN_OPERATION] for seg in segments(trace_sink)]
    assert ops == [
        f"{__name__}.test_trace_decorator_sync_async_and_error.<locals>.add",
        "fetch",
        f"{__name__}.test_trace_decorator_sync_async_and_error.<locals>.broken",
    ]
    assert segments(trace_sink)[2][R.SEG_SPANS][0][R.SPAN_IS_ERROR] is True
    assert add.__name__ == "add"


def test_error_helper_uses_the_handled_exception(trace_sink: _sink.MemorySink) -> None:
    with swmp.local_span("a"):
        try:
            raise OSError("disk")
        except OSError:
            swmp.error()
    (seg,) = segments(trace_sink)
    span = seg[R.SEG_SPANS][0]
    assert span[R.SPAN_IS_ERROR] is True
    assert "OSError" in span[R.SPAN_LOGS][0][1]


def test_capture_and_continue_in_thread(trace_sink: _sink.MemorySink) -> None:
    with swmp.entry_span("/a") as root:
        snap = swmp.capture()
        t = threading.Thread(target=lambda: swmp.local_span("bg", parent=snap).finish())
        t.start()
        t.join()
    refs = [
        s[R.SPAN_REFS]
        for seg in segments(trace_sink)
        for s in seg[R.SEG_SPANS]
        if s[R.SPAN_OPERATION] == "bg"
    ]
    assert refs[0][0][2] == root.segment.segment_id


def _spans(sink: _sink.MemorySink) -> dict[str, list[Any]]:
    return {s[R.SPAN_OPERATION]: s for seg in segments(sink) for s in seg[R.SEG_SPANS]}


def test_trace_keeps_a_generator_a_generator_and_covers_its_iteration(trace_sink: _sink.MemorySink) -> None:
    """A yield dependency (FastAPI, contextlib) must stay a generator function; the span
    covers the iteration and is current only while the generator runs."""
    import inspect

    seen: list[str] = []

    @swmp.trace(op="gen")
    def numbers(n: int) -> Iterator[int]:
        for i in range(n):
            with swmp.local_span(f"inner{i}"):
                received = yield i
                seen.append(f"{received}")
        return

    assert inspect.isgeneratorfunction(numbers)
    with swmp.entry_span("/req") as root:
        gen = numbers(2)
        assert next(gen) == 0
        assert swmp.current_span() is root  # the suspended generator is not the caller's parent
        with swmp.local_span("between"):
            pass
        assert gen.send("a") == 1
        with pytest.raises(StopIteration):
            gen.send("b")
        broken = numbers(3)
        next(broken)
        with pytest.raises(ValueError):
            broken.throw(ValueError("bad"))
        closed = numbers(3)
        next(closed)
        closed.close()
    assert seen == ["a", "b"]
    spans = _spans(trace_sink)
    ids = {op: s[R.SPAN_ID] for op, s in spans.items()}
    assert spans["between"][R.SPAN_PARENT_ID] == ids["/req"]
    assert spans["inner0"][R.SPAN_PARENT_ID] in {s[R.SPAN_ID] for o, s in spans.items() if o == "gen"}
    gens = [s for seg in segments(trace_sink) for s in seg[R.SEG_SPANS] if s[R.SPAN_OPERATION] == "gen"]
    assert len(gens) == 3
    assert [g[R.SPAN_IS_ERROR] for g in gens] == [False, True, False]
    assert all(g[R.SPAN_PARENT_ID] == ids["/req"] for g in gens)


def test_trace_keeps_an_async_generator_one(trace_sink: _sink.MemorySink) -> None:
    import contextlib
    import inspect

    @swmp.trace(op="agen")
    async def resource() -> Any:
        with swmp.local_span("setup"):
            await asyncio.sleep(0)
        yield "r"
        with swmp.local_span("teardown"):
            pass

    assert inspect.isasyncgenfunction(resource)

    async def main() -> list[str]:
        got = []
        with swmp.entry_span("/a"):
            async with contextlib.asynccontextmanager(resource)() as r:
                got.append(r)
                with swmp.local_span("use"):
                    await asyncio.sleep(0)
        return got

    assert asyncio.run(main()) == ["r"]
    spans = _spans(trace_sink)
    assert spans["agen"][R.SPAN_PARENT_ID] == spans["/a"][R.SPAN_ID]
    assert spans["use"][R.SPAN_PARENT_ID] == spans["/a"][R.SPAN_ID]
    assert spans["setup"][R.SPAN_PARENT_ID] == spans["teardown"][R.SPAN_PARENT_ID] == spans["agen"][R.SPAN_ID]
    assert spans["agen"][R.SPAN_END] >= spans["teardown"][R.SPAN_END]


def test_trace_on_classmethods_staticmethods_and_callables(trace_sink: _sink.MemorySink) -> None:
    import functools

    class Shop:
        @swmp.trace
        @classmethod
        def make(cls) -> type:
            return cls

        @swmp.trace(op="static")
        @staticmethod
        def price() -> int:
            return 2

    def add(a: int, b: int) -> int:
        return a + b

    plus_one = swmp.trace(functools.partial(add, 1))
    assert Shop.make() is Shop and Shop().make() is Shop
    assert Shop.price() == 2
    assert plus_one(2) == 3
    ops = [seg[R.SEG_SPANS][0][R.SPAN_OPERATION] for seg in segments(trace_sink)]
    assert ops[0].endswith("Shop.make") and ops[1].endswith("Shop.make")
    assert ops[2:] == ["static", "functools.partial"]


def test_tag_keys_and_values_that_are_not_strings(trace_sink: _sink.MemorySink) -> None:
    """The reporter encodes tag keys as strings: a non-string key must not lose the trace."""
    from reporter_proc import encode

    with swmp.entry_span("/t"):
        swmp.tag(7, "x")  # type: ignore[arg-type]
        swmp.tag("n", 5)
        swmp.tag("none", None)
    ((_, payload),) = trace_sink.records
    assert orjson.loads(payload)[R.SEG_SPANS][0][R.SPAN_TAGS] == ["7", "x", "n", "5", "none", "None"]
    assert encode.segment_payload(payload)


def test_operation_names_and_peers_that_are_not_text(trace_sink: _sink.MemorySink) -> None:
    """An operation name or peer of another type (an enum member, a number) is recorded as its
    text: the ignore rules raised AttributeError into the application on a first span, and
    a name set with set_operation() made the reporter refuse the segment."""
    from reporter_proc import encode

    with swmp.local_span(123):  # type: ignore[arg-type]
        pass
    with swmp.entry_span(124) as entry:  # type: ignore[arg-type]
        entry.set_operation(5)  # type: ignore[arg-type]
        with swmp.exit_span(6, 7) as ex:  # type: ignore[arg-type]
            ex.set_peer(8)  # type: ignore[arg-type]
    with swmp.exit_span("x", None):  # type: ignore[arg-type]
        pass

    @swmp.trace(op=9)  # type: ignore[arg-type]
    def work() -> int:
        return 1

    assert work() == 1
    segs = segments(trace_sink)
    assert [[s[R.SPAN_OPERATION] for s in seg[R.SEG_SPANS]] for seg in segs] == [
        ["123"],
        ["6", "5"],
        ["x"],
        ["9"],
    ]
    assert [s[R.SPAN_PEER] for s in segs[1][R.SEG_SPANS]] == ["8", ""]
    assert segs[2][R.SEG_SPANS][0][R.SPAN_PEER] == ""
    assert all(encode.segment_payload(p) for _, p in trace_sink.records)
