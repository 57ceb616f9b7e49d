"""How many segments per second one reporter drains, converts and sends.

Per segment size (1, 5 and 20 spans of a typical HTTP segment, 3 tags per span) the rings
of a fresh arena are pre-filled by writer processes, then one Reporter (the production
class, on its own event loop in this process, i.e. one core) drains them through:

* ``memory``  - a sender that accepts and forgets: ring read + orjson decode + batching +
  commit, no encoding;
* ``encode``  - the same plus the protobuf encoding of every batch (SegmentCollection
  bytes built by ``reporter_proc.encode``), nothing sent;
* ``grpc``    - the real gRPC sender (``collectInSync`` batches) to a sink in another
  process that only counts the bytes it receives.

``encode`` and ``grpc`` run once per encoder (``--encoders native,native-decoded,pure``,
interleaved, same records): ``native`` (``reporter_proc._encode_native`` when built, segments
straight from the ring's JSON bytes), ``native-decoded`` (the same C encoder on records decoded
by orjson) and ``pure`` (pure Python, decoded records), side by side with the ratio native/pure;
``memory`` decodes every record and encodes nothing, and runs once.

The clock runs from the reporter being ready to the last segment acknowledged.

``--memory-cap MIB``: instead, what the reporter's memory cap (``max_pending_bytes``) costs in
RSS. The backend is stalled (the sender blocks every call), the rings hold more than the
cap, and the reporter reads until the cap stops it; the growth of this process's RSS is
compared with the payload bytes it holds (records stay raw bytes until they are sent).

    python benchmarks/reporter_bench.py [--quick] [--json PATH] [--protocols memory,encode,grpc]
                                        [--spans 1,5,20] [--encoders native,native-decoded,pure]
    python benchmarks/reporter_bench.py --memory-cap 64 [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import orjson  # noqa: E402

from ipc import Arena  # noqa: E402
from reporter_proc import encode  # noqa: E402
from reporter_proc import records as R  # noqa: E402
from reporter_proc.loop import Reporter  # noqa: E402
from reporter_proc.process import tune_gc  # noqa: E402
from reporter_proc.senders.base import Record  # noqa: E402
from reporter_proc.senders.memory import MemorySender  # noqa: E402
from reporter_proc.settings import ReporterSettings  # noqa: E402

WRITERS = 4

SINK_SCRIPT = r"""
import asyncio, os, sys
import grpc
from grpc import aio

STREAMING = ("/collect", "/collectBatch", "/collectSnapshot")
counts = {"requests": 0, "bytes": 0}


def _unary(request, context):
    counts["requests"] += 1
    counts["bytes"] += len(request)
    return b""


async def _stream(request_iterator, context):
    async for request in request_iterator:
        counts["requests"] += 1
        counts["bytes"] += len(request)
    return b""


class Handler(grpc.GenericRpcHandler):
    def service(self, details):
        if details.method.endswith(STREAMING):
            return grpc.stream_unary_rpc_method_handler(_stream)
        return grpc.unary_unary_rpc_method_handler(_unary)


