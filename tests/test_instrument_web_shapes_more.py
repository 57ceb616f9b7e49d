"""Entry spans of request shapes off the common path in the servers that are not WSGI/ASGI
(gRPC, aiohttp, Tornado, Sanic) and the frameworks on top of WSGI (Falcon, Pyramid,
Bottle): a request the client abandons, a response that fails half-way, what the
application sees of the wrapped methods. Real servers in process, on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pytest

from reporter_proc import records as R
from swmp import _sink
from swmp.tracing import Kind
from tests.instrumented import instrumented


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with instrumented() as (memory, _):
        yield memory


def entries(sink: _sink.MemorySink) -> list[list[Any]]:
    return [
        span
        for kind, payload in sink.records
        if kind == R.SEGMENT
        for span in orjson.loads(payload)[R.SEG_SPANS]
        if span[R.SPAN_TYPE] == Kind.ENTRY
    ]


def tags_of(span: list[Any]) -> dict[str, str]:
    t = span[R.SPAN_TAGS]
    return dict(zip(t[::2], t[1::2], strict=True))


# -- gRPC (grpc.aio server) ------------------------------------------------------------------
@pytest.mark.parametrize("interceptor", [False, True])
def test_grpc_aio_rpc_the_client_abandons_ends_cancelled(sink: _sink.MemorySink, interceptor: bool) -> None:
    """grpc.aio cancels the task of an RPC the client cancelled or whose deadline passed:
    the entry span ends as ``StatusCode.CANCELLED``, as the sync server's does (and the
    docs say), not ``UNKNOWN`` with the CancelledError's stack as if the application had
    failed. An async-generator stream, a stream written with ``context.write()`` and a
    unary coroutine; with and without an interceptor of the application's (ours goes first
    then). The application sees the cancellation as without the agent."""
    import grpc

    stopped: list[str] = []

    async def endless(req: bytes, ctx: Any) -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"x"
                await asyncio.sleep(0.005)
        except asyncio.CancelledError:
            stopped.append("Endless")
            raise

    async def written(req: bytes, ctx: Any) -> None:
        try:
            while True:
                await ctx.write(b"x")
                await asyncio.sleep(0.005)
        except asyncio.CancelledError:
            stopped.append("Written")
            raise

    async def slow(req: bytes, ctx: Any) -> bytes:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.append("Slow")
            raise
        return b""

    class Passing(grpc.aio.ServerInterceptor):  # type: ignore[misc]
        async def intercept_service(self, continuation: Any, details: Any) -> Any:
            return await continuation(details)

    async def main() -> list[Any]:
        handler = grpc.method_handlers_generic_handler(
            "t.S",
            {
                "Endless": grpc.unary_stream_rpc_method_handler(endless),
                "Written": grpc.unary_stream_rpc_method_handler(written),
                "Slow": grpc.unary_unary_rpc_method_handler(slow),
            },
        )
        server = grpc.aio.server(interceptors=[Passing()] if interceptor else None)
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        codes = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                for name in ("Endless", "Written"):
                    call = ch.unary_stream(f"/t.S/{name}")(b"")
                    async for _ in call:
                        break
                    call.cancel()
                    codes.append(await call.code())
                    while name not in stopped:  # the server's side of the cancel is async
                        await asyncio.sleep(0.005)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await ch.unary_unary("/t.S/Slow")(b"", timeout=0.3)
                codes.append(err.value.code())
                while "Slow" not in stopped:
                    await asyncio.sleep(0.005)
        finally:
            await server.stop(None)
        return codes

    codes = asyncio.run(main())
    assert codes == [grpc.StatusCode.CANCELLED, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED]
    assert stopped == ["Endless", "Written", "Slow"]
    got = {s[R.SPAN_OPERATION]: s for s in entries(sink)}
    assert sorted(got) == ["/t.S/Endless", "/t.S/Slow", "/t.S/Written"]
    for span in got.values():
        assert tags_of(span)["grpc.status_code"] == "StatusCode.CANCELLED"
        assert span[R.SPAN_IS_ERROR] is True
        assert "CancelledError" not in orjson.dumps(span[R.SPAN_LOGS]).decode()


def test_grpc_sync_unary_the_client_abandons_ends_cancelled(sink: _sink.MemorySink) -> None:
    """A sync server's unary behaviour that returns after its deadline passed (or the
    client cancelled): gRPC drops the response, the client gets DEADLINE_EXCEEDED; the
    entry span ends CANCELLED (failed), as a stream's does, not OK. Unary and
    client-streaming responses; an RPC answered in time stays OK."""
    import threading
    from concurrent import futures

    import grpc
    from grpc import _server

    assert _server._CANCELLED == "cancelled"  # the grpc state _grpc_server._abandoned reads

    def wait_out(ctx: Any) -> bytes:
        while ctx.is_active():
            threading.Event().wait(0.005)
        return b"late"

    def unary(req: bytes, ctx: Any) -> bytes:
        return req if req else wait_out(ctx)

    def upload(reqs: Iterator[bytes], ctx: Any) -> bytes:
        list(reqs)
        return wait_out(ctx)

    handler = grpc.method_handlers_generic_handler(
        "t.S",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Upload": grpc.stream_unary_rpc_method_handler(upload),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    codes = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            assert ch.unary_unary("/t.S/Unary")(b"now") == b"now"
            calls: list[tuple[Any, Any]] = [
                (ch.unary_unary("/t.S/Unary"), b""),
                (ch.stream_unary("/t.S/Upload"), iter([b"a"])),
            ]
            for call, arg in calls:
                with pytest.raises(grpc.RpcError) as err:
                    call(arg, timeout=0.3)
                codes.append(err.value.code())
        # The behaviours end (and their spans with them) once they see the RPC inactive.
        for _ in range(3000):
            if len(entries(sink)) >= 3:
                break
            threading.Event().wait(0.01)
    finally:
        server.stop(None).wait(30)
    assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED] * 2
    got = [(s[R.SPAN_OPERATION], tags_of(s)["grpc.status_code"], s[R.SPAN_IS_ERROR]) for s in entries(sink)]
    assert sorted(got) == [
        ("/t.S/Unary", "StatusCode.CANCELLED", True),
        ("/t.S/Unary", "StatusCode.OK", False),
        ("/t.S/Upload", "StatusCode.CANCELLED", True),
    ]


@pytest.mark.parametrize("kind", ["stream_stream", "stream_unary"])
def test_grpc_sync_stream_over_before_its_behaviour_runs_is_reported(
    sink: _sink.MemorySink, kind: str
) -> None:
    """A request-streaming RPC whose deadline passes while it waits for a thread of the
    pool: gRPC still calls its behaviour (with the request stream). Bidirectional: gRPC
    takes one response and stops, and refuses the termination callback (it ran already);
    the entry span ends then, as CANCELLED (before, it was left open: never reported).
    Client-streaming: the request stream raises; the span ends CANCELLED (not UNKNOWN, an
    error the client never got) with that exception logged. The behaviour runs as
    without the agent; the next RPC on that thread gets a span of its own."""
    import threading
    from concurrent import futures

    import grpc

    blocking, release, chatted = threading.Event(), threading.Event(), threading.Event()

    def block(req: bytes, ctx: Any) -> bytes:
        blocking.set()
        release.wait(30)
        return b"b"

    def chat(reqs: Iterator[bytes], ctx: Any) -> Iterator[bytes]:
        chatted.set()
        yield b"hello"
        yield from reqs

    def upload(reqs: Iterator[bytes], ctx: Any) -> bytes:
        chatted.set()
        return b"+".join(reqs)

    handler = grpc.method_handlers_generic_handler(
        "t.S",
        {
            "Block": grpc.unary_unary_rpc_method_handler(block),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
            "Upload": grpc.stream_unary_rpc_method_handler(upload),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            first = ch.unary_unary("/t.S/Block").future(b"")
            assert blocking.wait(30)  # the pool's only thread is taken
            with pytest.raises(grpc.RpcError) as err:
                if kind == "stream_stream":
                    list(ch.stream_stream("/t.S/Chat")(iter([b"a"]), timeout=0.3))
                else:
                    ch.stream_unary("/t.S/Upload")(iter([b"a"]), timeout=0.3)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            release.set()
            assert first.result(timeout=30) == b"b"
            assert chatted.wait(30)
            assert ch.unary_unary("/t.S/Block")(b"", timeout=30) == b"b"
        for _ in range(3000):  # the Chat span ends in the pool's thread
            if len(entries(sink)) >= 3:
                break
            threading.Event().wait(0.01)
    finally:
        release.set()
        server.stop(None).wait(30)
    got = {s[R.SPAN_OPERATION]: s for s in entries(sink)}
    chat_span = got["/t.S/Chat" if kind == "stream_stream" else "/t.S/Upload"]
    assert tags_of(chat_span)["grpc.status_code"] == "StatusCode.CANCELLED"
    assert chat_span[R.SPAN_IS_ERROR] is True
    blocks = [s for s in entries(sink) if s[R.SPAN_OPERATION] == "/t.S/Block"]
    assert len(blocks) == 2 and all(s[R.SPAN_PARENT_ID] == -1 for s in blocks)


def test_grpc_aio_plain_streaming_behaviour_in_the_migration_pool_ends_ok(sink: _sink.MemorySink) -> None:
    """grpc.aio runs a plain (threaded) behaviour in its ``migration_thread_pool``, with a
    context whose ``add_callback`` returns None: a stream that ends normally ends its span
    OK (None is no refusal of the termination callback), a unary one too."""
    from concurrent import futures

    import grpc

    def echo(req: bytes, ctx: Any) -> bytes:
        return req

    def gen(req: bytes, ctx: Any) -> Iterator[bytes]:
        yield b"a"
        yield b"b"

    async def main() -> list[Any]:
        handler = grpc.method_handlers_generic_handler(
            "t.S",
            {
                "Echo": grpc.unary_unary_rpc_method_handler(echo),
                "Gen": grpc.unary_stream_rpc_method_handler(gen),
            },
        )
        pool = futures.ThreadPoolExecutor(max_workers=2)
        server = grpc.aio.server(migration_thread_pool=pool)
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                return [
                    await ch.unary_unary("/t.S/Echo")(b"x"),
                    [item async for item in ch.unary_stream("/t.S/Gen")(b"")],
                ]
        finally:
            await server.stop(None)
            pool.shutdown(wait=True)  # the behaviours (and their spans) are over

    assert asyncio.run(main()) == [b"x", [b"a", b"b"]]
    got = sorted(
        (s[R.SPAN_OPERATION], tags_of(s)["grpc.status_code"], s[R.SPAN_IS_ERROR]) for s in entries(sink)
    )
    assert got == [("/t.S/Echo", "StatusCode.OK", False), ("/t.S/Gen", "StatusCode.OK", False)]
