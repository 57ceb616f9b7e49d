"""A fixed-rate HTTP load generator (wrk2 is not packaged; wrk only saturates).

Request ``i`` is *due* at ``start + i / rate``; a pool of client tasks takes the next due
request, waits for its time, opens a connection (Gunicorn's sync workers close every
connection), sends ``GET``, reads the whole answer. Latency is measured from the due time,
not the send time, so a server that falls behind shows it in the latency (no coordinated
omission). Requests that cannot start within ``max_lag_s`` of their due time are counted as
``late`` instead of piling up.

    python benchmarks/paced_load.py http://127.0.0.1:8000/io 200 5 [--json]
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
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()
    total = max(1, int(rate * seconds))
    interval = 1.0 / rate
    start = time.monotonic() + 0.05
    latencies: list[float] = []
    counts = {"errors": 0, "late": 0}
    next_index = 0

    async def client() -> None:
        nonlocal next_index
        while True:
            i = next_index
            if i >= total:
                return
            next_index += 1
            due = start + i * interval
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            elif -delay > max_lag_s:
                counts["late"] += 1
                continue
            try:
                ok = await asyncio.wait_for(_one(host, port, request), 10.0)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
                ok = False
            if ok:
                latencies.append(time.monotonic() - due)
            else:
                counts["errors"] += 1

    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = max(1e-9, time.monotonic() - start)
    latencies.sort()

    def pct(p: float) -> float:
        if not latencies:
            return float("nan")
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1e3

    return PacedResult(rate, elapsed, len(latencies), counts["errors"], counts["late"], pct(0.5), pct(0.99))


def paced(url: str, rate: float, seconds: float) -> PacedResult:
    return asyncio.run(run_paced(url, rate, seconds))


if __name__ == "__main__":
    r = paced(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
    if "--json" in sys.argv[4:]:  # for a caller that runs several loads at once (prefork_bench.py)
        print(json.dumps(asdict(r)))
    else:
        print(
            f"{r.rps:.1f} req/s of {r.rate:.1f} asked: {r.requests} ok, {r.errors} errors, {r.late} late; "
            f"p50 {r.p50_ms:.2f} ms p99 {r.p99_ms:.2f} ms"
        )
