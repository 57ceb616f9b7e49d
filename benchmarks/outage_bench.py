"""Backend outage under steady load, with the reporter's DEFAULT settings (issue 16).

A stand-in application master (``tests.test_reporter_helpers.Owner``) spawns the real
reporter with the settings the agent builds from its configuration defaults (only the
service name and the backend address set); paced writer processes write segments into their
rings at a fixed rate; the test collector (``tests.collector``, a real gRPC server in its own
process) is stopped for the outage and started again on the same port. Printed: segments
written, delivered, duplicated, lost, ring overflows, how long after the backend's return
the first segment arrived, and what the reporter spooled and replayed.

    python3 benchmarks/outage_bench.py --rate 1000 --before 10 --outage 600 --after 20

The CI-sized version of this scenario is ``tests/test_delivery_outage.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ipc import Arena
from reporter_proc import records as R
from reporter_proc.process import settings_to_json
from swmp.config import load
from tests.collector import CollectorProcess, free_port
from tests.test_reporter_helpers import Owner, segment, status_doc

SERVICE = "outage-svc"


@dataclass
class OutageResult:
    written: int = 0
    delivered: int = 0  # distinct segment ids the collectors received
    duplicates: int = 0
    lost: int = 0
    ring_overflows: int = 0  # writes refused because a ring was full (a real agent drops them)
    resume_s: float = -1.0  # backend ready -> first segment received by it
    spooled: int = 0
    replayed: int = 0
    dropped: dict[str, int] | None = None
    catch_up_s: float = -1.0  # backend ready -> every written segment delivered
    max_pending_bytes_seen: int = 0


class DumpReader:
    """Trace ids from a collector's dump file, read incrementally (files grow large)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.ids: list[str] = []

    def poll(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return 0
        end = data.rfind(b"\n") + 1  # a line being written waits for the next poll
        before = len(self.ids)
        for line in data[:end].splitlines():
            row = json.loads(line)
            if row["kind"] == "segment":
                self.ids.append(row["message"]["traceId"])
        self.offset += end
        return len(self.ids) - before


def paced_writer(arena_path: str, tag: str, rate: float, duration_s: float, *, out: str, spans: int) -> int:
    """Fork a process writing ``rate`` segments/s for ``duration_s``; it reports to ``out``."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        arena = Arena.open(arena_path)
        writer = arena.claim_slot()
        assert writer is not None
        start = time.monotonic()
        written = overflow = 0
        while True:
            elapsed = time.monotonic() - start
            due = min(int(elapsed * rate), int(duration_s * rate))
            while written + overflow < due:
                payload = segment(f"{tag}-{written + overflow}", service=SERVICE, spans=spans)
                if writer.write(R.SEGMENT, payload):
                    written += 1
                else:
                    overflow += 1  # what a worker does with a full ring: drop and count
            if elapsed >= duration_s:
                break
            time.sleep(0.01)
        Path(out).write_text(json.dumps({"written": written, "overflow": overflow}))
        code = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def run_outage(
    workdir: Path,
    *,
    rate: float,
    before_s: float,
    outage_s: float,
    after_s: float,
    writers: int = 2,
    spans: int = 3,
    deadline_s: float = 120.0,
    ring_bytes: int = 0,
    env: dict[str, str] | None = None,
    log: Any = print,
) -> OutageResult:
    """The whole scenario; every process it starts is gone when it returns or raises."""
    port = free_port()
    collectors: list[CollectorProcess] = []
    readers: list[DumpReader] = []

    def start_collector(name: str) -> CollectorProcess:
        d = workdir / name
        d.mkdir()
        c = CollectorProcess(str(d), ["--grpc-port", str(port), "--http-port", "-1"]).start()
        collectors.append(c)
        readers.append(DumpReader(c.dump_file))
        return c

    # Defaults, except who we are and where the backend is.
    environ = {"SW_AGENT_NAME": SERVICE, "SW_AGENT_COLLECTOR_BACKEND_SERVICES": f"127.0.0.1:{port}"}
    config = load({**environ, **(env or {})})
    settings = config.to_reporter_settings()
    old_state = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(workdir / "state")  # the default spool lands in here
    if ring_bytes:
        os.environ["SWMP_TEST_RING_BYTES"] = str(ring_bytes)
    owner: Owner | None = None
    pids: list[int] = []
    result = OutageResult()
    try:
        start_collector("before")
        owner = Owner(str(workdir), settings_to_json(settings))
        owner.reporter_pid()
        duration = before_s + outage_s + after_s
        outs = [str(workdir / f"writer-{i}.json") for i in range(writers)]
        pids = [
            paced_writer(owner.arena_path, f"w{i}", rate / writers, duration, out=outs[i], spans=spans)
            for i in range(writers)
        ]
        t0 = time.monotonic()

        def sample() -> None:
            assert owner is not None
            pending = status_doc(owner.arena).get("pending_bytes", 0)
            result.max_pending_bytes_seen = max(result.max_pending_bytes_seen, pending)

        while time.monotonic() - t0 < before_s:
            sample()
            time.sleep(0.2)
        collectors[0].stop()  # the backend goes away: its port is closed for the outage
        log(f"outage: backend down at t={time.monotonic() - t0:.1f}s")
        while time.monotonic() - t0 < before_s + outage_s:
            sample()
            time.sleep(0.2)
        back = start_collector("after")
        ready = time.monotonic()
        log(f"backend back at t={ready - t0:.1f}s")
        while readers[-1].poll() == 0:
            if time.monotonic() - ready > deadline_s:
                raise AssertionError("no segment reached the backend after its return")
            time.sleep(0.02)
        result.resume_s = time.monotonic() - ready
        log(f"first segment {result.resume_s:.2f}s after the backend's return")
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, "a writer failed"
        pids = []
        for out in outs:
            info = json.loads(Path(out).read_text())
            result.written += info["written"]
            result.ring_overflows += info["overflow"]
        expected = {f"w{i}-{n}" for i in range(writers) for n in range(int(duration * rate / writers))}
        seen: set[str] = set()
        while True:
            for r in readers:
                r.poll()
            seen = set(readers[0].ids) | set(readers[-1].ids)
            if expected <= seen or time.monotonic() - ready > deadline_s:
                break
            sample()
            time.sleep(0.5)
        if expected <= seen:
            result.catch_up_s = time.monotonic() - ready
        total = len(readers[0].ids) + len(readers[-1].ids)
        result.delivered = len(seen & expected)
        result.duplicates = total - len(seen)
        result.lost = len(expected - seen)
        doc = status_doc(owner.arena)
        result.spooled = doc.get("spool", {}).get("spooled", 0)
        result.replayed = doc.get("spool", {}).get("replayed", 0)
        result.dropped = {k: v for k, v in doc.get("dropped", {}).items() if v}
        del back
        return result
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        if owner is not None:
            owner.cleanup()
        for c in collectors:
            c.stop()
        os.environ.pop("SWMP_TEST_RING_BYTES", None)
        if old_state is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = old_state


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000.0, help="segments per second (all writers)")
    ap.add_argument("--before", type=float, default=10.0, help="seconds of load before the outage")
    ap.add_argument("--outage", type=float, default=600.0, help="seconds the backend is down")
    ap.add_argument("--after", type=float, default=20.0, help="seconds of load after its return")
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--spans", type=int, default=3, help="spans per segment")
    ap.add_argument("--deadline", type=float, default=900.0, help="seconds allowed to catch up")
    ap.add_argument("--ring-bytes", type=int, default=0, help="ring per writer; 0 = the agent's default")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="swmp-outage-") as tmp:
        res = run_outage(
            Path(tmp),
            rate=args.rate,
            before_s=args.before,
            outage_s=args.outage,
            after_s=args.after,
            writers=args.writers,
            spans=args.spans,
            deadline_s=args.deadline,
            ring_bytes=args.ring_bytes or load({}).agent_ring_size,
        )
    rows = asdict(res)
    width = max(len(k) for k in rows)
    print(f"{'outage':<{width}}  {args.outage:.0f} s at {args.rate:.0f} segments/s")
    for k, v in rows.items():
        print(f"{k:<{width}}  {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if res.lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
