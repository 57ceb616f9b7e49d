"""A gRPC server and a gRPC client as real processes, for ``tests/test_servers_grpc.py``.

    python -m tests.e2e_apps.grpc_app serve PORT sync|aio
    python -m tests.e2e_apps.grpc_app call PORT sync|aio OUT.json

Methods (generic handlers over raw bytes, no generated code): ``/demo.Users/Get`` (unary),
``/demo.Users/List`` (server streaming, 3 messages), ``/demo.Users/Upload`` (client
streaming), ``/demo.Users/Chat`` (both streaming), ``/demo.Users/Fail`` (aborts with
NOT_FOUND), ``/demo.Users/Relay`` (calls ``Get`` on the same server through its own
channel: an exit span inside an entry span) and ``/demo.Health/Check`` (meant to be in
``SW_PLUGIN_GRPC_IGNORED_METHODS``). The client calls each once and writes what it got.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from typing import Any

import grpc

SERVICE = "demo.Users"


def _sync_handlers(port: int) -> Any:
    relay = grpc.insecure_channel(f"127.0.0.1:{port}")

    def get(req: bytes, ctx: Any) -> bytes:
        return b"user-" + req

    def list_(req: bytes, ctx: Any) -> Iterator[bytes]:
        for i in range(3):
            yield req + str(i).encode()

    def upload(it: Iterator[bytes], ctx: Any) -> bytes:
        return b"+".join(it)

    def chat(it: Iterator[bytes], ctx: Any) -> Iterator[bytes]:
        for x in it:
            yield x.upper()

    def fail(req: bytes, ctx: Any) -> bytes:
        ctx.abort(grpc.StatusCode.NOT_FOUND, "no such user")
        return b""

    def relay_(req: bytes, ctx: Any) -> bytes:
        return b"relayed-" + relay.unary_unary(f"/{SERVICE}/Get")(req)

    def check(req: bytes, ctx: Any) -> bytes:
        return b"ok"

    return _generic(get, list_, upload, chat, fail, relay_, check)


def _aio_handlers(port: int) -> Any:
    channels: list[Any] = []

    async def get(req: bytes, ctx: Any) -> bytes:
        return b"user-" + req

    async def list_(req: bytes, ctx: Any) -> AsyncIterator[bytes]:
        for i in range(3):
            yield req + str(i).encode()

    async def upload(it: AsyncIterator[bytes], ctx: Any) -> bytes:
        return b"+".join([x async for x in it])

    async def chat(it: AsyncIterator[bytes], ctx: Any) -> AsyncIterator[bytes]:
        async for x in it:
            yield x.upper()

    async def fail(req: bytes, ctx: Any) -> bytes:
        await ctx.abort(grpc.StatusCode.NOT_FOUND, "no such user")
        return b""

    async def relay_(req: bytes, ctx: Any) -> bytes:
        if not channels:
            channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
        return b"relayed-" + await channels[0].unary_unary(f"/{SERVICE}/Get")(req)

    async def check(req: bytes, ctx: Any) -> bytes:
        return b"ok"

    return _generic(get, list_, upload, chat, fail, relay_, check)


def _generic(get: Any, list_: Any, upload: Any, chat: Any, fail: Any, relay: Any, check: Any) -> Any:  # noqa: PLR0917
    users = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Get": grpc.unary_unary_rpc_method_handler(get),
            "List": grpc.unary_stream_rpc_method_handler(list_),
            "Upload": grpc.stream_unary_rpc_method_handler(upload),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
            "Fail": grpc.unary_unary_rpc_method_handler(fail),
            "Relay": grpc.unary_unary_rpc_method_handler(relay),
        },
    )
    health = grpc.method_handlers_generic_handler(
        "demo.Health", {"Check": grpc.unary_unary_rpc_method_handler(check)}
    )
    return (users, health)


def serve(port: int, mode: str) -> None:
    if mode == "sync":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        server.add_generic_rpc_handlers(_sync_handlers(port))
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        print(f"grpc sync server on {port}", flush=True)
        server.wait_for_termination()
        return

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(_aio_handlers(port))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print(f"grpc aio server on {port}", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


def _calls_sync(port: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        m = f"/{SERVICE}/"
        out["Get"] = ch.unary_unary(m + "Get")(b"7").decode()
        out["List"] = [x.decode() for x in ch.unary_stream(m + "List")(b"u")]
        out["Upload"] = ch.stream_unary(m + "Upload")(iter([b"a", b"b"])).decode()
        out["Chat"] = [x.decode() for x in ch.stream_stream(m + "Chat")(iter([b"x", b"y"]))]
        try:
            ch.unary_unary(m + "Fail")(b"1")
        except grpc.RpcError as e:
            out["Fail"] = str(e.code())
        out["Relay"] = ch.unary_unary(m + "Relay")(b"8").decode()
        out["Check"] = ch.unary_unary("/demo.Health/Check")(b"").decode()
    return out


async def _calls_aio(port: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        m = f"/{SERVICE}/"
        out["Get"] = (await ch.unary_unary(m + "Get")(b"7")).decode()
        out["List"] = [x.decode() async for x in ch.unary_stream(m + "List")(b"u")]
        out["Upload"] = (await ch.stream_unary(m + "Upload")(iter([b"a", b"b"]))).decode()
        out["Chat"] = [x.decode() async for x in ch.stream_stream(m + "Chat")(iter([b"x", b"y"]))]
        try:
            await ch.unary_unary(m + "Fail")(b"1")
        except grpc.RpcError as e:
            out["Fail"] = str(e.code())
        out["Relay"] = (await ch.unary_unary(m + "Relay")(b"8")).decode()
        out["Check"] = (await ch.unary_unary("/demo.Health/Check")(b"")).decode()
    return out


def call(port: int, mode: str, out_path: str) -> None:
    result = _calls_sync(port) if mode == "sync" else asyncio.run(_calls_aio(port))
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, out_path)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3])
    else:
        call(int(sys.argv[2]), sys.argv[3], sys.argv[4])
