"""Paced HTTP load on its own thread; every request carries a fresh trace id.

    with PacedLoad(port, rate=200) as load:       # starts at once
        ...                                        # inject faults meanwhile
    load.served                                    # trace ids answered 200

Each request sends an ``sw8`` header with a new trace id, so the segment the agent reports
for it carries that id: what was served is matched exactly against what the backend got.
Request ``i`` is due at ``start + i / rate``; a request that cannot start within a second
of its due time is skipped and counted ``late`` (the load never piles up behind a stall).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import dataclass, field

from tests.servers import sw8_header


@dataclass
class LoadTally:
    served: list[str] = field(default_factory=list)  # trace ids answered 2xx, in order
    failed: list[str] = field(default_factory=list)  # trace ids sent without a 2xx answer
    late: int = 0
    per_second: dict[int, int] = field(default_factory=dict)  # second since start -> served


async def _one(port: int, path: str, trace_id: str) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nsw8: {sw8_header(trace_id)}\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode())
        answer = await reader.readuntil(b"\r\n\r\n")
        await reader.read()  # to EOF: Connection: close
        return answer.startswith((b"HTTP/1.1 2", b"HTTP/1.0 2"))
    finally:
        writer.close()


class PacedLoad:
    def __init__(self, port: int, rate: float, *, path: str = "/cpu", concurrency: int = 48) -> None:
        self.port = port
        self.rate = rate
        self.path = path
        self.concurrency = concurrency
        self.tally = LoadTally()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="paced-load", daemon=True)
        self.started = 0.0

    # -- control ---------------------------------------------------------------------------------
    def start(self) -> PacedLoad:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> LoadTally:
        self._stop.set()
        self._thread.join(60)
        return self.tally

    def __enter__(self) -> PacedLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def served(self) -> list[str]:
        with self._lock:
            return list(self.tally.served)

    def served_count(self) -> int:
        with self._lock:
            return len(self.tally.served)

    def wait_served(self, n: int, timeout: float = 60.0) -> None:
        """Block until ``n`` more requests than now were served (the server is taking load)."""
        target = self.served_count() + n
        deadline = time.monotonic() + timeout
        while self.served_count() < target:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise AssertionError(f"load stalled: {self.served_count()} of {target} served")
            time.sleep(0.05)

    # -- the load thread -------------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        start = time.monotonic()
        interval = 1.0 / self.rate
        next_index = 0

        async def client() -> None:
            nonlocal next_index
            while not self._stop.is_set():
                i = next_index
                next_index += 1
                delay = start + i * interval - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif -delay > 1.0:
                    with self._lock:
                        self.tally.late += 1
                    continue
                if self._stop.is_set():
                    return
                trace_id = uuid.uuid4().hex
                try:
                    ok = await asyncio.wait_for(_one(self.port, self.path, trace_id), 30.0)
                except (
                    OSError,
                    asyncio.TimeoutError,
                    asyncio.IncompleteReadError,
                    asyncio.LimitOverrunError,
                ):
                    ok = False
                with self._lock:
                    if ok:
                        self.tally.served.append(trace_id)
                        second = int(time.monotonic() - start)
                        self.tally.per_second[second] = self.tally.per_second.get(second, 0) + 1
                    else:
                        self.tally.failed.append(trace_id)

        await asyncio.gather(*(client() for _ in range(self.concurrency)))
