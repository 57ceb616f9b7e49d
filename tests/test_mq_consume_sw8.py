"""A consumed message's entry span made straight from its ``sw8`` parts (consume.c with
carrier.c's ``swmp_sw8_read`` and start.c's ``swmp_entry_sw8``: no ContextCarrier for a
plain header from a known caller) records what the Python forms record: the trace
continued with the same trace id, the same cross-process reference field by field, and the
same decisions for the headers the shortcut declines (not sampled, an unknown caller,
malformed, correlation or extension headers, ignored names, a profiling board), for
RabbitMQ and Kafka alike. The broad shapes of tables and records: test_mq_consume_native.py."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from swmp import _sink, tracing
from swmp.config import load
from swmp.instrument import _mq
from swmp.profiling.gate import gate
from swmp.propagation import decode_sw8
from swmp.tracing import stats
from swmp.tracing.context import new_entry_span, new_exit_span
from swmp.tracing.segment import cross_process_ref
from swmp.tracing.span import NATIVE, current_span, native_core
from tests.native_forms import PLACES, new_caller, producer_sw8, recording, sw8_variants

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")

ROOT = Path(__file__).resolve().parent.parent
PLAIN = producer_sw8()
FLAG, TID, SID, SPAN_ID, TAIL = PLAIN.split("-", 4)


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with recording() as memory:
        yield memory


VARIANTS = sw8_variants(PLAIN)


def _records(sink: _sink.MemorySink) -> list[Any]:
    """Each segment's trace id, service, instance, skip flag and spans without their times
    (the segment id is new each time; a new trace's id too, shown as "new")."""
    out = []
    for _rtype, payload in sink.records:
        seg = orjson.loads(payload)
        trace = seg[0] if seg[0] != seg[1] else "new"
        out.append([trace, *seg[2:5], [[*s[:2], *s[4:12], s[13]] for s in seg[5]]])
    sink.clear()
    return out


def _amqp(form: Any, headers: Any, sink: _sink.MemorySink, place: str) -> Any:
    before = (stats.ignored, stats.sampled_out)
    outcome = _run(lambda: _in_place(lambda: _with(form, ("ex", "q", headers, "mq:5672")), place))
    return outcome, _records(sink), (stats.ignored - before[0], stats.sampled_out - before[1])


def _kafka(form: Any, headers: Any, sink: _sink.MemorySink, place: str) -> Any:
    before = (stats.ignored, stats.sampled_out)
    outcome = _run(lambda: _in_place(lambda: form("orders", "g", headers, "k:9092"), place))
    return outcome, _records(sink), (stats.ignored - before[0], stats.sampled_out - before[1])


def _with(form: Any, args: tuple[Any, ...]) -> Any:
    with form(*args):
        cur = current_span.get()
        return None if cur is None else (cur.op, cur.kind, list(cur.refs))


def _in_place(call: Any, place: str) -> Any:
    if place == "none":
        return call()
    with new_entry_span("/loop"):
        if place == "exit":
            with new_exit_span("outer", "db:1", 1, 1):
                return call()
        return call()


def _run(call: Any) -> Any:
    try:
        result = call()
        after = current_span.get()
        return ("returned", result, None if after is None else after.op)
    except Exception as e:  # pragma: no cover - a failure shows in the comparison
        return ("raised", repr(e))


FORMS: dict[str, tuple[Callable[..., Any], Callable[[str], Any], Any, Any]] = {
    "amqp": (_amqp, lambda v: {"sw8": v}, native_core.amqp_consuming, _mq._py_amqp_consuming),
    "amqp-bytes": (_amqp, lambda v: {"sw8": v.encode()}, native_core.amqp_consuming, _mq._py_amqp_consuming),
    "amqp-more": (_amqp, lambda v: {"sw8": v, "app": 1}, native_core.amqp_consuming, _mq._py_amqp_consuming),
    "kafka": (_kafka, lambda v: [("sw8", v.encode())], native_core.kafka_consumed, _mq._py_kafka_consumed),
}


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("client", FORMS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_header_records_what_the_python_form_records(
    sink: _sink.MemorySink, place: str, client: str, variant: str
) -> None:
    run, table, native, python = FORMS[client]
    value = VARIANTS[variant]
    for _ in range(2):  # the second time the decoder knows what the first taught it
        _mq._warned.clear()
        mine = run(native, table(value), sink, place)
        _mq._warned.clear()
        assert mine == run(python, table(value), sink, place)


@pytest.mark.parametrize("client", FORMS)
def test_the_reference_is_the_callers_field_by_field(sink: _sink.MemorySink, client: str) -> None:
    run, table, native, _python = FORMS[client]
    for value in (PLAIN, VARIANTS["segment id of its own"], VARIANTS["largest span id"]):
        _outcome, records, counts = run(native, table(value), sink, "none")
        carrier = decode_sw8(value)
        assert carrier is not None
        (seg,) = records
        assert seg[0] == carrier.trace_id  # the caller's trace continued
        assert seg[4][0][-1] == [cross_process_ref(carrier)]
        assert counts == (0, 0)


@pytest.mark.parametrize("client", FORMS)
def test_a_caller_never_seen_before(sink: _sink.MemorySink, client: str) -> None:
    """The first message of a new caller goes to decode_sw8 (which checks and caches its
    fields); the next one is made from its parts. Both as the Python form records them."""
    run, table, native, python = FORMS[client]
    tail = new_caller()
    value = "-".join((FLAG, TID, SID, "3", tail))
    first = run(native, table(value), sink, "none")
    again = run(native, table(value), sink, "none")
    assert first == again == run(python, table(value), sink, "none")
    carrier = decode_sw8(value)
    assert carrier is not None and first[1][0][4][0][-1] == [cross_process_ref(carrier)]


@pytest.mark.parametrize("client", FORMS)
def test_not_sampled_ignored_and_profiled_go_the_python_way(sink: _sink.MemorySink, client: str) -> None:
    run, table, native, python = FORMS[client]
    unsampled = table(VARIANTS["not sampled"])
    mine = run(native, unsampled, sink, "none")
    assert mine == run(python, unsampled, sink, "none")
    assert mine[1] == [] and mine[2] == (0, 1)  # counted as sampled out, nothing recorded
    tracing.configure(load({"SW_AGENT_TRACE_IGNORE_PATH": "RabbitMQ/**,Kafka/**"}))
    for _ in range(2):
        mine = run(native, table(PLAIN), sink, "none")
        assert mine == run(python, table(PLAIN), sink, "none")
        assert mine[1] == [] and mine[2] == (1, 0)
    tracing.configure(load({"SW_AGENT_TRACE_IGNORE_PATH": "/health"}))  # rules, not matching
    for _ in range(2):
        mine = run(native, table(PLAIN), sink, "none")
        assert mine == run(python, table(PLAIN), sink, "none")
        assert len(mine[1]) == 1
    seen: list[Any] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gate, "board", object())
        patch.setattr(gate, "first_span", seen.append)
        mine = run(native, table(PLAIN), sink, "none")
        assert mine == run(python, table(PLAIN), sink, "none")
    assert len(seen) == 2  # the profiling board saw each form's first span


def test_no_growth_over_many_messages(sink: _sink.MemorySink) -> None:
    """Each path's references released: the plain header, the declined ones (not sampled,
    ignored), the carrier made of the parts, and Kafka's text."""
    tables = [{"sw8": PLAIN}, {"sw8": VARIANTS["not sampled"]}, {"sw8": VARIANTS["flag 2"]}]
    records = [[("sw8", PLAIN.encode())], [("sw8", VARIANTS["not sampled"].encode())]]

    def round_() -> None:
        for t in tables:
            with native_core.amqp_consuming("ex", "q", t, "mq:5672"):
                pass
        for r in records:
            native_core.kafka_consumed("orders", "g", r, "k:9092")
        sink.records.clear()

    for _ in range(300):
        round_()
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(3000):
        round_()
    gc.collect()
    assert sys.getallocatedblocks() - before < 1000  # a leak per message would be >= 3000


def test_the_first_caller_reference_of_a_process() -> None:
    """In a new process the reference's kind is learnt from the Python cross_process_ref's
    first answer: until then the span is made from a carrier, as before."""
    script = textwrap.dedent(
        """
        import orjson
        from swmp import _sink
        from swmp.instrument import _mq
        from swmp.propagation import decode_sw8
        from swmp.tracing.span import native_core
        from tests.native_forms import producer_sw8, recording

        value = producer_sw8()
        assert decode_sw8(value) is not None  # the caller known: only the kind is not
        out = []
        with recording() as sink:
            for form in (native_core.amqp_consuming, native_core.amqp_consuming, _mq._py_amqp_consuming):
                with form("ex", "q", {"sw8": value}, "mq:5672"):
                    pass
                (payload,) = [p for _t, p in sink.records]
                seg = orjson.loads(payload)
                out.append([seg[0], seg[5][0][:2], seg[5][0][4:12], seg[5][0][13]])
                sink.clear()
        assert out[0] == out[1] == out[2], out
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr
