"""Shared helpers for the reporter tests (no tests in here).

Writers are real processes (``os.fork`` from the test) that claim a ring slot, write their
records and exit or wait to be released; reporters in other processes are observed through
the memory sender's JSON-lines file and the arena's status block.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from ipc import Arena
from reporter_proc import records as R

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``cond`` until it returns something truthy; fail the test after ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def segment(trace: str, service: str = "svc", instance: str = "inst", spans: int = 1) -> bytes:
    now = int(time.time() * 1000)
    span_list = [
        R.span(
            i,
            i - 1,
            now,
            now + 3,
            f"GET /item/{i}",
            peer="db:5432" if i else "",
            span_type=R.SPAN_TYPE_ENTRY if i == 0 else R.SPAN_TYPE_EXIT,
            layer=R.LAYER_HTTP,
            component=7000,
            tags=["http.method", "GET", "url", f"http://example/item/{i}", "status_code", "200"],
        )
        for i in range(spans)
    ]
    return R.encode(R.segment(trace, f"seg-{trace}", service=service, instance=instance, spans=span_list))


def log_record(text: str, service: str = "svc", instance: str = "inst") -> bytes:
    return R.encode(R.log(int(time.time() * 1000), service, instance, text, endpoint="/ep"))


def meter_record(name: str, value: float = 1.0, service: str = "svc", instance: str = "inst") -> bytes:
    meters = [R.single_meter(name, [], value)]
    return R.encode(R.meter_report(int(time.time() * 1000), service, instance, meters))


def worker_start(pid: int, slot: int, service: str = "svc", instance: str = "") -> bytes:
    name = instance or f"inst-{slot}"
    start = R.worker_start(pid, slot, service=service, instance=name, properties={"extra": "yes"})
    return R.encode(start)


class Writer:
    """A forked process holding one ring slot; writes what it is given."""

    def __init__(self, pid: int, ready_fd: int, release_fd: int) -> None:
        self.pid = pid
        self._ready = ready_fd
        self._release = release_fd
        self.slot = -1

    def wait_written(self, timeout: float = 20.0) -> int:
        """Wait until the child wrote everything; returns its slot."""
        buf = b""
        end = time.monotonic() + timeout
        while not buf.endswith(b"\n"):
            if time.monotonic() > end:
                raise AssertionError("writer did not finish")
            try:
                chunk = os.read(self._ready, 64)
            except BlockingIOError:
                time.sleep(0.01)
                continue
            if not chunk:
                raise AssertionError("writer died before writing everything")
            buf += chunk
        self.slot = int(buf.split()[1])
        return self.slot

    def release(self) -> int:
        """Let the child exit; returns its exit status."""
        with contextlib.suppress(OSError):
            os.write(self._release, b"x")
        _, status = os.waitpid(self.pid, 0)
        for fd in (self._ready, self._release):
            with contextlib.suppress(OSError):
                os.close(fd)
        return os.waitstatus_to_exitcode(status)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def spawn_writer(
    arena_path: str,
    records: Iterable[tuple[int, bytes]],
    *,
    hold: bool = False,
    announce: bool = False,
    service: str = "svc",
) -> Writer:
    """Fork a writer. ``announce`` writes a WORKER_START first; ``hold`` keeps the slot until
    :meth:`Writer.release`. The child retries while its ring is full (never drops)."""
    items = list(records)
    ready_r, ready_w = os.pipe()
    release_r, release_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(ready_r)
            os.close(release_w)
            arena = Arena.open(arena_path)
            writer = arena.claim_slot()
            assert writer is not None
            if announce:
                items.insert(0, (R.WORKER_START, worker_start(os.getpid(), writer.slot, service)))
            deadline = time.monotonic() + 30
            for rtype, payload in items:
                while not writer.write(rtype, payload):
                    if time.monotonic() > deadline:
                        os._exit(2)
                    time.sleep(0.002)
            os.write(ready_w, f"ok {writer.slot}\n".encode())
            if hold:
                os.read(release_r, 1)
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(release_r)
    os.set_blocking(ready_r, False)
    return Writer(pid, ready_r, release_w)


def write_all(arena_path: str, records: Iterable[tuple[int, bytes]]) -> int:
    """Write records from a short-lived writer process; returns the slot it used."""
    w = spawn_writer(arena_path, records)
    slot = w.wait_written()
    assert w.release() == 0
    return slot


def delivered(path: str) -> dict[str, list[Any]]:
    """Everything a MemorySender with ``path`` accepted, per kind."""
    from reporter_proc.senders.memory import read_memory_file

    out: dict[str, list[Any]] = {}
    for line in read_memory_file(path):
        out.setdefault(line["kind"], []).extend(line["records"])
    return out


def trace_ids(path: str) -> list[str]:
    return [rec[0] for rec in delivered(path).get("segment", [])]


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def status_doc(arena: Arena) -> dict[str, Any]:
    doc = arena.status.snapshot().document
    return orjson.loads(doc) if doc else {}


OWNER_SCRIPT = r"""
import json, os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from ipc import Arena
from reporter_proc.process import spawn_reporter, settings_from_json

