"""gRPC client exit spans through the traced multicallables (``_grpc_client``), against a real
loopback server: every call form of sync ``grpc`` (``__call__``, ``with_call``, ``future``,
the four kinds, metadata by position or by name, registered methods) and of ``grpc.aio``
gets its span with ``sw8`` in the metadata and the call's status; the application gets
grpc's own channel and behaviour (a request that cannot be serialized raises at the call,
as without the agent); ignored methods get grpc's own multicallable.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import orjson
import pytest

from reporter_proc import records as R
from swmp import _sink
from swmp.instrument._patch import original
from tests.instrumented import instrumented

SERVICE = "c.S"


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with instrumented(plugin_grpc_ignored_methods=("/c.S/Skip",)) as (memory, _):
        yield memory


def exit_spans(sink: _sink.MemorySink, n: int) -> list[list[Any]]:
    """The exit spans recorded, once there are ``n`` (or after 5 s)."""
    out: list[list[Any]] = []
    for _ in range(500):
        out = []
        for kind, payload in sink.records:
            if kind == R.SEGMENT:
                seg = orjson.loads(payload)
                out += [span for span in seg[R.SEG_SPANS] if span[R.SPAN_TYPE] == R.SPAN_TYPE_EXIT]
        if len(out) >= n:
            break
        threading.Event().wait(0.01)
    return out


def tags_of(span: list[Any]) -> dict[str, str]:
    t = span[R.SPAN_TAGS]
    return dict(zip(t[::2], t[1::2], strict=True))


@pytest.fixture()
def server(sink: _sink.MemorySink) -> Iterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    """A sync server on loopback; yields its target and what each call's metadata was."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def record(name: str, ctx: Any) -> None:
        seen.append((name, dict(ctx.invocation_metadata())))

    def echo(req: bytes, ctx: Any) -> bytes:
        record("Echo", ctx)
        return req

    def skip(req: bytes, ctx: Any) -> bytes:
        record("Skip", ctx)
        return req

    def fail(req: bytes, ctx: Any) -> bytes:
        record("Fail", ctx)
        ctx.abort(grpc.StatusCode.NOT_FOUND, "no such user")
        return b""  # not reached

    def listing(req: bytes, ctx: Any) -> Iterator[bytes]:
        record("List", ctx)
        yield req + b"1"
        yield req + b"2"

    def total(reqs: Iterator[bytes], ctx: Any) -> bytes:
        record("Sum", ctx)
        return b"".join(reqs)

    def chat(reqs: Iterator[bytes], ctx: Any) -> Iterator[bytes]:
        record("Chat", ctx)
        yield from reqs

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Skip": grpc.unary_unary_rpc_method_handler(skip),
            "Fail": grpc.unary_unary_rpc_method_handler(fail),
            "List": grpc.unary_stream_rpc_method_handler(listing),
            "Sum": grpc.stream_unary_rpc_method_handler(total),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
        },
    )
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    srv.add_generic_rpc_handlers((handler,))
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield f"127.0.0.1:{port}", seen
    srv.stop(None)


def _unserializable(req: Any) -> bytes:
    raise ValueError("cannot serialize")


def _call_error(target: str, make_channel: Any) -> tuple[str, Any]:
    """What ``unary_stream(...)(request)`` does when the request cannot be serialized."""
    with make_channel(target) as ch:
        try:
            got = ch.unary_stream(f"/{SERVICE}/List", request_serializer=_unserializable)(b"x")
        except grpc.RpcError as e:
            return "raised", e.code()
        return "returned", type(got).__name__


def test_grpc_sync_every_call_form(
    sink: _sink.MemorySink, server: tuple[str, list[tuple[str, dict[str, Any]]]]
) -> None:
    target, seen = server
    m = f"/{SERVICE}/"
    with grpc.insecure_channel(target) as ch:
        # The application's channel is grpc's own, as without the agent.
        assert type(ch) is type(original(grpc, "insecure_channel")(target))
        echo = ch.unary_unary(m + "Echo")
        assert isinstance(echo, grpc.UnaryUnaryMultiCallable)
        assert echo(b"a", None, [("x-app", "1")]) == b"a"  # metadata by position
        response, call = echo.with_call(b"b", metadata=(("x-app", "2"),))
        assert response == b"b" and call.code() == grpc.StatusCode.OK
        assert echo.future(b"c").result() == b"c"
        assert ch.unary_unary(m + "Echo", _registered_method=True)(b"d") == b"d"
        fail = ch.unary_unary(m + "Fail")
        with pytest.raises(grpc.RpcError) as info:
            fail(b"e")
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert fail.future(b"f").exception().code() == grpc.StatusCode.NOT_FOUND
        assert list(ch.unary_stream(m + "List")(b"g")) == [b"g1", b"g2"]
        assert ch.stream_unary(m + "Sum")(iter([b"h", b"i"])) == b"hi"
        assert ch.stream_unary(m + "Sum").with_call(iter([b"j"]))[0] == b"j"
        assert ch.stream_unary(m + "Sum").future(iter([b"k"])).result() == b"k"
        assert list(ch.stream_stream(m + "Chat")(iter([b"l", b"m"]))) == [b"l", b"m"]
        skip = ch.unary_unary(m + "Skip")
        assert type(skip).__module__ == "grpc._channel" and skip(b"n") == b"n"  # ignored: grpc's own
    # A request that cannot be serialized: raised at the call, as without the agent.
    traced = _call_error(target, grpc.insecure_channel)
    assert (
        traced
        == _call_error(target, original(grpc, "insecure_channel"))
        == ("raised", grpc.StatusCode.INTERNAL)
    )

    spans = exit_spans(sink, 12)
    got = sorted((s[R.SPAN_OPERATION].rpartition("/")[2], tags_of(s).get("grpc.status_code")) for s in spans)
    ok, failed = "StatusCode.OK", "StatusCode.NOT_FOUND"
    assert got == sorted(
        [("Echo", ok)] * 4
        + [("Fail", failed)] * 2
        + [("List", ok), ("Chat", ok)]
        + [("Sum", ok)] * 3
        + [("List", "StatusCode.INTERNAL")]  # the unserializable request
    )
    for span in spans:
        assert span[R.SPAN_PEER] == target and span[R.SPAN_COMPONENT] == 23
        assert tags_of(span)["grpc.url"] == target
        assert tags_of(span)["grpc.method"] == span[R.SPAN_OPERATION]
        assert bool(span[R.SPAN_IS_ERROR]) == (tags_of(span)["grpc.status_code"] != ok)
    # Every traced call carried sw8 (the server's entry spans: its own segments).
    assert all("sw8" in md for name, md in seen if name != "Skip")
    assert len(seen) == 12
    assert "sw8" not in dict(seen)["Skip"]
    assert [md["x-app"] for name, md in seen if "x-app" in md] == ["1", "2"]


