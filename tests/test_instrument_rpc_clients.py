"""gRPC, aiohttp-client and websockets-client instrumentation in process (real servers on
loopback, segments in a memory sink): the wrapped libraries behave exactly as without the
agent (results, errors, cancelled streams, the caller's metadata and headers), ignored gRPC
methods, and the reporter's thread never traced.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from typing import Any

import grpc
import orjson
import pytest

from reporter_proc import records as R
from swmp import _sink
from swmp.instrument._incoming import REPORTER_THREAD_NAME
from swmp.instrument.grpcio import IgnoredMethods
from swmp.tracing.context import new_entry_span
from tests.instrumented import instrumented


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with instrumented(plugin_grpc_ignored_methods=("/t.S/Skip",)) as (memory, _):
        import aiohttp  # noqa: F401  (imported now: their deferred instrumentation is installed)
        import websockets.asyncio.client  # noqa: F401

        yield memory


def spans(sink: _sink.MemorySink) -> list[list[Any]]:
    out = []
    for kind, payload in sink.records:
        if kind == R.SEGMENT:
            seg = orjson.loads(payload)
            out += [[*span, seg] for span in seg[R.SEG_SPANS]]
    return out


def tags_of(span: list[Any]) -> dict[str, str]:
    t = span[R.SPAN_TAGS]
    return dict(zip(t[::2], t[1::2], strict=True))


def wait_spans(sink: _sink.MemorySink, n: int) -> list[list[Any]]:
    for _ in range(500):
        got = spans(sink)
        if len(got) >= n:
            return got
        threading.Event().wait(0.01)
    return spans(sink)


# -- gRPC ------------------------------------------------------------------------------------
class Seen:
    """What the server handlers saw."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, Any]] = []
        self.stream_stopped = threading.Event()


