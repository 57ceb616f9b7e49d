"""gRPC segment delivery: one collectInSync call per batch vs one long-lived collect stream.

Both modes of ``reporter_proc.senders.grpc_sender.GrpcSender`` send the same pre-encoded
segments (3 spans each) to a collector running in its own process (``tests.collector``,
which decodes every message with the generated protobuf classes, as a backend would).
Measured per segment: CPU of the sending process (all its threads, gRPC core included) and
CPU of the receiving process, plus wall time. One run, both modes side by side, alternated.

    python benchmarks/grpc_segment_modes.py [--quick] [--json PATH] [--segments N] [--batch B]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.encode_bench import make_segment
from reporter_proc.senders.grpc_sender import GrpcSender
from reporter_proc.settings import ReporterSettings
from tests.collector import CollectorProcess


async def _send_all(sender: GrpcSender, batches: list[list[list[Any]]]) -> None:
    await sender.start()
    try:
        for batch in batches:
            await sender.send_segments(batch)
    finally:
        await sender.close()  # a stream is completed (and acknowledged) here


def measure(stream: bool, batches: list[list[list[Any]]], total: int, workdir: Path) -> dict[str, float]:
    summary_file = workdir / f"summary-{stream}.json"
    # No dump file: writing JSON lines would dwarf what is measured; counts come at exit.
    with CollectorProcess(
        str(workdir), ["--summary-file", str(summary_file), "--count-only"], dump=False
    ) as proc:
        server = psutil.Process(proc.proc.pid if proc.proc else 0)
        sender = GrpcSender(
            ReporterSettings(backends=(proc.grpc_address,), send_timeout_s=30.0),
            segment_stream=stream,
            stream_max_age_s=3600.0,
        )
        s0 = server.cpu_times()
        c0 = time.process_time()
        w0 = time.perf_counter()
        # Returns once the collector handled everything: every collectInSync is answered
        # after its segments were decoded, and close() waits for the stream's answer.
        asyncio.run(_send_all(sender, batches))
        wall = time.perf_counter() - w0
        client = time.process_time() - c0
        s1 = server.cpu_times()
    received = json.loads(summary_file.read_text())["segment"]
    assert received == total, f"collector got {received} of {total} segments"
    server_cpu = (s1.user + s1.system) - (s0.user + s0.system)
    return {
        "client_us": client / total * 1e6,
        "server_us": server_cpu / total * 1e6,
        "wall_us": wall / total * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--segments", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.quick:
        args.segments, args.rounds = 400, 1
    recs = [make_segment(i, 3) for i in range(args.segments)]
    batches = [recs[i : i + args.batch] for i in range(0, len(recs), args.batch)]

    results: dict[str, list[dict[str, float]]] = {"collectInSync": [], "collect-stream": []}
    with tempfile.TemporaryDirectory(prefix="swmp-grpc-bench-") as tmp:
        for _ in range(args.rounds):  # alternate so machine noise hits both modes alike
            results["collectInSync"].append(measure(False, batches, args.segments, Path(tmp)))
            results["collect-stream"].append(measure(True, batches, args.segments, Path(tmp)))

    print(
        f"Python {platform.python_version()}; {args.segments} segments x 3 spans, batches of {args.batch}; "
        f"best of {args.rounds} rounds; microseconds per segment"
    )
    print(f"{'mode':<15} | {'client CPU':>10} | {'server CPU':>10} | {'wall':>8}")
    summary = {}
    for mode, rows in results.items():
        best = {k: min(r[k] for r in rows) for k in rows[0]}
        summary[mode] = best
        print(
            f"{mode:<15} | {best['client_us']:>10.1f} | {best['server_us']:>10.1f} | {best['wall_us']:>8.1f}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "benchmark": "grpc_segment_modes",
                    "python": platform.python_version(),
                    "segments": args.segments,
                    "batch": args.batch,
                    "rounds": args.rounds,
                    "quick": args.quick,
                    "best": summary,
                    "all": results,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
