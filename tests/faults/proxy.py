"""A fault-injecting TCP proxy (asyncio, on its own thread) in front of a backend.

    proxy = FaultProxy(upstream=("127.0.0.1", 11800)).start()
    proxy.port                       # what the agent is told to send to
    proxy.set_mode("closed")         # outage: port closed, every connection reset
    proxy.set_mode("blackhole")      # accepts and reads, never answers, forwards nothing
    proxy.set_mode("pass")           # back: bytes flow both ways again
    proxy.stop()

Modes act on live connections too: going ``closed`` resets them, going ``blackhole`` stops
forwarding on them (they stay open, as on a hung backend) and going back to ``pass`` closes
the black-holed ones (the backend "restarted"), so the client reconnects.
The proxy knows nothing of gRPC: it moves bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Coroutine
from typing import Any, Literal

Mode = Literal["pass", "closed", "blackhole"]


class _Link:
    """One client connection and, in ``pass`` mode, its upstream connection.

    Closing a writer ends the reads of its transport too (EOF), which ends the pumps.
    """

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.blackholed = False
        self.tasks: list[asyncio.Task[None]] = []

    def close(self, reset: bool = False) -> None:
        for writer in (self.client, self.upstream):
            if writer is None:
                continue
            if reset:  # RST rather than FIN, as a dying backend's kernel does
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                        )
            if reset:
                writer.transport.abort()
            else:
                writer.close()
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    def __init__(self, upstream: tuple[str, int], port: int = 0) -> None:
        self.upstream = upstream
        self.port = port
        self.mode: Mode = "pass"
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._links: set[_Link] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- control (any thread) ----------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def set_mode(self, mode: Mode) -> None:
        self._call(self._set_mode(mode))

    def set_upstream(self, upstream: tuple[str, int]) -> None:
        """Where new connections go (live ones are closed, so clients reconnect there)."""
        self._call(self._set_upstream(upstream))

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._set_mode("closed"))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # -- inside the loop -----------------------------------------------------------------------
    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _set_mode(self, mode: Mode) -> None:
        old, self.mode = self.mode, mode
        if mode == "closed":
            if self._server is not None:
                self._server.close()
                self._server = None
            for link in list(self._links):
                link.close(reset=True)
            self._links.clear()
            return
        if old == "closed":
            await self._listen()
        if mode == "blackhole":
            for link in self._links:
                link.blackholed = True
        elif old == "blackhole":
            for link in [lk for lk in self._links if lk.blackholed]:
                link.close(reset=True)
                self._links.discard(link)

    async def _set_upstream(self, upstream: tuple[str, int]) -> None:
        if upstream == self.upstream:
            return
        self.upstream = upstream
        for link in list(self._links):
            link.close()
        self._links.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        link = _Link(writer)
        self._links.add(link)
        try:
            if self.mode == "blackhole":
                link.blackholed = True
            else:
                try:
                    up_reader, link.upstream = await asyncio.open_connection(*self.upstream)
                except OSError:
                    link.close(reset=True)
                    return
                back = asyncio.ensure_future(self._pump(up_reader, writer, link))
                link.tasks.append(back)
            await self._pump(reader, link.upstream, link)
        finally:
            self._links.discard(link)
            link.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None, link: _Link
    ) -> None:
        """Copy ``reader`` to ``writer`` until EOF; black-holed bytes are read and discarded."""
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if link.blackholed or writer is None:
                    continue
                writer.write(data)
                await writer.drain()
