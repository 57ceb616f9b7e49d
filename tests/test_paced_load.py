"""benchmarks/paced_load.py: the fixed-rate load behind the prefork benchmark's low-rate rows.

Its interleaved form is what keeps two servers measured side by side from meeting the
machine differently (docs/performance.md, "Fixed-rate samples without a bias of their own"):
each server gets its own rate, and their requests take turns.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from benchmarks import paced_load

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


@asynccontextmanager
async def servers(count: int, arrivals: list[tuple[int, float]]) -> AsyncIterator[list[str]]:
    """``count`` tiny HTTP servers on 127.0.0.1 noting (server, time) of every request."""

    def handler(index: int) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            arrivals.append((index, time.monotonic()))
            writer.write(ANSWER)
            await writer.drain()
            writer.close()

        return handle

    started = [await asyncio.start_server(handler(i), "127.0.0.1", 0) for i in range(count)]
    try:
        yield [f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}/io" for s in started]
    finally:
        for s in started:
            s.close()
            await s.wait_closed()


def test_each_server_gets_its_rate_and_the_requests_take_turns() -> None:
    arrivals: list[tuple[int, float]] = []

    async def run() -> list[paced_load.PacedResult]:
        async with servers(2, arrivals) as urls:
            return await paced_load.run_interleaved(urls, 20.0, 1.0)

    results = asyncio.run(run())
    assert [(r.requests, r.errors, r.late) for r in results] == [(20, 0, 0), (20, 0, 0)]
    assert [i for i, _ in arrivals].count(0) == 20
    # Due 25 ms apart, alternately: only a stall of the machine longer than that could put
    # two requests to the same server next to each other.
    order = [i for i, _ in sorted(arrivals, key=lambda a: a[1])]
    repeats = sum(1 for a, b in itertools.pairwise(order) if a == b)
    assert repeats <= 4, order


def test_one_url_is_the_plain_paced_load() -> None:
    arrivals: list[tuple[int, float]] = []

    async def run() -> paced_load.PacedResult:
        async with servers(1, arrivals) as urls:
            return await paced_load.run_paced(urls[0], 30.0, 0.5)

    r = asyncio.run(run())
    assert (r.requests, r.errors, r.late, r.rate) == (15, 0, 0, 30.0)
    assert r.p50_ms <= r.p99_ms


def test_the_command_line_prints_one_result_per_url(capsys: pytest.CaptureFixture[str]) -> None:
    arrivals: list[tuple[int, float]] = []

    async def run() -> None:
        async with servers(2, arrivals) as urls:
            # The command runs a loop of its own: in a thread, while these servers answer.
            await asyncio.to_thread(paced_load._main, [*urls, "10", "0.5", "--json"])

    asyncio.run(run())
    rows = json.loads(capsys.readouterr().out)
    assert [row["requests"] for row in rows] == [5, 5]
