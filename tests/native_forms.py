"""What the tests comparing a native fast path with its Python reference share: the recorded
segments without what differs from run to run, and one call made inside a trace, inside an
exit span (where nothing is recorded) or outside any trace, with everything it left behind;
and the incoming ``sw8`` values the entries read from their parts are compared over."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import orjson

from swmp import _sink, tracing
from swmp.config import load
from swmp.instrument import _datastore as ds
from swmp.propagation import b64
from swmp.tracing.context import new_entry_span, new_exit_span
from swmp.tracing.limits import limits
from swmp.tracing.span import current_span

PLACES = ("entry", "exit", "none")


class Text(str):
    """A str subclass: the native forms leave it to their Python forms."""


@contextlib.contextmanager
def recording() -> Iterator[_sink.MemorySink]:
    """A memory sink and the default tracing settings; the tag limit and the datastore
    settings (which tests lower) and both put back afterwards."""
    memory = _sink.MemorySink()
    _sink.set_sink(memory)
    tracing.configure(load({}))
    saved = limits.tag_value_max, ds.settings.params_max, ds.settings.collect_keys
    try:
        yield memory
    finally:
        limits.tag_value_max, ds.settings.params_max, ds.settings.collect_keys = saved
        tracing.configure(load({}))
        _sink.set_sink(None)


def segments(records: list[tuple[int, bytes]]) -> list[Any]:
    """The records without what differs from run to run: ids of new traces, times, stacks."""
    out = []
    for _rtype, payload in records:
        seg = orjson.loads(payload)
        spans = []
        for span in seg[5]:
            # Each log as [its fields], the stack's text left out.
            logs = [
                [
                    [v if i % 2 == 0 or kv[i - 1] != "stack" else "-" for i, v in enumerate(kv)]
                    for kv in (log[1],)
                ]
                for log in span[12]
            ]
            spans.append([*span[:2], *span[4:12], logs, span[13]])
        out.append([*seg[2:5], spans])
    return out


def call_in(  # noqa: PLR0917
    fn: Callable[..., Any],
    obj: Any,
    args: tuple[Any, ...],
    kw: dict[str, Any],
    sink: _sink.MemorySink,
    inside: str,
) -> Any:
    """``fn(obj, *args, **kw)`` made ``inside`` one of :data:`PLACES`: (what it returned or
    raised, the calls ``obj.calls`` gained, the segments recorded). The context is checked
    to be given back to the request's span."""
    before = len(obj.calls)
    try:
        if inside == "none":
            outcome: Any = ("returned", fn(obj, *args, **kw))
        else:
            with new_entry_span("/request"):
                if inside == "exit":
                    with new_exit_span("outer", "db:1", 1, 1):
                        outcome = ("returned", fn(obj, *args, **kw))
                else:
                    outcome = ("returned", fn(obj, *args, **kw))
                after = current_span.get()
                assert after is not None and after.op == "/request"
    except (Exception, KeyboardInterrupt) as e:
        outcome = ("raised", type(e).__name__, str(e), e.__traceback__ is not None)
    records = segments(sink.records)
    sink.clear()
    return outcome, obj.calls[before:], records


async def in_place(inside: str, work: Callable[[], Awaitable[Any]]) -> Any:
    """``work()`` awaited inside an entry span, inside an exit span, or outside any; the
    context checked to be the request's again afterwards."""
    if inside == "none":
        return await work()
    with new_entry_span("/request"):
        if inside == "exit":
            with new_exit_span("outer", "db:1", 1, 1):
                result = await work()
        else:
            result = await work()
        after = current_span.get()
        assert after is not None and after.op == "/request"
    return result


def acall_in(  # noqa: PLR0917
    fn: Any, obj: Any, args: tuple[Any, ...], kw: dict[str, Any], sink: _sink.MemorySink, inside: str
) -> Any:
    """:func:`call_in` for an async ``fn``: what ``await fn(obj, *args, **kw)`` gave in
    ``inside`` (run by ``asyncio.run``), the calls ``obj.calls`` gained, the segments."""
    before = len(obj.calls)

    async def work() -> Any:
        return await fn(obj, *args, **kw)

    try:
        outcome: Any = ("returned", asyncio.run(in_place(inside, work)))
    except (Exception, KeyboardInterrupt) as e:
        outcome = ("raised", type(e).__name__, str(e), e.__traceback__ is not None)
    records = segments(sink.records)
    sink.clear()
    return outcome, obj.calls[before:], records