arena_path, settings_json, ready_file, mode = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
if "ignore" in mode:
    # What a child of the uWSGI master inherits.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1, signal.SIGTERM])
if "log" in mode:  # the reporter's INFO lines (it inherits the owner's logging) to a file
    import logging
    logging.basicConfig(level=logging.INFO, filename=ready_file + ".log", format="%(levelname)s %(message)s")
ring = int(os.environ.get("SWMP_TEST_RING_BYTES", 256 * 1024))  # benchmarks/outage_bench.py
arena = Arena.create(arena_path, slots=4, ring_capacity=ring)
settings = settings_from_json(settings_json)
pids = []
if "detach" in mode:
    # A "worker" spawns the reporter detached, then dies: the reporter must not care.
    r, w = os.pipe()
    worker = os.fork()
    if worker == 0:
        pid = spawn_reporter(arena_path, settings, os.getppid(), detach=True)
        os.write(w, str(pid).encode())
        os._exit(0)
    os.close(w)
    pids.append(int(os.read(r, 64)))
    os.waitpid(worker, 0)
else:
    pids.append(spawn_reporter(arena_path, settings, os.getpid()))
    if "twice" in mode:
        pids.append(spawn_reporter(arena_path, settings, os.getpid()))
with open(ready_file + ".tmp", "w") as f:
    json.dump({"owner": os.getpid(), "spawned": pids}, f)
os.replace(ready_file + ".tmp", ready_file)
while True:
    try:
        os.waitpid(-1, 0)  # reap like an application master does
    except ChildProcessError:
        time.sleep(0.05)
"""


def become_subreaper() -> None:
    """Adopt orphans (a killed owner's supervisor and reporter) so cleanup can reap them;
    otherwise they end as zombies of a PID 1 that may never reap. For the rest of the
    session every orphan comes to pytest: tests/conftest.py reaps them (tests/zombies.py)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


class Owner:
    """An application-master stand-in in a subprocess: creates the arena, spawns the reporter."""

    def __init__(self, tmp: str, settings_json: str, mode: str = "", extra: list[str] | None = None) -> None:
        become_subreaper()
        self.seen: set[int] = set()
        self.arena_path = os.path.join(tmp, "test.arena")
        self.ready = os.path.join(tmp, "owner.json")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                OWNER_SCRIPT,
                ROOT,
                self.arena_path,
                settings_json,
                self.ready,
                mode or "plain",
            ]
            + (extra or []),
        )
        info = wait_for(self._info, 20, "the owner to spawn its reporter")
        self.spawned: list[int] = info["spawned"]
        self.arena = Arena.open(self.arena_path)

    def _info(self) -> dict[str, Any] | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"owner exited with {self.proc.returncode}")
        try:
            with open(self.ready, "rb") as f:
                return orjson.loads(f.read())  # type: ignore[no-any-return]
        except (OSError, orjson.JSONDecodeError):
            return None

    def reporter_pid(self, timeout: float = 20.0, not_pid: int = 0) -> int:
        def current() -> int:
            pid = self.arena.reporter_pid()
            snap = self.arena.status.snapshot()
            if pid and pid != not_pid and snap.reporter_pid == pid and snap.document:
                return pid
            return 0

        pid = int(wait_for(current, timeout, "a running reporter"))
        self.seen.add(pid)
        return pid

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(10)

    def cleanup(self) -> None:
        """Kill everything this owner started (even on failure)."""
        pids = set(self.spawned) | self.seen
        with contextlib.suppress(Exception):
            pid = self.arena.reporter_pid()
            if pid:
                pids.add(pid)
        self.kill()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        # Supervisors first (their reporters are adopted by us when they go), then reporters.
        for pid in [*self.spawned, *sorted(pids - set(self.spawned))]:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        with contextlib.suppress(Exception):
            self.arena.close()
