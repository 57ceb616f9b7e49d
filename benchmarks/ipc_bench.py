"""Throughput of the shared-memory ring against other ways to move bytes between processes.

ONE writer process sends N pre-serialized records of a fixed size to ONE reader process,
for every implementation and record size in one run, so the numbers are side by side:

* ``swmp-ring``: ``ipc`` (this project): ``RingWriter.write`` per record; the reader
  drains in batches (``read`` + ``commit``) and naps 0.2 ms when it finds fewer than 512
  records, as a real reader polls, rather than spin on the writer's cache line. The writer
  never blocks: when the ring is full ``write`` returns False and the benchmark retries
  (counted as ``writer_retries``).
* ``mp.Queue``: ``multiprocessing.Queue.put`` / ``get`` (pickled, feeder thread).
* ``mp.Pipe``: ``Connection.send_bytes`` / ``recv_bytes`` (no pickling; a syscall each).
* ``faster-fifo``: ``faster_fifo.Queue.put`` / ``get_many`` (if the package is installed).

Timing runs on the reader's side: from the moment the writer is released until the N-th
record has arrived. The reader checks the count and the bytes it received (so a lossy or
truncating run cannot report a number). ``writer_ns`` is the writer's own wall time per
record, retries included.

    python benchmarks/ipc_bench.py                 # full run, prints a table
    python benchmarks/ipc_bench.py --json out.json # also writes {"results": [...]}
    python benchmarks/ipc_bench.py --quick         # smoke test (small N)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ipc import Arena, arena_path, arena_unlink

SIZES = (64, 300, 4096)
NAP_BELOW = 512  # the ring reader naps when a read returns fewer records than this
NAP_S = 0.0002
RTYPE = 1
CTX = mp.get_context("fork")


def payloads(size: int, count: int = 16) -> list[bytes]:
    """A few distinct records of exactly ``size`` bytes (pre-serialized, as a worker has)."""
    return [(f"{i:02d}".encode() * size)[:size] for i in range(count)]


def _expected_bytes(size: int, n: int) -> int:
    return size * n


# -- implementations ------------------------------------------------------------------------
# Each returns (records_per_s, extra fields). The writer runs in a forked child, the reader
# in this process; ``go`` releases the writer once both sides are ready.


def run_ring(size: int, n: int, capacity: int) -> tuple[float, dict[str, Any]]:
    directory = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    path = arena_path(os.getpid(), directory=directory, prefix="swmp-bench")
    arena_unlink(path)
    arena = Arena.create(path, slots=2, ring_capacity=capacity)
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    recs = payloads(size)
    pid = os.fork()
    if pid == 0:  # writer
        code = 0
        try:
            os.close(go_w)
            os.close(res_r)
            writer = arena.claim_slot()
            assert writer is not None and writer.slot == 0
            write = writer.write
            k = len(recs)
            os.read(go_r, 1)
            retries = 0
            c0, t0 = time.process_time(), time.perf_counter()
            for i in range(n):
                p = recs[i % k]
                while not write(RTYPE, p):
                    retries += 1
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            os.write(res_w, json.dumps({"writer_s": dt, "writer_cpu_s": cpu, "retries": retries}).encode())
        except BaseException:
            code = 1
        os._exit(code)
    os.close(go_r)
    os.close(res_w)
    try:
        reader = arena.reader(0)
        while arena.slot_owner(0) is None:  # wait until the writer holds its slot
            time.sleep(0.001)
        got = 0
        nbytes = 0
        last = b""
        read = reader.read
        commit = reader.commit
        os.write(go_w, b"g")
        c0, t0 = time.process_time(), time.perf_counter()
        while got < n:
            batch = read(4096)
            if batch:
                got += len(batch)
                for _, p in batch:
                    nbytes += len(p)
                last = batch[-1][1]
                commit()
            if len(batch) < NAP_BELOW:
                # Caught up: nap instead of spinning on the tail word, which sits on the
                # writer's cache line (every poll would cost the writer a cache miss).
                time.sleep(NAP_S)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        info = json.loads(os.read(res_r, 4096))
    finally:
        _reap(pid)
        arena.close()
        arena.unlink()
        for fd in (go_w, res_r):
            os.close(fd)
    _verify(got, nbytes, n, size, last, expected_last=recs[(n - 1) % len(recs)])
    return n / dt, _side_costs(info, cpu, n) | {"writer_retries": info["retries"]}


def run_queue(size: int, n: int) -> tuple[float, dict[str, Any]]:
    q: Any = CTX.Queue(maxsize=10000)

    def flush() -> None:  # the feeder thread must hand everything over before _exit
        q.close()
        q.join_thread()

    return _run_generic(size, n, put=q.put, get_batch=lambda: [q.get()], finish=flush)


def run_pipe(size: int, n: int) -> tuple[float, dict[str, Any]]:
    rx, tx = CTX.Pipe(duplex=False)
    return _run_generic(size, n, put=tx.send_bytes, get_batch=lambda: [rx.recv_bytes()])


def run_faster_fifo(size: int, n: int) -> tuple[float, dict[str, Any]] | None:
    try:
        import faster_fifo
    except ImportError:
        return None
    q = faster_fifo.Queue(max_size_bytes=64 * 1024 * 1024)

    def put(p: bytes) -> None:
        q.put(p, block=True, timeout=60)

    def get_batch() -> list[bytes]:
        return list(q.get_many(block=True, timeout=60, max_messages_to_get=4096))

    return _run_generic(size, n, put=put, get_batch=get_batch)


def _run_generic(
    size: int,
    n: int,
    put: Callable[[bytes], None],
    get_batch: Callable[[], list[bytes]],
    finish: Callable[[], None] | None = None,
) -> tuple[float, dict[str, Any]]:
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    recs = payloads(size)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(go_w)
            os.close(res_r)
            k = len(recs)
            os.read(go_r, 1)
            c0, t0 = time.process_time(), time.perf_counter()
            for i in range(n):
                put(recs[i % k])
            if finish is not None:
                finish()
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            os.write(res_w, json.dumps({"writer_s": dt, "writer_cpu_s": cpu}).encode())
        except BaseException:
            code = 1
        os._exit(code)
    os.close(go_r)
    os.close(res_w)
    try:
        got = 0
        nbytes = 0
        last = b""
        os.write(go_w, b"g")
        c0, t0 = time.process_time(), time.perf_counter()
        while got < n:
            batch = get_batch()
            got += len(batch)
            for p in batch:
                nbytes += len(p)
            if batch:
                last = batch[-1]
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        info = json.loads(os.read(res_r, 4096))
    finally:
        _reap(pid)
        for fd in (go_w, res_r):
            os.close(fd)
    _verify(got, nbytes, n, size, last, expected_last=recs[(n - 1) % len(recs)])
    return n / dt, _side_costs(info, cpu, n)


def _side_costs(info: dict[str, float], reader_cpu_s: float, n: int) -> dict[str, float]:
    """Per-record costs of each side. ``cpu_bound_records_per_s`` is what the pair would do
    if each had a core to itself: the busier side's CPU time per record, inverted. CPU time
    moves much less than wall time when other work shares the machine."""
    writer_cpu = info["writer_cpu_s"] / n * 1e9
    reader_cpu = reader_cpu_s / n * 1e9
    return {
        "writer_ns": info["writer_s"] / n * 1e9,
        "writer_cpu_ns": writer_cpu,
        "reader_cpu_ns": reader_cpu,
        "cpu_bound_records_per_s": 1e9 / max(writer_cpu, reader_cpu, 1e-9),
    }


def _verify(got: int, nbytes: int, n: int, size: int, last: bytes, *, expected_last: bytes) -> None:
    if got != n or nbytes != _expected_bytes(size, n) or last != expected_last:
        raise SystemExit(f"benchmark integrity check failed: {got}/{n} records, {nbytes} bytes")


def _reap(pid: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit(f"writer process failed with status {status}")
            return
        time.sleep(0.005)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise SystemExit("writer process did not finish")


# -- driver ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    ap.add_argument("--quick", action="store_true", help="small N: a smoke test, not a measurement")
    ap.add_argument("--records", type=int, default=0, help="records per ring run (default 400k, quick 5k)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds over all cells; the best is reported")
    ap.add_argument("--capacity", type=int, default=4 * 1024 * 1024, help="ring capacity in bytes")
    args = ap.parse_args(argv)

    n_ring = args.records or (5_000 if args.quick else 400_000)
    # The alternatives are an order of magnitude slower: fewer records keep the run short.
    n_other = max(1_000, n_ring // 4)
    repeat = 1 if args.quick else max(1, args.repeat)

    impls: list[tuple[str, Callable[[int], tuple[float, dict[str, Any]] | None], int]] = [
        ("swmp-ring", lambda size: run_ring(size, n_ring, args.capacity), n_ring),
        ("mp.Queue", lambda size: run_queue(size, n_other), n_other),
        ("mp.Pipe", lambda size: run_pipe(size, n_other), n_other),
        ("faster-fifo", lambda size: run_faster_fifo(size, n_other), n_other),
    ]
    # Repeats go round the whole matrix (not cell by cell), so a burst of load from other
    # processes on the machine does not spoil every try of one cell; the best try is kept.
    best: dict[tuple[int, str], tuple[float, dict[str, Any]]] = {}
    skipped: set[str] = set()
    for _ in range(repeat):
        for size in SIZES:
            for name, fn, _n in impls:
                if name in skipped:
                    continue
                out = fn(size)
                if out is None:
                    print(f"{name}: not installed, skipped", file=sys.stderr)
                    skipped.add(name)
                    continue
                if (size, name) not in best or out[0] > best[size, name][0]:
                    best[size, name] = out
    results: list[dict[str, Any]] = []
    for size in SIZES:
        for name, _fn, n in impls:
            if (size, name) not in best:
                continue
            rate, extra = best[size, name]
            results.append(
                {
                    "impl": name,
                    "record_bytes": size,
                    "records": n,
                    "records_per_s": round(rate),
                    "ns_per_record": round(1e9 / rate, 1),
                    **{k: round(v, 1) if isinstance(v, float) else v for k, v in extra.items()},
                }
            )

    _print_table(results)
    if args.json:
        doc = {
            "results": results,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "quick": args.quick,
            "repeat": repeat,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


def _print_table(results: list[dict[str, Any]]) -> None:
    queue = {r["record_bytes"]: r["records_per_s"] for r in results if r["impl"] == "mp.Queue"}
    head = (
        f"{'impl':<12} {'bytes':>6} {'records/s':>12} {'ns/record':>10} {'x Queue':>8}"
        f" {'writer cpu ns':>14} {'reader cpu ns':>14} {'cpu-bound rec/s':>16}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        ratio = r["records_per_s"] / queue[r["record_bytes"]] if r["record_bytes"] in queue else float("nan")
        print(
            f"{r['impl']:<12} {r['record_bytes']:>6} {r['records_per_s']:>12,} {r['ns_per_record']:>10.1f}"
            f" {ratio:>8.1f} {r['writer_cpu_ns']:>14.1f} {r['reader_cpu_ns']:>14.1f}"
            f" {round(r['cpu_bound_records_per_s']):>16,}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