def compare_forms(  # noqa: PLR0917
    native: Any,
    python: Any,
    make: Callable[[], Any],
    calls: Any,
    sink: _sink.MemorySink,
    run: Callable[..., Any] = call_in,
) -> None:
    """Each ``(args, kwargs)`` of ``calls`` made in each of :data:`PLACES` through both
    forms, each on a fresh object from ``make`` and twice (the first call makes the memos,
    the second uses them): ``run(fn, obj, args, kwargs, sink, place)`` (:func:`call_in` or
    an async runner) gives the same for both."""
    for (args, kw), inside in itertools.product(calls, PLACES):
        results = []
        for fn in (native, python):
            obj = make()
            results.append((run(fn, obj, args, kw, sink, inside), run(fn, obj, args, kw, sink, inside)))
        assert results[0] == results[1], (args, kw, inside)


def consume_in(form: Any, args: tuple[Any, ...], outcome: str, sink: _sink.MemorySink, place: str) -> Any:
    """A consumer callback run inside ``with form(*args)`` made in ``place`` (one of
    :data:`PLACES`): what the callback saw,
    what came out, the context afterwards and the segments recorded."""
    seen: list[Any] = []

    def callback() -> Any:
        cur = current_span.get()
        seen.append(None if cur is None else (cur.op, cur.kind, list(cur.tags)))
        if outcome == "error":
            raise ValueError("callback failed")
        if outcome == "interrupt":
            raise KeyboardInterrupt
        return "done"

    def consume() -> Any:
        with form(*args):
            return callback()

    try:
        if place == "none":
            result: Any = ("returned", consume())
            after = current_span.get()
        else:
            with new_entry_span("/loop"):
                if place == "exit":
                    with new_exit_span("outer", "db:1", 1, 1):
                        result = ("returned", consume())
                        after = current_span.get()
                else:
                    result = ("returned", consume())
                    after = current_span.get()
    except (Exception, KeyboardInterrupt) as e:
        result = ("raised", type(e).__name__, str(e))
        after = current_span.get()
    records = segments(sink.records)
    sink.clear()
    return seen, result, None if after is None else after.op, records


def producer_sw8() -> str:
    """A RabbitMQ producer's ``sw8`` value, made with a sink of its own (once per test module:
    its caller fields are then known to the decoder)."""
    memory = _sink.MemorySink()
    _sink.set_sink(memory)
    with new_entry_span("/publish"), new_exit_span("RabbitMQ/x/Producer", "mq:5672", 52, 4) as span:
        value = span.inject()["sw8"]
    _sink.set_sink(None)
    return str(value)


def new_caller() -> str:
    """The four caller fields of a caller never seen before (not in the decoder's cache)."""
    name = uuid.uuid4().hex
    return "-".join((b64(f"svc-{name}"), b64(f"inst-{name}"), b64(f"/ep-{name}"), b64(f"h-{name}:1")))


def sw8_variants(plain: str) -> dict[str, str]:
    """``plain`` (a valid sw8 value of a known caller) and values near it: each field changed
    to the edge of what the decoders take and just past it (the consumers' and the web
    entries' reads from the parts, carrier.c's swmp_sw8_read, against decode_sw8)."""
    flag, tid, sid, span_id, tail = plain.split("-", 4)
    other = b64("another-segment.7")
    return {
        "plain": plain,
        "segment id of its own": "-".join((flag, tid, other, span_id, tail)),
        "not sampled": "-".join(("0", tid, sid, span_id, tail)),
        "span id 0": "-".join((flag, tid, sid, "0", tail)),
        "largest span id": "-".join((flag, tid, sid, "2147483647", tail)),
        "span id too large": "-".join((flag, tid, sid, "2147483648", tail)),
        "span id of 11 digits": "-".join((flag, tid, sid, "00000000001", tail)),
        "span id not digits": "-".join((flag, tid, sid, "1a", tail)),
        "flag 2": "-".join(("2", tid, sid, span_id, tail)),
        "unpadded trace id": "-".join((flag, tid.rstrip("="), sid, span_id, tail)),
        "trace id not base64": "-".join((flag, "!" + tid[1:], sid, span_id, tail)),
        "empty segment id": "-".join((flag, tid, "", span_id, tail)),
        "a field missing": "-".join((flag, tid, sid, span_id)),
        "an empty caller field": "-".join((flag, tid, sid, span_id, "-".join(["", *tail.split("-")[1:]]))),
        "surrounding space": " " + plain,
        "not ASCII": plain + "\u00e9",
    }
