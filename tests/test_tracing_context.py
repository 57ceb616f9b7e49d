"""Context propagation inside a process: threads, asyncio tasks, nesting, out-of-order finishes."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from reporter_proc import records as R
from swmp import _sink, tracing
from swmp.config import load
from swmp.tracing.context import active_span, capture, new_entry_span, new_exit_span, new_local_span, trace_id
from swmp.tracing.span import Span


def segments(sink: _sink.MemorySink) -> list[list[Any]]:
    return [orjson.loads(p) for _, p in sink.records]


def check_tree(seg: list[Any]) -> None:
    """Span ids unique, every parent present in the segment."""
    spans = seg[R.SEG_SPANS]
    ids = [s[R.SPAN_ID] for s in spans]
    assert len(ids) == len(set(ids))
    for s in spans:
        assert s[R.SPAN_PARENT_ID] == -1 or s[R.SPAN_PARENT_ID] in ids


def test_nesting_restores_the_current_span(trace_sink: _sink.MemorySink) -> None:
    assert active_span() is None and trace_id() == ""
    with new_entry_span("/a") as a:
        assert active_span() is a
        with new_local_span("b") as b:
            assert active_span() is b
        assert active_span() is a
        assert trace_id() == a.segment.trace_id
    assert active_span() is None


def test_threads_without_context_start_their_own_traces(trace_sink: _sink.MemorySink) -> None:
    barrier = threading.Barrier(4)

    def work(i: int) -> None:
        with new_entry_span(f"/t{i}"):
            barrier.wait(5)
            with new_local_span(f"inner{i}"):
                pass

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    segs = segments(trace_sink)
    assert len(segs) == 4
    assert len({s[R.SEG_TRACE_ID] for s in segs}) == 4
    for seg in segs:
        assert len(seg[R.SEG_SPANS]) == 2
        check_tree(seg)


def test_threads_sharing_a_segment_through_copied_context(trace_sink: _sink.MemorySink) -> None:
    tracing.configure(load({}, agent_span_limit=1000))
    with new_entry_span("/fanout") as root, ThreadPoolExecutor(8) as pool:
        futures = []
        for i in range(200):
            ctx = contextvars.copy_context()
            futures.append(pool.submit(ctx.run, _child_work, i))
        for f in futures:
            f.result()
    (seg,) = segments(trace_sink)
    check_tree(seg)
    spans = seg[R.SEG_SPANS]
    assert len(spans) == 1 + 200 * 2
    parents = {s[R.SPAN_OPERATION]: s[R.SPAN_PARENT_ID] for s in spans}
    assert all(parents[f"child{i}"] == root.span_id for i in range(200))
    assert tracing.stats.spans_lost == 0


def _child_work(i: int) -> None:
    with new_local_span(f"child{i}") as c, new_exit_span(f"/call{i}", "h:1") as e:
        assert e.segment is c.segment


def test_asyncio_tasks_are_children_of_the_spawning_span(trace_sink: _sink.MemorySink) -> None:
    async def child(i: int) -> int:
        with new_local_span(f"task{i}") as s:
            await asyncio.sleep(0)
            with new_exit_span(f"/x{i}", "h:1") as e:
                await asyncio.sleep(0)
                assert active_span() is e
            assert active_span() is s
            return s.span_id

    async def main() -> None:
        with new_entry_span("/async") as root:
            ids = await asyncio.gather(*(child(i) for i in range(20)))
            assert len(set(ids)) == 20
            assert active_span() is root

    asyncio.run(main())
    (seg,) = segments(trace_sink)
    check_tree(seg)
    assert len(seg[R.SEG_SPANS]) == 41


def test_out_of_order_finish_keeps_segment_whole(trace_sink: _sink.MemorySink) -> None:
    parent = new_entry_span("/a")
    parent.__enter__()
    child = new_local_span("child")
    child.__enter__()
    parent.finish()  # parent first: the segment waits for the child
    assert trace_sink.records == []
    assert active_span() is child
    grandchild = new_local_span("grandchild")  # still in the same segment
    assert isinstance(grandchild, Span) and grandchild.segment is parent.segment
    grandchild.finish()
    child.__exit__(None, None, None)
    assert active_span() is None
    (seg,) = segments(trace_sink)
    check_tree(seg)
    assert len(seg[R.SEG_SPANS]) == 3


def test_span_finished_in_another_task(trace_sink: _sink.MemorySink) -> None:
    async def main() -> None:
        with new_entry_span("/a"):
            span = new_exit_span("/slow", "h:1")  # started here, not made current

            async def finisher() -> None:
                await asyncio.sleep(0)
                span.finish()

            await asyncio.create_task(finisher())

    asyncio.run(main())
    (seg,) = segments(trace_sink)
    assert {s[R.SPAN_OPERATION] for s in seg[R.SEG_SPANS]} == {"/a", "/slow"}


def test_late_span_after_emission_continues_the_trace(trace_sink: _sink.MemorySink) -> None:
    """A task that outlives its request: its spans go to a new segment of the same trace."""

    async def main() -> None:
        done = asyncio.Event()
        root = new_entry_span("/a")
        root.__enter__()

        async def background() -> None:
            await done.wait()
            with new_local_span("after"):
                pass

        task = asyncio.create_task(background())
        root.__exit__(None, None, None)
        done.set()
        await task

    asyncio.run(main())
    first, second = segments(trace_sink)
    assert second[R.SEG_TRACE_ID] == first[R.SEG_TRACE_ID]
    assert second[R.SEG_SEGMENT_ID] != first[R.SEG_SEGMENT_ID]
    (late,) = second[R.SEG_SPANS]
    assert late[R.SPAN_REFS][0][:4] == [R.REF_CROSS_THREAD, first[R.SEG_TRACE_ID], first[R.SEG_SEGMENT_ID], 0]


def test_capture_continues_in_another_thread(trace_sink: _sink.MemorySink) -> None:
    out: list[Any] = []
    with new_entry_span("/a") as root:
        snap = capture()
        assert snap is not None

        def worker() -> None:
            with new_local_span("bg", carrier=snap) as s:
                out.append(s)

        t = threading.Thread(target=worker)
        t.start()
        t.join()
    segs = segments(trace_sink)
    assert len(segs) == 2
    bg_seg = next(s for s in segs if s[R.SEG_SPANS][0][R.SPAN_OPERATION] == "bg")
    ref = bg_seg[R.SEG_SPANS][0][R.SPAN_REFS][0]
    assert ref[0] == R.REF_CROSS_THREAD
    assert ref[1] == root.segment.trace_id and ref[2] == root.segment.segment_id and ref[3] == root.span_id
    assert ref[6] == "/a"
    assert capture() is None