def test_grpc_aio_every_call_kind(
    sink: _sink.MemorySink, server: tuple[str, list[tuple[str, dict[str, Any]]]]
) -> None:
    target, seen = server
    m = f"/{SERVICE}/"

    async def main() -> list[Any]:
        async with grpc.aio.insecure_channel(target) as ch:
            echo = ch.unary_unary(m + "Echo")
            assert isinstance(echo, grpc.aio.UnaryUnaryMultiCallable)
            out: list[Any] = [await echo(b"a", metadata=grpc.aio.Metadata(("x-app", "3")))]
            call = echo(b"b")  # the call object, used as grpc.aio's own
            assert await call.initial_metadata() is not None
            out.append(await call)
            try:
                await ch.unary_unary(m + "Fail")(b"c")
            except grpc.aio.AioRpcError as e:
                out.append(e.code())
            out.append([x async for x in ch.unary_stream(m + "List")(b"d")])
            out.append(await ch.stream_unary(m + "Sum")(iter([b"e", b"f"])))
            out.append([x async for x in ch.stream_stream(m + "Chat")(iter([b"g"]))])
            return out

    assert asyncio.run(main()) == [b"a", b"b", grpc.StatusCode.NOT_FOUND, [b"d1", b"d2"], b"ef", [b"g"]]
    spans = exit_spans(sink, 6)
    got = sorted((s[R.SPAN_OPERATION].rpartition("/")[2], tags_of(s)["grpc.status_code"]) for s in spans)
    assert got == sorted(
        [("Echo", "StatusCode.OK")] * 2
        + [("Fail", "StatusCode.NOT_FOUND"), ("List", "StatusCode.OK")]
        + [("Sum", "StatusCode.OK"), ("Chat", "StatusCode.OK")]
    )
    assert [s[R.SPAN_IS_ERROR] for s in spans if s[R.SPAN_OPERATION].endswith("Fail")] == [True]
    assert len(seen) == 6 and all("sw8" in md for _name, md in seen)
    assert seen[0][1]["x-app"] == "3"


def test_a_forwarded_sw8_is_replaced_not_sent_twice(sink: _sink.MemorySink) -> None:
    """A service passing its incoming metadata on (``context.invocation_metadata()``, a
    gRPC proxy) sends one ``sw8``, the exit span's, with the rest of its metadata as given:
    sync (metadata by name and by position) and ``grpc.aio``."""
    lines: list[list[tuple[str, str]]] = []

    def echo(req: bytes, ctx: Any) -> bytes:
        lines.append([(k, v) for k, v in ctx.invocation_metadata() if not k.startswith("grpc-")])
        return req

    methods = {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    handler = grpc.method_handlers_generic_handler(SERVICE, methods)
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    srv.add_generic_rpc_handlers((handler,))
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    target = f"127.0.0.1:{port}"
    forwarded = (("x-app", "1"), ("sw8", "1-forwarded"), ("sw8-correlation", "a:b"))
    try:
        with grpc.insecure_channel(target) as ch:
            echo_call = ch.unary_unary(f"/{SERVICE}/Echo")
            assert echo_call(b"a", metadata=forwarded) == b"a"
            assert echo_call(b"b", 10, list(forwarded)) == b"b"

        async def main() -> bytes:
            async with grpc.aio.insecure_channel(target) as ach:
                return await ach.unary_unary(f"/{SERVICE}/Echo")(b"c", metadata=grpc.aio.Metadata(*forwarded))

        assert asyncio.run(main()) == b"c"
    finally:
        srv.stop(None)
    spans = exit_spans(sink, 3)
    assert len(spans) == 3 and len(lines) == 3
    for got in lines:
        sw8 = [v for k, v in got if k == "sw8"]
        assert len(sw8) == 1 and sw8[0] != "1-forwarded", got
        assert ("x-app", "1") in got
        assert ("sw8-correlation", "a:b") in got  # not one the span sends: passed on as given
