"""The native ``KafkaSend`` (swmp/_native/kafka_send.c) runs aiokafka's ``AIOKafkaProducer.send``
as the Python wrapper of swmp/instrument/aiokafka.py does: the same call reaches the producer
(the headers with the trace's ``sw8``, in the span), the same result or exception reaches the
caller, the same segments are recorded. Each case runs through the wrapper the
instrumentation installs (native) and the one it installs without the native core (Python),
on a producer shaped like aiokafka's that records what it is given. The real client against
a real Kafka: test_instrument_mq.py."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from swmp import _sink
from swmp.instrument import aiokafka as instr
from swmp.tracing.context import new_entry_span, new_exit_span
from swmp.tracing.limits import limits
from swmp.tracing.span import NATIVE, current_span, native_core
from tests.native_forms import acall_in, compare_forms, recording, segments

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with recording() as memory:
        yield memory


class Producer:
    """aiokafka's shape: ``send(topic, value=None, key=None, partition=None,
    timestamp_ms=None, headers=None)`` and the client's ``_bootstrap_servers``. ``value``
    ``b"FAIL"`` fails after a wait, ``b"HANG"`` waits until cancelled."""

    servers: Any = "k1:9092"

    def __init__(self) -> None:
        self.client = SimpleNamespace(_bootstrap_servers=self.servers)
        self.calls: list[Any] = []

    async def send(  # noqa: PLR0917 (aiokafka's signature)
        self,
        topic: Any,
        value: Any = None,
        key: Any = None,
        partition: Any = None,
        timestamp_ms: Any = None,
        headers: Any = None,
    ) -> Any:
        span = current_span.get()
        sw8 = None
        kept = headers
        if isinstance(headers, list):
            # sw8's value differs from run to run: how many there are and whether the caller's
            # old one is still among them are compared.
            sw8 = [v for k, v in headers if k == "sw8"]
            sw8 = (len(sw8), b"old" in sw8)
            kept = [h for h in headers if h[0] != "sw8"]
        self.calls.append((topic, value, key, partition, timestamp_ms, kept, sw8, span and span.op))
        await asyncio.sleep(0)
        if value == b"FAIL":
            raise ConnectionError("broker gone")
        if value == b"HANG":
            await asyncio.Event().wait()
        return "record-future"


class Internal(Producer):
    """One of the agent's own producers (reporter_proc's Kafka sender)."""

    def __init__(self) -> None:
        super().__init__()
        self._swmp_internal = True


def _forms(orig: Any = Producer.send) -> tuple[Any, Any]:
    native = instr.traced_send(orig)
    saved, instr._KafkaSend = instr._KafkaSend, None
    try:
        python = instr.traced_send(orig)
    finally:
        instr._KafkaSend = saved
    return native, python


def _with_servers(servers: Any) -> type[Producer]:
    return type("P", (Producer,), {"servers": servers})


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("t",), {}),
    (("t", b"v"), {"key": b"k"}),
    (("t", b"v", b"k", 0, 123, [("a", b"1")]), {}),  # every argument by position
    (("t", b"v", b"k", 0, 123, None), {}),
    (("t",), {"headers": [("a", b"1"), ("sw8", b"old")]}),  # the old sw8 replaced
    ((), {"topic": "t", "value": b"v", "headers": None}),
    ((), {"headers": [], "partition": 1, "topic": "t"}),
    (("t",), {"headers": [["a", b"1"]]}),  # not tuples: the Python merge
    (("t",), {"headers": (("a", b"1"),)}),  # not a list: the same
    (("t", b"FAIL"), {}),
    ((5,), {}),  # not a str: the Python steps of kafka_send_span
    (("t" * 3000,), {}),  # over the tag limit: the same
    # Calls the signature refuses, in both forms when they are made.
    (("t",), {"bogus": 1}),
    (("t", b"v"), {"value": b"w"}),
    ((), {}),
    ((), {"value": b"v"}),
    (("t", 1, 2, 3, 4, 5, 6), {}),
]


@pytest.mark.parametrize("tag_limit", [2048, 4])
def test_native_send_matches_the_python_form(sink: _sink.MemorySink, tag_limit: int) -> None:
    limits.tag_value_max = tag_limit
    native, python = _forms()
    compare_forms(native, python, Producer, CALLS, sink, acall_in)


class Servers(list[str]):
    """A list subclass: joined by the generic steps."""


@pytest.mark.parametrize(
    "servers",
    [
        "k1:9092",
        "",
        None,
        ["k1:9092", "k2:9092"],
        ("k1:9092", "k2:9092"),
        [],
        Servers(["k1:9092", "k3:9092"]),
        ["k1:9092", 5],  # str.join refuses it: str() of the list
        42,  # not iterable: str()
    ],
    ids=repr,
)
def test_the_brokers_are_those_of_the_python_form(sink: _sink.MemorySink, servers: Any) -> None:
    native, python = _forms()
    calls = [(("t",), {}), (("t",), {"headers": [("a", b"1")]})]
    compare_forms(native, python, _with_servers(servers), calls, sink, acall_in)


def test_a_client_without_bootstrap_servers_or_without_client(sink: _sink.MemorySink) -> None:
    native, python = _forms()

    class NoServers(Producer):
        def __init__(self) -> None:
            super().__init__()
            self.client = SimpleNamespace()

    class NoClient(Producer):
        def __init__(self) -> None:
            super().__init__()
            del self.client

    compare_forms(native, python, NoServers, [(("t",), {})], sink, acall_in)
    compare_forms(native, python, NoClient, [(("t",), {})], sink, acall_in)


def test_the_brokers_follow_a_list_that_changes(sink: _sink.MemorySink) -> None:
    """A client's list of servers changed in place (or replaced) gives the next send's span
    the new join."""
    native, _ = _forms()
    producer = Producer()
    servers = ["k1:9092", "k2:9092"]
    producer.client._bootstrap_servers = servers

    async def main() -> None:
        with new_entry_span("/r"):
            await native(producer, "t")
            await native(producer, "t")
            servers.append("k3:9092")
            await native(producer, "t")
            servers[0] = "k0:9092"
            await native(producer, "t")
            producer.client._bootstrap_servers = ("a:1", "b:2")
            await native(producer, "t")
            producer.client._bootstrap_servers = "c:3"
            await native(producer, "t")

    asyncio.run(main())
    (segment,) = segments(sink.records)
    assert [s[3] for s in segment[3][:-1]] == [
        "k1:9092;k2:9092",
        "k1:9092;k2:9092",
        "k1:9092;k2:9092;k3:9092",
        "k0:9092;k2:9092;k3:9092",
        "a:1;b:2",
        "c:3",
    ]


def test_internal_producers_are_sent_untouched(sink: _sink.MemorySink) -> None:
    native, python = _forms()
    compare_forms(native, python, Internal, CALLS[:6], sink, acall_in)
    producer = Internal()

    async def main() -> Any:
        with new_entry_span("/r"):
            return await native(producer, "t", headers=[("a", b"1")])

    assert asyncio.run(main()) == "record-future"
    assert producer.calls == [("t", None, None, None, None, [("a", b"1")], (0, False), "/r")]
    (segment,) = segments(sink.records)
    assert [s[2] for s in segment[3]] == ["/r"]


def _both(run: Any) -> tuple[Any, Any]:
    """``run(form)`` for the native and the Python form, each with its segments."""
    out = []
    for form in _forms():
        with recording() as memory:
            out.append((run(form), segments(memory.records)))
    return out[0], out[1]


def test_a_send_cancelled_while_waiting() -> None:
    def run(send: Any) -> Any:
        producer = Producer()

        async def main() -> Any:
            with new_entry_span("/cancel"):
                task = asyncio.get_running_loop().create_task(send(producer, "t", b"HANG"))
                while not producer.calls:
                    await asyncio.sleep(0)  # the send runs up to its wait
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    outcome = "cancelled"
                after = current_span.get()
                return outcome, after and after.op

        return asyncio.run(main()), producer.calls

    native, python = _both(run)
    assert native == python
    (_outcome, calls), (segment,) = native
    assert calls[0][-1] == "Kafka/t/Producer"
    # Cancelled, not failed: no error flag, the cancellation logged (tests/test_cancelled_not_error.py).
    assert segment[3][0][2] == "Kafka/t/Producer" and segment[3][0][7] is False  # is_error
    assert [dict(zip(f[::2], f[1::2], strict=True))["event"] for (f,) in segment[3][0][10]] == ["interrupted"]


def test_a_send_never_awaited_makes_no_span() -> None:
    """A call never awaited runs none of its steps: no span, the request's segment not held
    open by one (for the Python form too: its coroutine never starts)."""

    def run(send: Any) -> Any:
        producer = Producer()

        async def main() -> Any:
            with new_entry_span("/never"):
                call = send(producer, "t", b"v")
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # "never awaited"
                    del call
                    gc.collect()

        asyncio.run(main())
        return producer.calls

    native, python = _both(run)
    assert native == python
    calls, (segment,) = native
    assert calls == [] and [s[2] for s in segment[3]] == ["/never"]


def test_throw_before_the_first_send_and_a_first_send_not_none() -> None:
    def run(send: Any) -> Any:
        producer = Producer()
        seen = []
        with new_entry_span("/throw"):
            call = send(producer, "t")
            with pytest.raises(ValueError, match="thrown"):
                call.throw(ValueError("thrown"))
            with pytest.raises(RuntimeError):  # over, as a coroutine after it
                call.send(None)
            seen.append(current_span.get().op)  # type: ignore[union-attr]
            call = send(producer, "t")
            with pytest.raises(TypeError, match="non-None"):
                call.send(1)
            call.close()
        return seen, producer.calls

    native, python = _both(run)
    assert native == python
    (seen, calls), (segment,) = native
    assert seen == ["/throw"] and calls == [] and [s[2] for s in segment[3]] == ["/throw"]


def test_inside_an_exit_span_and_outside_a_trace_the_send_is_the_producers() -> None:
    native, _ = _forms()
    producer = Producer()
    outside = native(producer, "t")
    assert asyncio.iscoroutine(outside) and outside.cr_code is Producer.send.__code__  # the gate
    outside.close()

    async def main() -> Any:
        with new_entry_span("/r"), new_exit_span("db", "db:1", 1, 1):
            return await native(producer, "t", headers=[("a", b"1")])

    with recording() as memory:
        assert asyncio.run(main()) == "record-future"
        (segment,) = segments(memory.records)
    assert producer.calls == [("t", None, None, None, None, [("a", b"1")], (0, False), "db")]
    assert [s[2] for s in segment[3]] == ["db", "/r"]


def test_the_native_send_is_lazy_and_taken_by_create_task(sink: _sink.MemorySink) -> None:
    native, _ = _forms()
    producer = Producer()

    async def main() -> Any:
        with new_entry_span("/request"):
            call = native(producer, "orders", b"m")
            assert type(call).__name__ == "Within" and asyncio.iscoroutine(call)
            assert producer.calls == []  # nothing sent before it is awaited
            task = asyncio.get_running_loop().create_task(native(producer, "orders", value=b"n"))
            return await call, await task

    assert asyncio.run(main()) == ("record-future", "record-future")
    op = "Kafka/orders/Producer"
    assert producer.calls == [
        ("orders", b"m", None, None, None, [], (1, False), op),
        ("orders", b"n", None, None, None, [], (1, False), op),
    ]
    (segment,) = segments(sink.records)
    assert [s[2] for s in segment[3]] == [op, op, "/request"]


def test_the_instrumentation_installs_the_native_send() -> None:
    """With the native core the installed send is KafkaSend behind the gate: inside a trace
    aiokafka's ``send`` returns the lazy awaitable, not a coroutine of the agent's."""
    from aiokafka import AIOKafkaProducer

    from tests.instrumented import instrumented

    assert instr._KafkaSend is native_core.KafkaSend
    with instrumented() as (_memory, status):
        assert status["aiokafka"] == "installed"
        producer = Producer()
        with new_entry_span("/r"):
            call = AIOKafkaProducer.send(producer, "t")  # type: ignore[arg-type]
            assert type(call).__name__ == "Within"
            call.close()


def test_no_live_objects_are_left_behind(sink: _sink.MemorySink) -> None:
    """Many sends of every kind, through the native form: the number of live objects does
    not grow with them."""
    native, _ = _forms()
    producer = _with_servers(["k1:9092", "k2:9092"])()

    async def round_() -> None:
        with new_entry_span("/leak"):
            await native(producer, "t", b"v", headers=[("a", b"1"), ("sw8", b"old")])
            await native(producer, topic="t", value=b"v")
            try:
                await native(producer, "t", b"FAIL")
            except ConnectionError:
                pass
            native(producer, "t").close()
            task = asyncio.get_running_loop().create_task(native(producer, "t", b"HANG"))
            await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        producer.calls.clear()
        sink.clear()

    async def rounds(n: int) -> None:
        for _ in range(n):
            await round_()

    asyncio.run(rounds(200))
    gc.collect()
    before = len(gc.get_objects())
    asyncio.run(rounds(2000))
    gc.collect()
    assert len(gc.get_objects()) - before < 100


def test_constructor_refuses_wrong_arguments() -> None:
    f = Producer.send
    with pytest.raises(TypeError):
        native_core.KafkaSend(f, f)
    with pytest.raises(TypeError):
        native_core.KafkaSend(f, 1, "_swmp_internal")
    with pytest.raises(TypeError):
        native_core.KafkaSend(f, f, 5)