async def main():
    server = aio.server(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    server.add_generic_rpc_handlers((Handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(port))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    await server.wait_for_termination()


asyncio.run(main())
"""


def make_segment(i: int, spans: int) -> bytes:
    now = 1_700_000_000_000 + i
    span_list = []
    for s in range(spans):
        span_list.append(
            [
                s,
                s - 1,
                now,
                now + 12,
                "GET /api/orders/{id}" if s == 0 else f"SELECT orders {s}",
                "" if s == 0 else "db.internal:5432",
                0 if s == 0 else 1,
                R.LAYER_HTTP if s == 0 else R.LAYER_DATABASE,
                7000 if s == 0 else 22,
                False,
                False,
                [
                    "http.method",
                    "GET",
                    "http.url",
                    f"http://shop.local/api/orders/{i}",
                    "http.status_code",
                    "200",
                ],
                [],
                [],
            ]
        )
    trace = f"{i:016x}{os.getpid():08x}abcdef0123456789"
    return orjson.dumps([trace, f"s{trace}", "bench-service", "bench-instance-0", False, span_list])


def prefill(arena_path: str, count: int, spans: int) -> None:
    """Fill the rings from WRITERS processes (one slot each) before the clock starts."""
    per = [count // WRITERS + (1 if w < count % WRITERS else 0) for w in range(WRITERS)]
    pids = []
    for w in range(WRITERS):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                arena = Arena.open(arena_path)
                writer = arena.claim_slot()
                assert writer is not None
                for i in range(per[w]):
                    if not writer.write(R.SEGMENT, make_segment(w * 10_000_000 + i, spans)):
                        os._exit(3)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit("prefill failed: a ring was too small")


class CountingSender(MemorySender):
    """Accepts and forgets (a MemorySender keeps every record, which would skew the heap)."""

    name = "count"

    async def send_segments(self, records: list[Record]) -> None:
        self.calls += 1


class StalledSender(MemorySender):
    """A backend that does not answer while blocked (``block()``), then forgets."""

    name = "stalled"

    async def send_segments(self, records: list[Record]) -> None:
        await self._enter("segment")


class EncodeOnlySender(MemorySender):
    """Encodes every batch like the gRPC sender would, then drops the bytes."""

    name = "encode"
    raw_kinds = frozenset({"segment"})  # as the gRPC sender: raw JSON bytes in

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.count = 0

    async def send_segments(self, records: list[Record]) -> None:
        # Looked up per call, like the gRPC sender does: use_encoder() switches both.
        body = encode.segment_collection([encode.segment_payload(r) for r in records])
        self.bytes += len(body)
        self.count += len(records)


# name -> (segment, log, segment_collection, JSON fast path or None)
ENCODERS: dict[str, tuple[Any, Any, Any, Any]] = {
    "pure": (encode.segment_py, encode.log_py, encode.segment_collection_py, None),
}
if encode.NATIVE is not None:
    _N = encode.NATIVE
    ENCODERS["native"] = (_N.segment, _N.log, _N.segment_collection, _N.segment_json)
    # the native encoder on records decoded by orjson (what it did before the JSON fast path)
    ENCODERS["native-decoded"] = (_N.segment, _N.log, _N.segment_collection, None)


def use_encoder(name: str) -> None:
    """Point reporter_proc.encode's public functions (what the senders call) at one encoder."""
    encode.segment, encode.log, encode.segment_collection, encode._segment_json = ENCODERS[name]


def make_sender(protocol: str, settings: ReporterSettings) -> Any:
    if protocol == "memory":
        return CountingSender()
    if protocol == "encode":
        return EncodeOnlySender()
    from reporter_proc.senders import create_sender

    return create_sender(settings)


async def drive(reporter: Reporter, total: int) -> float:
    # The clock includes start-up (sender creation, tasks): the reporter drains as soon as
    # it runs, so there is no later moment that is fair to all protocols.
    t0 = time.perf_counter()
    task = asyncio.ensure_future(reporter.run())
    counters = reporter.counters
    while counters.sent.get("segment", 0) + counters.dropped.get("backend", 0) < total:
        if task.done():
            raise SystemExit("reporter ended before sending everything")
        await asyncio.sleep(0.002)
    elapsed = time.perf_counter() - t0
    reporter.request_stop("benchmark done")
    await task
    return elapsed


def prepare(protocol: str, spans: int, count: int, workdir: str) -> Arena:
    """A fresh arena whose rings hold ``count`` segments (written before any gRPC use:
    forking after grpc has threads only earns warnings)."""
    sample = len(make_segment(0, spans))
    per_ring = (count // WRITERS + 1) * ((sample + 15) & ~7) + 4096
    capacity = 1 << max(16, (2 * per_ring - 1).bit_length())
    path = os.path.join(workdir, f"bench-{protocol}-{spans}.arena")
    arena = Arena.create(path, slots=WRITERS, ring_capacity=capacity)
    prefill(path, count, spans)
    return arena


def one_run(
    arena: Arena, protocol: str, spans: int, count: int, port: int, *, encoder: str
) -> dict[str, Any]:
    try:
        use_encoder("pure" if encoder == "-" else encoder)
        settings = ReporterSettings(
            service="bench-service",
            protocol="grpc" if protocol == "grpc" else "memory",
            backends=(f"127.0.0.1:{port}",),
            shutdown_deadline_s=10.0,
            # Batches fill to batch_max_records while the rings are full; a short flush
            # interval only keeps the last, partial batch from idling on the clock.
            flush_interval_s=0.005,
        )
        reporter = Reporter(arena, settings, sender=make_sender(protocol, settings), mode="thread")
        loop = asyncio.new_event_loop()
        try:
            cpu0 = time.process_time()
            elapsed = loop.run_until_complete(drive(reporter, count))
            cpu = time.process_time() - cpu0
        finally:
            loop.close()
        c = reporter.counters
        if c.sent.get("segment", 0) != count:
            raise SystemExit(f"{protocol}: sent {c.sent} of {count} (dropped {c.dropped})")
        return {
            "protocol": protocol,
            "encoder": encoder,
            "spans_per_segment": spans,
            "segments": count,
            "record_bytes": len(make_segment(0, spans)),
            "seconds": round(elapsed, 4),
            "segments_per_s": round(count / elapsed, 1),
            "spans_per_s": round(count * spans / elapsed, 1),
            "us_per_segment": round(elapsed / count * 1e6, 2),
            "cpu_s": round(cpu, 3),
            # Per second of this process's CPU (all its threads): steadier than wall time
            # on a shared machine, and what "one core" means.
            "segments_per_cpu_s": round(count / cpu, 1) if cpu > 0 else 0.0,
        }
    finally:
        arena.close()
        arena.unlink()


def rss_bytes() -> int:
    """Anonymous RSS: the heap, without the arena's shared pages this process maps."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def memory_cap_run(cap_mib: int, spans: int, workdir: str) -> dict[str, Any]:
    """RSS growth of a reporter held at its memory cap by a stalled backend."""
    cap = cap_mib << 20
    size = len(make_segment(0, spans))
    count = int(cap * 1.25) // size  # more than the cap: the cap, not the rings, stops it
    per_ring = (count // WRITERS + 1) * ((size + 15) & ~7) + 4096
    capacity = 1 << max(16, (2 * per_ring - 1).bit_length())
    path = os.path.join(workdir, "bench-memory.arena")
    arena = Arena.create(path, slots=WRITERS, ring_capacity=capacity)
    try:
        prefill(path, count, spans)
        settings = ReporterSettings(service="bench-service", protocol="memory", max_pending_bytes=cap)
        sender = StalledSender()
        sender.block()
        reporter = Reporter(arena, settings, sender=sender, mode="thread")

        async def hold() -> tuple[int, int]:
            task = asyncio.ensure_future(reporter.run())
            deadline = time.monotonic() + 120
            while reporter.pending_bytes < cap - 2 * size and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            held, rss = reporter.pending_bytes, rss_bytes()
            reporter.request_stop("benchmark done")
            sender.unblock()
            await task
            return held, rss

        import gc

        gc.collect()
        rss0 = rss_bytes()
        loop = asyncio.new_event_loop()
        try:
            held, rss1 = loop.run_until_complete(hold())
        finally:
            loop.close()
        return {
            "cap_mib": cap_mib,
            "spans_per_segment": spans,
            "held_payload_mib": round(held / (1 << 20), 1),
            "rss_growth_mib": round((rss1 - rss0) / (1 << 20), 1),
            "rss_per_payload_byte": round((rss1 - rss0) / max(1, held), 2),
        }
    finally:
        arena.close()
        arena.unlink()


def start_sink(workdir: str) -> tuple[subprocess.Popen[bytes], int]:
    port_file = os.path.join(workdir, "sink.port")
    proc = subprocess.Popen([sys.executable, "-c", SINK_SCRIPT, port_file])
    deadline = time.monotonic() + 30
    while not os.path.exists(port_file):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("the gRPC sink did not start")
        time.sleep(0.01)
    with open(port_file) as f:
        return proc, int(f.read())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--protocols", default="memory,encode,grpc")
    parser.add_argument("--spans", default="1,5,20")
    available = ",".join(e for e in ("native", "native-decoded", "pure") if e in ENCODERS)
    parser.add_argument(
        "--encoders", default=available, help="encoders to compare for encode/grpc (default: all available)"
    )
    parser.add_argument("--memory-cap", type=int, metavar="MIB", help="measure the memory cap instead")
    args = parser.parse_args()
    if args.memory_cap:
        tune_gc()
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        workdir = tempfile.mkdtemp(prefix="swmp-bench-", dir=shm)
        try:
            r = memory_cap_run(args.memory_cap, 5, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        print(f"{'cap MiB':>8}{'held payload MiB':>18}{'RSS growth MiB':>16}{'RSS/payload':>13}")
        print(
            f"{r['cap_mib']:>8}{r['held_payload_mib']:>18}{r['rss_growth_mib']:>16}"
            f"{r['rss_per_payload_byte']:>13}"
        )
        if args.json:
            with open(args.json, "wb") as f:
                f.write(orjson.dumps({"memory_cap": r}, option=orjson.OPT_INDENT_2))
        return
    protocols = [p for p in args.protocols.split(",") if p]
    sizes = [int(s) for s in args.spans.split(",") if s]
    encoders = [e for e in args.encoders.split(",") if e]
    missing = [e for e in encoders if e not in ENCODERS]
    if missing:
        raise SystemExit(
            f"encoder(s) not available: {missing} (native: run "
            "`python setup.py build_ext --inplace` or `pip install -e .`)"
        )
    counts = {1: 40_000, 5: 20_000, 20: 6_000}
    if args.quick:
        counts = {1: 2_000, 5: 1_000, 20: 300}
    tune_gc()  # as in the reporter process
    workdir = tempfile.mkdtemp(prefix="swmp-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    sink = None
    port = 0
    try:
        # Encoders alternate within each (size, protocol): side by side under the same load.
        plan = [
            (protocol, spans, counts.get(spans, 5_000), encoder)
            for spans in sizes
            for protocol in protocols
            for encoder in (["-"] if protocol == "memory" else encoders)
        ]
        arenas = [prepare(f"{protocol}-{encoder}", spans, n, workdir) for protocol, spans, n, encoder in plan]
        if "grpc" in protocols:
            sink, port = start_sink(workdir)
        results = []
        for arena, (protocol, spans, n, encoder) in zip(arenas, plan, strict=True):
            results.append(one_run(arena, protocol, spans, n, port, encoder=encoder))
            r = results[-1]
            print(
                f"  {protocol:<7} {encoder:<6} {spans:>2} spans: {r['segments_per_s']:>10,.0f} seg/s",
                file=sys.stderr,
                flush=True,
            )
    finally:
        if sink is not None:
            sink.kill()
            sink.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(results, encoders)
    if args.json:
        meta = {
            "python": sys.version.split()[0],
            "quick": args.quick,
            "writers": WRITERS,
            "encoders": encoders,
            "load_average": os.getloadavg(),
        }
        with open(args.json, "wb") as f:
            f.write(orjson.dumps({"results": results, "meta": meta}, option=orjson.OPT_INDENT_2))


def print_table(results: list[dict[str, Any]], encoders: list[str]) -> None:
    """One row per protocol and size; per encoder seg/s (wall) and seg/cpu-s side by side."""
    rows: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for r in results:
        rows.setdefault((r["protocol"], r["spans_per_segment"]), {})[r["encoder"]] = r
    cols = ["-", *encoders]
    header = f"{'protocol':<9}{'spans':>6}{'segments':>10}{'rec bytes':>10}" + "".join(
        f"{(e if e != '-' else 'no encode') + ' seg/s':>22}{'seg/cpu-s':>11}" for e in cols
    )
    if "native" in encoders and "pure" in encoders:
        header += f"{'native/pure':>13}"
    print(header)
    print("-" * len(header))
    for (protocol, spans), by_encoder in rows.items():
        first = next(iter(by_encoder.values()))
        line = f"{protocol:<9}{spans:>6}{first['segments']:>10}{first['record_bytes']:>10}"
        for e in cols:
            r = by_encoder.get(e)
            line += (
                f"{r['segments_per_s']:>22,.0f}{r['segments_per_cpu_s']:>11,.0f}"
                if r
                else f"{'':>22}{'':>11}"
            )
        if "native" in by_encoder and "pure" in by_encoder:
            native, pure = by_encoder["native"], by_encoder["pure"]
            ratio = native["segments_per_cpu_s"] / max(1.0, pure["segments_per_cpu_s"])
            line += f"{ratio:>12.2f}x"
        print(line)


if __name__ == "__main__":
    main()
