"""Spans through every path of the span core; prints the records and counters as JSON.

Run by tests/test_spancore.py once with the native core and once with the pure-Python one
(``SWMP_TRACE_PURE``); the two outputs must be equal. Timestamps and ids differ between runs,
so ids are replaced by their order of appearance and times by whether they are in order
(what the comparison needs is that the same spans end up in the same records with the same
fields, parents and references).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from typing import Any

import orjson

from swmp import _sink, tracing
from swmp.config import load
from swmp.propagation import decode_sw8
from swmp.tracing import Component, Layer
from swmp.tracing.context import capture, new_entry_span, new_exit_span, new_local_span
from swmp.tracing.limits import limits
from swmp.tracing.segment import Segment
from swmp.tracing.span import NATIVE, Span


class Boom(Exception):
    pass


# What the exit spans over the span limit injected (decoded sw8 fields), in order.
INJECTED: list[list[Any]] = []


def scenario() -> None:
    # An entry with local and exit children, tags of every kind, an exception.
    with new_entry_span("/orders", None, Component.FLASK, Layer.HTTP) as entry:
        entry.tag("http.method", "GET")
        with new_local_span("price") as local:
            local.log("computing", step=1)
            with new_exit_span("/stock", "stock:80", Component.REQUESTS, Layer.HTTP) as ex:
                ex.tag("http.status_code", 200)
                headers = ex.inject()
                # An exit inside an exit is the no-op span.
                with new_exit_span("/inner", "x:1", Component.REQUESTS, Layer.HTTP) as inner:
                    assert not inner.recording
        try:
            with new_exit_span("SELECT", "db:5432", Component.PSYCOPG, Layer.DATABASE) as db:
                db.tags = ["db.type", "PostgreSQL", "db.statement", "SELECT 1"]
                raise Boom("no rows")
        except Boom:
            pass
        # An exit span finished by hand, not made current; then one with an explicit end.
        manual = new_exit_span("/manual", "m:1", Component.HTTPX, Layer.HTTP)
        manual.finish()
        manual.finish()  # idempotent
        timed = new_exit_span("/timed", "t:1", Component.HTTPX, Layer.HTTP)
        timed.finish(end_ms=timed.start + 7)
        assert timed.end == timed.start + 7
        entry.set_operation("/orders/{id}")
    # Continue the trace from the injected header in a "downstream" entry.
    carrier = decode_sw8(headers["sw8"])
    assert carrier is not None
    with new_entry_span("/downstream", carrier, Component.FLASK, Layer.HTTP):
        pass
    # Out of order: the parent finishes before its child; the child ends the segment.
    root = new_local_span("out-of-order").__enter__()
    child = new_exit_span("/late-child", "c:1", Component.REQUESTS, Layer.HTTP).__enter__()
    root.__exit__(None, None, None)
    child.__exit__(None, None, None)
    # A span finished in another thread, and a snapshot continued there.
    with new_entry_span("/threaded", None, Component.FLASK, Layer.HTTP):
        other = new_exit_span("/from-thread", "th:1", Component.REQUESTS, Layer.HTTP)
        snap = capture()
        t = threading.Thread(target=other.finish)
        t.start()
        t.join()

    def worker() -> None:
        with (
            new_local_span("in-thread", carrier=snap),
            new_exit_span("/thread-exit", "te:1", Component.REQUESTS, Layer.HTTP),
        ):
            pass

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    # A late span: the request's segment is already emitted.
    with new_entry_span("/late", None, Component.FLASK, Layer.HTTP):
        pass
    late = new_exit_span("/after-end", "a:1", Component.REQUESTS, Layer.HTTP)
    late.finish()
    # The span limit: the spans past it are not recorded, and counted. An exit span past it
    # stands in (not recorded) and still propagates, from the recorded span it is under; so
    # does an exit span inside a local span dropped over the limit.
    limits.span_limit = 4
    with new_entry_span("/many", None, Component.FLASK, Layer.HTTP):
        for i in range(6):
            with new_exit_span(f"/call-{i}", "p:1", Component.REQUESTS, Layer.HTTP) as call:
                call.tag("k", "v")
                carrier = decode_sw8(call.inject()["sw8"])
                assert carrier is not None
                INJECTED.append([carrier.trace_id, carrier.segment_id, carrier.span_id, carrier.endpoint,
                                 carrier.address, call.recording, capture() is not None])  # fmt: skip
        with (
            new_local_span("dropped"),
            new_exit_span("/in-dropped", "p:2", Component.REQUESTS, Layer.HTTP) as call,
        ):
            carrier = decode_sw8(call.inject()["sw8"])
            assert carrier is not None
            INJECTED.append([carrier.trace_id, carrier.segment_id, carrier.span_id, carrier.endpoint,
                             carrier.address, call.recording, capture() is not None])  # fmt: skip
    limits.span_limit = 300
    # A span that finishes after its segment was emitted without it (the cross-thread race,
    # made here by taking its open token away): counted as lost, not emitted again.
    with new_entry_span("/race", None, Component.FLASK, Layer.HTTP) as racing:
        straggler = new_exit_span("/straggler", "s:1", Component.REQUESTS, Layer.HTTP)
        racing.segment._open.pop()
    straggler.finish()

    # asyncio: concurrent children of one span in two tasks.
    async def call(name: str) -> None:
        with new_exit_span(name, "a:2", Component.AIOHTTP, Layer.HTTP):
            await asyncio.sleep(0)

    async def request() -> None:
        with new_entry_span("/async", None, Component.FLASK, Layer.HTTP):
            await asyncio.gather(call("/a"), call("/b"))

    asyncio.run(request())


class Normalizer:
    """Replaces ids with their order of first appearance."""

    def __init__(self) -> None:
        self.seen: dict[Any, int] = {}

    def __call__(self, value: Any) -> int:
        return self.seen.setdefault(value, len(self.seen))


def main() -> None:
    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    tracing.configure(load({}))
    tracing.identity.set("svc", "inst")
    tracing.stats.reset()
    scenario()
    ids = Normalizer()
    out = []
    for rtype, payload in sink.records:
        seg = orjson.loads(payload)
        seg[0], seg[1] = ids(seg[0]), ids(seg[1])
        for span in seg[5]:
            # Times: only their order (two runs cross millisecond boundaries differently).
            span[2], span[3] = "start", ("end" if span[3] >= span[2] else "END BEFORE START")
            if span[4] == "/timed":
                span[3] = "end"  # checked below: start + 7
            for log in span[12]:
                log[0] = "at" if span[2] else "?"
                log[1] = [v if not v.startswith("Traceback") else "<stack>" for v in log[1]]
            for ref in span[13]:
                ref[1], ref[2] = ids(ref[1]), ids(ref[2])
        out.append([rtype, seg])
    injected = [[ids(t), ids(sg), *rest] for t, sg, *rest in INJECTED]
    counters = {k: getattr(tracing.stats, k) for k in ("spans_lost", "spans_over_limit", "segments_written")}
    core = Span.__mro__[1].__name__
    segment_core = Segment.__mro__[1].__name__
    doc = {"native": NATIVE, "core": core, "segment_core": segment_core, "records": out, "stats": counters}
    doc["injected"] = injected
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
    sys.exit(0)