@pytest.fixture()
def grpc_server(sink: _sink.MemorySink) -> Iterator[tuple[str, Seen]]:
    seen = Seen()

    def echo(req: bytes, ctx: Any) -> bytes:
        seen.metadata.append(dict(ctx.invocation_metadata()))
        return req

    def endless(req: bytes, ctx: Any) -> Iterator[bytes]:
        try:
            i = 0
            while ctx.is_active():
                i += 1
                yield str(i).encode()
        finally:
            seen.stream_stopped.set()

    handler = grpc.method_handlers_generic_handler(
        "t.S",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Skip": grpc.unary_unary_rpc_method_handler(echo),
            "Endless": grpc.unary_stream_rpc_method_handler(endless),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", seen
    server.stop(None)


class Recorder(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """An application's own interceptor."""

    def __init__(self) -> None:
        self.metadata: list[Any] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.metadata.append(list(details.metadata or ()))
        return continuation(details, request)


def test_grpc_handler_with_grpcs_experimental_attributes_is_left_as_it_is(sink: _sink.MemorySink) -> None:
    """A behaviour marked ``experimental_non_blocking`` is called by grpc with a callback to
    send its response with; the agent leaves such a handler as it is (untraced) so that the
    call works as without it."""

    def nb(req: bytes, ctx: Any, send: Any) -> None:
        send(b"nb-" + req)
        send(None)  # the end of the stream

    nb.experimental_non_blocking = True  # type: ignore[attr-defined]
    handler = grpc.method_handlers_generic_handler("t.N", {"Nb": grpc.unary_stream_rpc_method_handler(nb)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            assert list(ch.unary_stream("/t.N/Nb")(b"x", timeout=10)) == [b"nb-x"]
    finally:
        server.stop(None)


def test_grpc_metadata_copied_not_mutated(sink: _sink.MemorySink, grpc_server: tuple[str, Seen]) -> None:
    target, seen = grpc_server
    recorder = Recorder()
    channel = grpc.intercept_channel(grpc.insecure_channel(target), recorder)
    mine = [("x-app", "1")]
    assert channel.unary_unary("/t.S/Echo")(b"hi", metadata=mine) == b"hi"
    assert mine == [("x-app", "1")]  # the caller's list is untouched
    # The application wrapped our channel: its interceptor runs first, before sw8 is added.
    assert recorder.metadata == [[("x-app", "1")]]
    assert seen.metadata[0]["x-app"] == "1" and "sw8" in seen.metadata[0]
    got = wait_spans(sink, 2)
    (exit_span,) = [s for s in got if s[R.SPAN_TYPE] == R.SPAN_TYPE_EXIT]
    (entry,) = [s for s in got if s[R.SPAN_TYPE] == R.SPAN_TYPE_ENTRY]
    assert entry[R.SPAN_REFS][0][2] == exit_span[-1][R.SEG_SEGMENT_ID]  # parent segment
    channel.close()


def test_grpc_errors_unchanged_and_ignored_methods(
    sink: _sink.MemorySink, grpc_server: tuple[str, Seen]
) -> None:
    target, _seen = grpc_server
    with grpc.insecure_channel(target) as ch:
        with pytest.raises(grpc.RpcError) as info:
            ch.unary_unary("/t.S/Missing")(b"x")
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert ch.unary_unary("/t.S/Skip")(b"x") == b"x"  # ignored: traced on neither side
    got = wait_spans(sink, 1)
    ops = [s[R.SPAN_OPERATION] for s in got]
    assert ops == ["/t.S/Missing"]  # client side only: the server has no such method
    assert tags_of(got[0])["grpc.status_code"] == "StatusCode.UNIMPLEMENTED" and got[0][R.SPAN_IS_ERROR]


def test_ignored_methods_match_as_the_peer_agent() -> None:
    ignored = IgnoredMethods(["/a.B/Check", " /a.B/Watch.* "])
    assert ignored("/a.B/Check") and ignored("/A.b/check")
    assert ignored("/a.B/WatchAll")
    assert not ignored("/a.B/CheckMore") and not ignored("/a.B/Get")
    assert not IgnoredMethods([])("/a.B/Check")
    assert IgnoredMethods(["(unbalanced"])("(UNBALANCED")  # not a regex: exact, any case


def test_grpc_cancelled_server_stream_finishes_both_spans(
    sink: _sink.MemorySink, grpc_server: tuple[str, Seen]
) -> None:
    target, seen = grpc_server
    with grpc.insecure_channel(target) as ch:
        call = ch.unary_stream("/t.S/Endless")(b"")
        first = [next(call) for _ in range(3)]
        assert first == [b"1", b"2", b"3"]
        call.cancel()
        with pytest.raises(grpc.RpcError) as info:
            list(call)
        assert info.value.code() == grpc.StatusCode.CANCELLED
        assert seen.stream_stopped.wait(10)
        got = wait_spans(sink, 2)
        codes = {s[R.SPAN_TYPE]: tags_of(s)["grpc.status_code"] for s in got}
        assert codes == {R.SPAN_TYPE_EXIT: "StatusCode.CANCELLED", R.SPAN_TYPE_ENTRY: "StatusCode.CANCELLED"}
        # The server's pool threads carry no stale span: the next call is a proper entry.
        assert ch.unary_unary("/t.S/Echo")(b"again") == b"again"
    got = wait_spans(sink, 4)
    entries = [s for s in got if s[R.SPAN_TYPE] == R.SPAN_TYPE_ENTRY and s[R.SPAN_OPERATION] == "/t.S/Echo"]
    assert len(entries) == 1 and entries[0][R.SPAN_PARENT_ID] == -1 and entries[0][R.SPAN_REFS]


def test_grpc_aio_app_interceptors_see_sw8(sink: _sink.MemorySink, grpc_server: tuple[str, Seen]) -> None:
    target, seen = grpc_server
    got: list[Any] = []

    class Recorder(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
        async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            got.append(dict(details.metadata or ()))
            return await continuation(details, request)

    async def main() -> None:
        mine = grpc.aio.Metadata(("x-app", "2"))
        async with grpc.aio.insecure_channel(target, interceptors=[Recorder()]) as ch:
            assert await ch.unary_unary("/t.S/Echo")(b"a", metadata=mine) == b"a"
        assert list(mine) == [("x-app", "2")]  # the caller's metadata is untouched

    asyncio.run(main())
    assert got[0]["x-app"] == "2" and "sw8" in got[0]
    assert seen.metadata[0]["sw8"] == got[0]["sw8"]


def test_grpc_aio_cancel_and_results(sink: _sink.MemorySink, grpc_server: tuple[str, Seen]) -> None:
    target, _seen = grpc_server

    async def main() -> None:
        async with grpc.aio.insecure_channel(target) as ch:
            assert await ch.unary_unary("/t.S/Echo")(b"a") == b"a"
            call = ch.unary_stream("/t.S/Endless")(b"")
            got = []
            async for item in call:
                got.append(item)
                if len(got) == 2:
                    break
            call.cancel()
            assert await call.code() == grpc.StatusCode.CANCELLED
            task = asyncio.ensure_future(ch.unary_unary("/t.S/Echo")(b"b"))
            assert await task == b"b"

    asyncio.run(main())
    got = wait_spans(sink, 6)
    exits = {
        s[R.SPAN_OPERATION]: tags_of(s)["grpc.status_code"] for s in got if s[R.SPAN_TYPE] == R.SPAN_TYPE_EXIT
    }
    assert exits == {"/t.S/Echo": "StatusCode.OK", "/t.S/Endless": "StatusCode.CANCELLED"}


def test_grpc_channels_of_the_reporter_thread_are_untouched(
    sink: _sink.MemorySink, grpc_server: tuple[str, Seen]
) -> None:
    target, seen = grpc_server
    out: list[Any] = []

    def reporter_like() -> None:
        async def ship() -> None:
            async with grpc.aio.insecure_channel(target) as ch:
                out.append(await ch.unary_unary("/t.S/Echo")(b"telemetry"))

        asyncio.run(ship())
        with grpc.insecure_channel(target) as ch:
            out.append(ch.unary_unary("/t.S/Echo")(b"sync"))

    t = threading.Thread(target=reporter_like, name=REPORTER_THREAD_NAME)
    t.start()
    t.join(30)
    assert out == [b"telemetry", b"sync"]
    assert all("sw8" not in md for md in seen.metadata)  # nothing injected
    got = wait_spans(sink, 2)
    assert [s[R.SPAN_TYPE] for s in got] == [R.SPAN_TYPE_ENTRY, R.SPAN_TYPE_ENTRY]  # the server's only


# -- aiohttp client and websockets -----------------------------------------------------------
@contextlib.asynccontextmanager
async def aiohttp_serving(app: Any) -> AsyncIterator[int]:
    """``app`` served on a free loopback port (yielded) for the block."""
    from aiohttp import web

    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def test_aiohttp_sub_application_template_has_its_prefix(sink: _sink.MemorySink) -> None:
    import aiohttp
    from aiohttp import web

    async def item(request: web.Request) -> web.Response:
        return web.Response(text=request.match_info["iid"])

    async def main() -> None:
        sub = web.Application()
        sub.router.add_get("/items/{iid}", item)
        app = web.Application()
        app.add_subapp("/shop/", sub)
        async with (
            aiohttp_serving(app) as port,
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/shop/items/5") as r,
        ):
            assert await r.text() == "5"

    asyncio.run(main())
    got = wait_spans(sink, 2)
    (entry,) = [s for s in got if s[R.SPAN_TYPE] == R.SPAN_TYPE_ENTRY]
    assert entry[R.SPAN_OPERATION] == "/shop/items/{iid}"
    assert entry[R.SPAN_COMPONENT] == 7008


def test_aiohttp_client_headers_and_errors(sink: _sink.MemorySink) -> None:
    import aiohttp
    from aiohttp import web

    received: list[dict[str, str]] = []

    async def handler(request: web.Request) -> web.Response:
        received.append(dict(request.headers))
        return web.Response(status=404 if request.path == "/missing" else 200, text="x")

    async def main() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        async with aiohttp_serving(app) as port:
            mine = {"X-App": "1"}
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/a?q=1", headers=mine) as r:
                    assert r.status == 200 and await r.text() == "x"
                assert mine == {"X-App": "1"}
                async with session.get(f"http://127.0.0.1:{port}/missing") as r:
                    assert r.status == 404
                with pytest.raises(aiohttp.ClientConnectorError):
                    await session.get("http://127.0.0.1:1/refused")

    asyncio.run(main())
    assert received[0]["X-App"] == "1" and "sw8" in received[0]
    got = wait_spans(sink, 5)
    exits = {s[R.SPAN_OPERATION]: s for s in got if s[R.SPAN_TYPE] == R.SPAN_TYPE_EXIT}
    assert set(exits) == {"/a", "/missing", "/refused"}
    assert tags_of(exits["/a"])["http.status_code"] == "200" and not exits["/a"][R.SPAN_IS_ERROR]
    assert tags_of(exits["/missing"])["http.status_code"] == "404" and exits["/missing"][R.SPAN_IS_ERROR]
    assert exits["/refused"][R.SPAN_IS_ERROR] and exits["/refused"][R.SPAN_LOGS]
    assert exits["/a"][R.SPAN_COMPONENT] == 7008


def test_aiohttp_client_raise_for_status_tags_the_status(sink: _sink.MemorySink) -> None:
    """``raise_for_status`` (the session's, or the request's): the ``ClientResponseError``
    propagates unchanged and the failed exit span is tagged with the refused status."""
    import aiohttp
    from aiohttp import web

    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=int(request.path.rpartition("/")[2]), text="x")

    async def main() -> list[int]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        raised = []
        async with aiohttp_serving(app) as port:
            base = f"http://127.0.0.1:{port}"
            async with aiohttp.ClientSession(raise_for_status=True) as session:
                with pytest.raises(aiohttp.ClientResponseError) as e1:
                    await session.get(f"{base}/session/503")
                raised.append(e1.value.status)
            async with aiohttp.ClientSession() as session:
                with pytest.raises(aiohttp.ClientResponseError) as e2:
                    await session.get(f"{base}/request/404", raise_for_status=True)
                raised.append(e2.value.status)
        return raised

    assert asyncio.run(main()) == [503, 404]
    got = wait_spans(sink, 4)
    exits = {s[R.SPAN_OPERATION]: s for s in got if s[R.SPAN_TYPE] == R.SPAN_TYPE_EXIT}
    assert set(exits) == {"/session/503", "/request/404"}
    for op, status in (("/session/503", "503"), ("/request/404", "404")):
        assert tags_of(exits[op])["http.status_code"] == status, tags_of(exits[op])
        assert exits[op][R.SPAN_IS_ERROR] and exits[op][R.SPAN_LOGS]


def test_aiohttp_client_replaces_a_forwarded_sw8(sink: _sink.MemorySink) -> None:
    """A proxy that forwards its incoming headers (sw8 among them) sends one sw8, the exit
    span's own, not the forwarded one beside it."""
    import aiohttp
    from aiohttp import web

    received: list[list[str]] = []

    async def handler(request: web.Request) -> web.Response:
        received.append(request.headers.getall("sw8", []))
        return web.Response(text="x")

    async def main() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        async with aiohttp_serving(app) as port, aiohttp.ClientSession() as session:
            forwarded = {"sw8": "1-forwarded", "X-App": "1"}
            with new_entry_span("/proxy"):
                async with session.get(f"http://127.0.0.1:{port}/b", headers=forwarded) as r:
                    assert r.status == 200
            assert forwarded == {"sw8": "1-forwarded", "X-App": "1"}

    asyncio.run(main())
    ((sw8,),) = received
    assert sw8 != "1-forwarded" and sw8.startswith("1-")


def test_aiohttp_client_on_the_reporter_thread_is_untouched(sink: _sink.MemorySink) -> None:
    import aiohttp
    from aiohttp import web

    received: list[dict[str, str]] = []

    async def handler(request: web.Request) -> web.Response:
        received.append(dict(request.headers))
        return web.Response(text="ok")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v3/segments", handler)
        async with aiohttp_serving(app) as port, aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/v3/segments"
            async with session.post(url, data=b"[]") as r:
                assert await r.text() == "ok"

    t = threading.Thread(target=lambda: asyncio.run(main()), name=REPORTER_THREAD_NAME)
    t.start()
    t.join(30)
    assert len(received) == 1 and "sw8" not in received[0]
    # Only the (instrumented) server's entry span: no exit span for the reporter's request.
    assert [s[R.SPAN_TYPE] for s in wait_spans(sink, 1)] == [R.SPAN_TYPE_ENTRY]


def test_websockets_rejected_handshake_is_an_error(sink: _sink.MemorySink) -> None:
    import websockets
    from websockets.asyncio.server import serve
    from websockets.exceptions import InvalidStatus

    async def main() -> None:
        def reject(connection: Any, request: Any) -> Any:
            if request.path == "/no":
                return connection.respond(403, "forbidden\n")
            return None

        async def echo(ws: Any) -> None:
            async for msg in ws:
                await ws.send(msg)

        async with serve(echo, "127.0.0.1", 0, process_request=reject) as server:
            port = next(iter(server.sockets)).getsockname()[1]
            async with websockets.connect(f"ws://127.0.0.1:{port}/ok") as ws:
                await ws.send("hi")
                assert await ws.recv() == "hi"
            with pytest.raises(InvalidStatus) as info:
                await websockets.connect(f"ws://127.0.0.1:{port}/no")
            assert info.value.response.status_code == 403

    asyncio.run(main())
    got = {s[R.SPAN_OPERATION]: s for s in wait_spans(sink, 2)}
    ok, no = got["/ok"], got["/no"]
    assert tags_of(ok)["http.status_msg"] == "connection open" and tags_of(ok)["http.status_code"] == "101"
    assert tags_of(no)["http.status_msg"] == "invalid handshake" and tags_of(no)["http.status_code"] == "403"
    assert no[R.SPAN_IS_ERROR] and not ok[R.SPAN_IS_ERROR]
    assert ok[R.SPAN_COMPONENT] == 7018


def test_websockets_sync_client(sink: _sink.MemorySink) -> None:
    from websockets.asyncio.server import serve
    from websockets.sync.client import connect

    seen: list[str] = []
    ready = threading.Event()
    stop: list[Any] = []
    port: list[int] = []

    def server_thread() -> None:
        async def echo(ws: Any) -> None:
            seen.append(",".join(ws.request.headers.get_all("sw8")))
            async for msg in ws:
                await ws.send(msg)

        async def main() -> None:
            async with serve(echo, "127.0.0.1", 0) as server:
                port.append(next(iter(server.sockets)).getsockname()[1])
                done = asyncio.get_running_loop().create_future()
                stop.append((asyncio.get_running_loop(), done))
                ready.set()
                await done

        asyncio.run(main())

    t = threading.Thread(target=server_thread)
    t.start()
    try:
        assert ready.wait(10)
        # A forwarded sw8 among the caller's headers: replaced by the span's, not sent beside it.
        mine = {"X-App": "1", "sw8": "1-forwarded"}
        with connect(f"ws://127.0.0.1:{port[0]}/sync", additional_headers=mine) as ws:
            ws.send("hi")
            assert ws.recv() == "hi"
    finally:
        if stop:
            loop, done = stop[0]
            loop.call_soon_threadsafe(done.set_result, None)
        t.join(10)
    (span,) = wait_spans(sink, 1)
    assert span[R.SPAN_OPERATION] == "/sync" and span[R.SPAN_COMPONENT] == 7018
    assert tags_of(span)["http.status_code"] == "101"
    assert seen[0].startswith("1-") and "," not in seen[0] and seen[0] != "1-forwarded"  # one sw8, ours


def test_grpc_aio_server_keeps_each_handler_kind(sink: _sink.MemorySink) -> None:
    """grpc.aio runs a plain function in its thread pool, a coroutine in the loop, and an
    async generator or a coroutine writing with context.write() as a stream: each still
    works, each gets its entry span."""

    def plain(req: bytes, ctx: Any) -> bytes:
        return b"plain-" + req

    async def coro(req: bytes, ctx: Any) -> bytes:
        return b"coro-" + req

    async def agen(req: bytes, ctx: Any) -> Any:
        for i in range(2):
            yield req + str(i).encode()

    async def writer(req: bytes, ctx: Any) -> None:
        await ctx.write(req + b"-w1")
        await ctx.write(req + b"-w2")

    async def main() -> dict[str, Any]:
        handler = grpc.method_handlers_generic_handler(
            "k.S",
            {
                "Plain": grpc.unary_unary_rpc_method_handler(plain),
                "Coro": grpc.unary_unary_rpc_method_handler(coro),
                "Agen": grpc.unary_stream_rpc_method_handler(agen),
                "Writer": grpc.unary_stream_rpc_method_handler(writer),
            },
        )
        server = grpc.aio.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                return {
                    "Plain": await ch.unary_unary("/k.S/Plain")(b"a"),
                    "Coro": await ch.unary_unary("/k.S/Coro")(b"b"),
                    "Agen": [x async for x in ch.unary_stream("/k.S/Agen")(b"c")],
                    "Writer": [x async for x in ch.unary_stream("/k.S/Writer")(b"d")],
                }
        finally:
            await server.stop(None)

    assert asyncio.run(main()) == {
        "Plain": b"plain-a",
        "Coro": b"coro-b",
        "Agen": [b"c0", b"c1"],
        "Writer": [b"d-w1", b"d-w2"],
    }
    got = wait_spans(sink, 8)
    entries = {s[R.SPAN_OPERATION] for s in got if s[R.SPAN_TYPE] == R.SPAN_TYPE_ENTRY and s[R.SPAN_REFS]}
    assert entries == {"/k.S/Plain", "/k.S/Coro", "/k.S/Agen", "/k.S/Writer"}
    assert all(tags_of(s)["grpc.status_code"] == "StatusCode.OK" for s in got)


def _entries(got: list[list[Any]]) -> dict[str, list[Any]]:
    return {s[R.SPAN_OPERATION]: s for s in got if s[R.SPAN_TYPE] == R.SPAN_TYPE_ENTRY}


def test_grpc_server_traced_however_its_handlers_are_given(sink: _sink.MemorySink) -> None:
    """Handlers given to grpc.server(), registered method handlers (ignored methods left
    out) and, in a server with an application interceptor, the handlers it returns, also
    one it substitutes: each call has its entry span continuing the caller's trace, and with
    an application interceptor the span is current in what the interceptor runs too."""
    from swmp.tracing.span import current_span

    inside: list[tuple[str, Any]] = []

    def echo(req: bytes, ctx: Any) -> bytes:
        inside.append(("echo", getattr(current_span.get(), "op", None)))
        return req

    def denied(req: bytes, ctx: Any) -> bytes:
        ctx.abort(grpc.StatusCode.PERMISSION_DENIED, "no")
        return b""  # not reached: abort raises

    class Guard(grpc.ServerInterceptor):  # type: ignore[misc]
        def intercept_service(self, continuation: Any, details: Any) -> Any:
            if details.method.endswith("/Denied"):
                return grpc.unary_unary_rpc_method_handler(denied)
            handler = continuation(details)

            def around(req: bytes, ctx: Any) -> bytes:
                inside.append(("guard", getattr(current_span.get(), "op", None)))
                return handler.unary_unary(req, ctx)  # type: ignore[no-any-return]

            return grpc.unary_unary_rpc_method_handler(around)

    unary = grpc.unary_unary_rpc_method_handler
    given = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        handlers=[grpc.method_handlers_generic_handler("t.C", {"Echo": unary(echo)})],
    )
    registered = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    registered.add_registered_method_handlers("t.S", {"Echo": unary(echo), "Skip": unary(echo)})
    guarded = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[Guard()])
    guarded.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.I", {"Echo": unary(echo)}),))
    targets = {}
    for name, server in (("given", given), ("registered", registered), ("guarded", guarded)):
        targets[name] = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        server.start()
    try:
        calls = [("given", "/t.C/Echo"), ("registered", "/t.S/Echo"), ("registered", "/t.S/Skip")]
        calls += [("guarded", "/t.I/Echo")]
        for name, method in calls:
            with grpc.insecure_channel(targets[name]) as ch:
                assert ch.unary_unary(method)(b"x") == b"x"
        with grpc.insecure_channel(targets["guarded"]) as ch, pytest.raises(grpc.RpcError) as info:
            ch.unary_unary("/t.I/Denied")(b"x")
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        for server in (given, registered, guarded):
            server.stop(None)
    got = wait_spans(sink, 8)  # 4 exit spans (Skip: none), 4 entry spans
    entries = _entries(got)
    assert set(entries) == {"/t.C/Echo", "/t.S/Echo", "/t.I/Echo", "/t.I/Denied"}
    for op, span in entries.items():
        assert span[R.SPAN_REFS], op  # sw8 from the caller's metadata
        assert span[R.SPAN_COMPONENT] == 23 and tags_of(span)["grpc.method"] == op
    assert tags_of(entries["/t.I/Echo"])["grpc.status_code"] == "StatusCode.OK"
    denied_span = entries["/t.I/Denied"]
    assert tags_of(denied_span)["grpc.status_code"] == "StatusCode.PERMISSION_DENIED"
    assert denied_span[R.SPAN_IS_ERROR]
    assert inside == [  # the calls ran one after another
        ("echo", "/t.C/Echo"),
        ("echo", "/t.S/Echo"),
        ("echo", None),  # /t.S/Skip: ignored, no span
        ("guard", "/t.I/Echo"),
        ("echo", "/t.I/Echo"),
    ]


def test_grpc_aio_server_registered_and_intercepted(sink: _sink.MemorySink) -> None:
    """grpc.aio: registered method handlers, and a server with an application interceptor
    (the span current in what it runs around the method): entry spans continuing the
    caller's trace, results unchanged."""
    from swmp.tracing.span import current_span

    inside: list[Any] = []

    async def coro(req: bytes, ctx: Any) -> bytes:
        return b"coro-" + req

    async def agen(req: bytes, ctx: Any) -> Any:
        for i in range(2):
            yield req + str(i).encode()

    class Guard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
        async def intercept_service(self, continuation: Any, details: Any) -> Any:
            handler = await continuation(details)

            async def around(req: bytes, ctx: Any) -> bytes:
                inside.append(getattr(current_span.get(), "op", None))
                return await handler.unary_unary(req, ctx)  # type: ignore[no-any-return]

            return grpc.unary_unary_rpc_method_handler(around)

    async def main() -> list[Any]:
        registered = grpc.aio.server()
        registered.add_registered_method_handlers(
            "r.S",
            {
                "Coro": grpc.unary_unary_rpc_method_handler(coro),
                "Agen": grpc.unary_stream_rpc_method_handler(agen),
            },
        )
        guarded = grpc.aio.server(interceptors=[Guard()])
        guarded.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "i.S", {"Coro": grpc.unary_unary_rpc_method_handler(coro)}
                ),
            )
        )
        ports = [s.add_insecure_port("127.0.0.1:0") for s in (registered, guarded)]
        for s in (registered, guarded):
            await s.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{ports[0]}") as ch:
                out = [await ch.unary_unary("/r.S/Coro")(b"a")]
                out.append([x async for x in ch.unary_stream("/r.S/Agen")(b"b")])
            async with grpc.aio.insecure_channel(f"127.0.0.1:{ports[1]}") as ch:
                out.append(await ch.unary_unary("/i.S/Coro")(b"c"))
            return out
        finally:
            for s in (registered, guarded):
                await s.stop(None)

    assert asyncio.run(main()) == [b"coro-a", [b"b0", b"b1"], b"coro-c"]
    got = wait_spans(sink, 6)
    entries = _entries(got)
    assert set(entries) == {"/r.S/Coro", "/r.S/Agen", "/i.S/Coro"}
    assert all(span[R.SPAN_REFS] for span in entries.values())  # sw8 from the metadata
    assert all(tags_of(s)["grpc.status_code"] == "StatusCode.OK" for s in entries.values())
    assert inside == ["/i.S/Coro"]
