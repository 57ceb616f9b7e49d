"""What giving a ring's read pages back to the system costs, and what it saves.

A writer process writes N records of one size into its ring of a real arena on tmpfs (as a
worker does), in bursts of 128 KiB with a 2 ms pause after each, so the ring never fills;
this process reads them as the reporter does, sleeping ``--read-ms`` milliseconds whenever
it finds the ring empty. Three variants, alternated in each round, so the figures are side
by side:

* ``resident``: page returning turned off (the ring stays resident, as before it existed);
* ``shipped``: the rings as they ship: the writer frees the read pages and brings in the
  next stretch every 128 KiB, whatever its rate (it is per byte written);
* ``quiet-only``: the first version's rule, kept here to compare: only a writer that took
  a second or more over a stretch frees, so this busy writer (a stretch in a few
  milliseconds) frees nothing;
* ``first-lap``: as shipped, but only the first lap of a new ring (one capacity's worth of
  records), whose every page is touched for the first time.

Columns: the writer's CPU per record (its process time around the writes only), the
reader's CPU per record, and the bytes of the ring still allocated in the arena file when
the writer has finished and the reader has read everything. The median of the rounds.

    python benchmarks/ring_pages_bench.py --rounds 5 --json ring_pages.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ipc  # noqa: E402
from ipc import _layout as L  # noqa: E402

WRITER = """
import sys, time
sys.path.insert(0, sys.argv[1])
import ipc, ipc.ring_pages

def quiet_only(free):
    # The first version's rule: a stretch counts only when it took a second or more.
    marks = {}
    def call(self, tail, head):
        now = time.monotonic()
        start = marks.setdefault(id(self), (tail, now))
        if tail - start[0] < self.stretch:
            return None
        marks[id(self)] = (tail, now)
        return free(self, tail, head) if now - start[1] >= 1.0 else None
    return call
if sys.argv[4] == "resident":
    ipc.ring_pages.MIN_CAPACITY = 1 << 62  # page returning off for this process's rings
if sys.argv[4] == "quiet-only":
    ipc.ring_pages.PageReturner.__call__ = quiet_only(ipc.ring_pages.PageReturner.__call__)
arena = ipc.Arena.open(sys.argv[2])
w = arena.claim_slot()
size, n = int(sys.argv[3]), int(sys.argv[5])
payload = b"r" * size
write = w.write
burst = max(1, (128 * 1024) // (size + 8))  # then a pause, so the ring never fills
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()
cpu = 0.0
failed = sent = 0
clock = time.process_time
while sent < n:
    k = min(burst, n - sent)
    t0 = clock()
    for _ in range(k):
        if not write(7, payload):
            failed += 1
    cpu += clock() - t0
    sent += k
    time.sleep(0.002)
print(cpu, failed, flush=True)
"""

VARIANTS = ("resident", "shipped", "quiet-only", "first-lap")


def one_run(variant: str, size: int, n: int, *, capacity: int, read_ms: float, tmp: Path) -> dict[str, Any]:
    path = tmp / f"{variant}-{size}.arena"
    arena = ipc.Arena.create(str(path), slots=1, ring_capacity=capacity)
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(ROOT), str(path), str(size), variant, str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        reader = arena.reader(0)
        got = 0
        cpu0 = time.process_time()
        child.stdin.write("go\n")
        child.stdin.flush()
        while (got < n and child.poll() is None) or reader.pending():
            records = reader.read()
            got += len(records)
            reader.commit()
            if not records:
                time.sleep(read_ms / 1000)  # the reporter's tick: it reads, then sleeps
        reader_cpu = time.process_time() - cpu0
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0, child.returncode
        writer_cpu, failed = out.split()
        assert int(failed) == 0 and got == n, (failed, got, n)  # paced: the ring never fills
        allocated = os.stat(path).st_blocks * 512 - (L.SLOTS_OFFSET + L.CONTROL_SIZE)
        return {
            "variant": variant,
            "size": size,
            "records": n,
            "writer_ns": float(writer_cpu) / n * 1e9,
            "reader_ns": reader_cpu / n * 1e9,
            "allocated_kib": max(allocated, 0) / 1024,
        }
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        arena.close()
        path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="300,800,2000", help="record payload sizes in bytes")
    ap.add_argument("--bytes", type=int, default=64 << 20, help="bytes written per run (16 laps of 4 MiB)")
    ap.add_argument("--capacity", type=int, default=4 << 20)
    ap.add_argument("--read-ms", type=float, default=1.0, help="the reader's sleep when the ring is empty")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    tmp = Path(tempfile.mkdtemp(prefix="swmp-pages-bench-", dir=base))
    runs: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            for size in sizes:
                order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
                for variant in order:
                    written = args.capacity if variant == "first-lap" else args.bytes
                    run = one_run(
                        variant,
                        size,
                        written // (size + 8),
                        capacity=args.capacity,
                        read_ms=args.read_ms,
                        tmp=tmp,
                    )
                    run["round"] = r
                    runs.append(run)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for size in sizes:
        for variant in VARIANTS:
            mine = [x for x in runs if x["size"] == size and x["variant"] == variant]
            rows.append(
                {
                    "variant": variant,
                    "size": size,
                    "writer_ns": statistics.median(x["writer_ns"] for x in mine),
                    "reader_ns": statistics.median(x["reader_ns"] for x in mine),
                    "allocated_kib": statistics.median(x["allocated_kib"] for x in mine),
                }
            )
    print(f"{'size':>6} {'variant':<13} {'writer ns/rec':>13} {'reader ns/rec':>13} {'allocated KiB':>13}")
    for row in rows:
        print(
            f"{row['size']:>6} {row['variant']:<13} {row['writer_ns']:>13.0f} {row['reader_ns']:>13.0f} "
            f"{row['allocated_kib']:>13.0f}"
        )
    if args.json:
        meta = {"python": platform.python_version(), "kernel": platform.release(), "args": vars(args)}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
