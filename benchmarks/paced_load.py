"""A fixed-rate HTTP load generator (wrk2 is not packaged; wrk only saturates).

Request ``i`` is *due* at ``start + i / rate``; a pool of client tasks takes the next due
request, waits for its time, opens a connection (Gunicorn's sync workers close every
connection), sends ``GET``, reads the whole answer. Latency is measured from the due time,
not the send time, so a server that falls behind shows it in the latency (no coordinated
omission). Requests that cannot start within ``max_lag_s`` of their due time are counted as
``late`` instead of piling up.

With several URLs, each gets ``RATE`` requests/s and their requests take turns
(:func:`run_interleaved`); ``--json`` then prints a list, one result per URL.

    python benchmarks/paced_load.py URL [URL ...] RATE SECONDS [--json]
    python benchmarks/paced_load.py http://127.0.0.1:8000/io 200 5
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit


@dataclass
class PacedResult:
    rate: float
    seconds: float
    requests: int
    errors: int
    late: int
    p50_ms: float
    p99_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


async def _one(host: str, port: int, request: bytes) -> bool:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        ok = head.startswith(b"HTTP/1.1 2") or head.startswith(b"HTTP/1.0 2")
        length = -1
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        if length >= 0:
            await reader.readexactly(length)
        else:
            await reader.read()
        return ok
    finally:
        writer.close()


async def run_paced(
    url: str, rate: float, seconds: float, *, concurrency: int = 32, max_lag_s: float = 1.0
) -> PacedResult:
    return (await run_interleaved([url], rate, seconds, concurrency=concurrency, max_lag_s=max_lag_s))[0]


async def run_interleaved(
    urls: list[str], rate: float, seconds: float, *, concurrency: int = 32, max_lag_s: float = 1.0
) -> list[PacedResult]:
    """``rate`` requests/s to each of ``urls``, their requests taking turns: request ``i``
    goes to ``urls[i % n]`` and is due at ``start + i / (n * rate)``.

    Why one load for several servers: two loads started together have their requests due at
    the same instants, so at every tick one server's request lands on an idle CPU and the
    other's finds it awake and warm, and which is which holds for the whole run. On this
    project's VM that alone moved one server's CPU per request by 20-35 us against an
    identical one. Taking turns at half the period apart, each server's request finds the
    machine as the other's did."""
    targets = []
    for url in urls:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()
        targets.append((host, port, request))
    n = len(targets)
    total = max(1, int(rate * seconds)) * n
    interval = 1.0 / (rate * n)
    start = time.monotonic() + 0.05
    latencies: list[list[float]] = [[] for _ in targets]
    counts = [{"errors": 0, "late": 0} for _ in targets]
    next_index = 0

    async def client() -> None:
        nonlocal next_index
        while True:
            i = next_index
            if i >= total:
                return
            next_index += 1
            k = i % n
            due = start + i * interval
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            elif -delay > max_lag_s:
                counts[k]["late"] += 1
                continue
            try:
                ok = await asyncio.wait_for(_one(*targets[k]), 10.0)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
                ok = False
            if ok:
                latencies[k].append(time.monotonic() - due)
            else:
                counts[k]["errors"] += 1

    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = max(1e-9, time.monotonic() - start)
    for lat in latencies:
        lat.sort()
    return [
        PacedResult(rate, elapsed, len(lat), c["errors"], c["late"], _pct(lat, 0.5), _pct(lat, 0.99))
        for lat, c in zip(latencies, counts, strict=True)
    ]


def _pct(ordered: list[float], p: float) -> float:
    """The ``p`` quantile of sorted latencies, in ms."""
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1e3


def paced(url: str, rate: float, seconds: float) -> PacedResult:
    return asyncio.run(run_paced(url, rate, seconds))


def _main(argv: list[str]) -> None:
    words = [a for a in argv if not a.startswith("--")]
    urls, rate, seconds = words[:-2], float(words[-2]), float(words[-1])
    results = asyncio.run(run_interleaved(urls, rate, seconds))
    if "--json" in argv:  # for a caller that runs several loads at once (prefork_bench.py)
        rows = [asdict(r) for r in results]
        print(json.dumps(rows[0] if len(rows) == 1 else rows))
        return
    for url, r in zip(urls, results, strict=True):
        print(
            f"{url}: {r.rps:.1f} req/s of {r.rate:.1f} asked: {r.requests} ok, {r.errors} errors, "
            f"{r.late} late; p50 {r.p50_ms:.2f} ms p99 {r.p99_ms:.2f} ms"
        )


if __name__ == "__main__":
    _main(sys.argv[1:])
