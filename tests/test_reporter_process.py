"""The reporter as real processes: spawn, supervision, signals, owner death, thread mode.

An "owner" subprocess plays the application master (creates the arena, calls
``spawn_reporter``); writers are forked from the test; deliveries are observed through the
memory sender's JSON-lines file (``protocol="memory"``, ``memory_path``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ipc import Arena
from reporter_proc import records as R
from reporter_proc.process import settings_to_json
from reporter_proc.settings import ReporterSettings
from tests.test_reporter_helpers import (
    ROOT,
    Owner,
    pid_alive,
    segment,
    spawn_writer,
    status_doc,
    trace_ids,
    wait_for,
    write_all,
)


def settings_json(tmp: str, **kw: Any) -> str:
    base: dict[str, Any] = dict(
        protocol="memory",
        memory_path=os.path.join(tmp, "delivered.jsonl"),
        service="proc-test",
        flush_interval_s=0.02,
        poll_interval_s=0.02,
        status_interval_s=0.05,
        shutdown_deadline_s=3.0,
        retry_backoff_base_s=0.01,
        retry_backoff_max_s=0.05,
        restart_backoff_base_s=0.2,
        keepalive_interval_s=0.2,
    )
    base.update(kw)
    return settings_to_json(ReporterSettings(**base))


def segs(tag: str, n: int) -> list[tuple[int, bytes]]:
    return [(R.SEGMENT, segment(f"{tag}-{i}")) for i in range(n)]


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def reporters_for(arena_path: str) -> list[int]:
    """Live processes titled as a reporter of this arena."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            line = cmdline(int(name))
            if line.startswith("swmp-reporter") and arena_path in line and pid_alive(int(name)):
                out.append(int(name))
    return out


@pytest.fixture
def owners(tmp_path: Any) -> Iterator[Any]:
    made: list[Owner] = []

    def make(mode: str = "", **kw: Any) -> Owner:
        o = Owner(str(tmp_path), settings_json(str(tmp_path), **kw), mode)
        made.append(o)
        return o

    yield make
    for o in made:
        o.cleanup()


def test_spawned_reporter_delivers_records_of_several_writers_once(owners: Any, tmp_path: Any) -> None:
    o = owners()
    rep = o.reporter_pid()
    sup = o.spawned[0]
    assert cmdline(sup).startswith("swmp-supervisor [proc-test] arena=")
    assert cmdline(rep).startswith("swmp-reporter [proc-test] arena=")
    with open(f"/proc/{rep}/comm") as f:
        assert f.read().strip() == "swmp-reporter"
    writers = [spawn_writer(o.arena_path, segs(f"w{i}", 300)) for i in range(3)]
    for w in writers:
        w.wait_written()
        assert w.release() == 0
    path = str(tmp_path / "delivered.jsonl")
    wait_for(lambda: len(trace_ids(path)) >= 900, 20, "delivery")
    assert sorted(trace_ids(path)) == sorted(f"w{i}-{j}" for i in range(3) for j in range(300))
    doc = status_doc(o.arena)
    assert doc["pid"] == rep and doc["mode"] == "process" and doc["restarts"] == 0


def test_sigterm_flushes_what_is_in_the_rings_and_exits(owners: Any, tmp_path: Any) -> None:
    # Batches that would never flush on their own: only the shutdown path sends them.
    o = owners(flush_interval_s=600.0, batch_max_records=100_000, send_early_records=100_000)
    rep = o.reporter_pid()
    sup = o.spawned[0]
    write_all(o.arena_path, segs("t", 500))
    wait_for(lambda: status_doc(o.arena).get("read", {}).get("segment") == 500, 10, "records read")
    path = str(tmp_path / "delivered.jsonl")
    assert trace_ids(path) == []
    os.kill(sup, signal.SIGTERM)  # forwarded to the reporter
    wait_for(lambda: not pid_alive(rep) and not pid_alive(sup), 10, "reporter and supervisor exit")
    assert sorted(trace_ids(path)) == sorted(f"t-{i}" for i in range(500))
    assert o.arena.reporter_pid() is None
    assert os.path.exists(o.arena_path)  # the owner lives: its arena stays


def test_owner_death_flushes_exits_and_removes_the_arena(owners: Any, tmp_path: Any) -> None:
    o = owners(flush_interval_s=600.0, batch_max_records=100_000, send_early_records=100_000)
    rep = o.reporter_pid()
    sup = o.spawned[0]
    write_all(o.arena_path, segs("o", 200))
    wait_for(lambda: status_doc(o.arena).get("read", {}).get("segment") == 200, 10, "records read")
    o.proc.send_signal(signal.SIGKILL)
    o.proc.wait(5)
    # "Within about a second" in practice; the bound here only keeps a broken build from hanging.
    wait_for(lambda: not pid_alive(rep) and not pid_alive(sup), 10, "reporter exit after owner death")
    path = str(tmp_path / "delivered.jsonl")
    assert sorted(trace_ids(path)) == sorted(f"o-{i}" for i in range(200))
    assert not os.path.exists(o.arena_path)
    assert not os.path.exists(o.arena_path + ".wake")


def test_a_killed_reporter_is_restarted_and_loses_nothing(owners: Any, tmp_path: Any) -> None:
    o = owners(flush_interval_s=600.0, batch_max_records=100_000, send_early_records=100_000)
    first = o.reporter_pid()
    write_all(o.arena_path, segs("before", 100))
    wait_for(lambda: status_doc(o.arena).get("read", {}).get("segment") == 100, 10, "records read")
    os.kill(first, signal.SIGKILL)  # read, never sent, never committed
    wait_for(lambda: not pid_alive(first), 5)
    write_all(o.arena_path, segs("gap", 50))  # while no reporter runs
    second = o.reporter_pid(not_pid=first)
    wait_for(lambda: status_doc(o.arena).get("restarts") == 1 and status_doc(o.arena)["pid"] == second, 10)
    write_all(o.arena_path, segs("after", 20))
    # Counts continue across restarts (the arena's counter table): the first reporter's 100,
    # plus the second one's 170 (the 100 it re-reads, never committed, included).
    wait_for(lambda: status_doc(o.arena).get("read", {}).get("segment") == 270, 10, "re-read")
    os.kill(o.spawned[0], signal.SIGTERM)
    wait_for(lambda: not pid_alive(second), 10)
    ids = trace_ids(str(tmp_path / "delivered.jsonl"))
    expected = [f"before-{i}" for i in range(100)] + [f"gap-{i}" for i in range(50)]
    expected += [f"after-{i}" for i in range(20)]
    assert sorted(ids) == sorted(expected)


def test_only_one_reporter_per_arena_when_spawned_twice(owners: Any, tmp_path: Any) -> None:
    o = owners("twice")
    assert len(o.spawned) == 2
    rep = o.reporter_pid()
    # The second supervisor's reporter found the role taken and exited quietly; so did it.
    wait_for(lambda: sum(pid_alive(p) for p in o.spawned) == 1, 10, "one supervisor left")
    wait_for(lambda: reporters_for(o.arena_path) == [rep], 10, "one reporter left")
    write_all(o.arena_path, segs("one", 100))
    path = str(tmp_path / "delivered.jsonl")
    wait_for(lambda: len(trace_ids(path)) >= 100, 10)
    assert sorted(trace_ids(path)) == sorted(f"one-{i}" for i in range(100))


def _sig_mask(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    raise AssertionError(f"no {field} line")


def _sig_ignored(pid: int, sig: int) -> bool:
    return bool(_sig_mask(pid, "SigIgn") & (1 << (sig - 1)))


def test_signals_ignored_by_the_spawner_do_not_stop_a_sigterm_shutdown(owners: Any, tmp_path: Any) -> None:
    o = owners("ignore", flush_interval_s=600.0, batch_max_records=100_000)
    assert _sig_ignored(o.proc.pid, signal.SIGTERM)  # the uWSGI-like situation is real
    assert _sig_mask(o.proc.pid, "SigBlk") & (1 << (signal.SIGTERM - 1))  # and worse: blocked
    rep = o.reporter_pid()
    sup = o.spawned[0]
    for pid in (rep, sup):
        assert not _sig_ignored(pid, signal.SIGTERM)
        assert not _sig_ignored(pid, signal.SIGINT)
        assert _sig_mask(pid, "SigBlk") == 0
    write_all(o.arena_path, segs("ign", 50))
    wait_for(lambda: status_doc(o.arena).get("read", {}).get("segment") == 50, 10)
    os.kill(rep, signal.SIGTERM)  # straight to the reporter this time
    wait_for(lambda: not pid_alive(rep) and not pid_alive(sup), 10, "exit on SIGTERM")
    assert sorted(trace_ids(str(tmp_path / "delivered.jsonl"))) == sorted(f"ign-{i}" for i in range(50))


def test_detached_reporter_outlives_its_spawner_and_follows_the_owner(owners: Any, tmp_path: Any) -> None:
    o = owners("detach")
    sup = o.spawned[0]
    rep = o.reporter_pid()
    assert os.getsid(sup) != os.getsid(o.proc.pid)  # its own session
    write_all(o.arena_path, segs("d", 30))
    path = str(tmp_path / "delivered.jsonl")
    wait_for(lambda: len(trace_ids(path)) >= 30, 10)
    o.proc.send_signal(signal.SIGKILL)  # no PDEATHSIG here: the pidfd watch must notice
    o.proc.wait(5)
    wait_for(lambda: not pid_alive(rep) and not pid_alive(sup), 10, "exit after owner death")
    assert not os.path.exists(o.arena_path)


def test_exec_entry_runs_a_reporter(tmp_path: Any) -> None:
    arena = Arena.create(str(tmp_path / "exec.arena"), slots=2, ring_capacity=64 * 1024)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reporter_proc",
            "--arena",
            arena.path,
            "--owner-pid",
            str(os.getpid()),
            "--settings",
            settings_json(str(tmp_path)),
            "--no-supervise",
        ],
        cwd=ROOT,
    )
    try:
        wait_for(lambda: arena.reporter_pid() == proc.pid, 20, "exec'd reporter")
        write_all(arena.path, segs("x", 40))
        path = str(tmp_path / "delivered.jsonl")
        wait_for(lambda: len(trace_ids(path)) >= 40, 10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert sorted(trace_ids(path)) == sorted(f"x-{i}" for i in range(40))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        arena.close()


THREAD_APP = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
from ipc import Arena
from reporter_proc import records as R
from reporter_proc.process import settings_from_json, start_reporter_thread
import orjson

arena = Arena.create(sys.argv[2], slots=2, ring_capacity=64 * 1024)
handle = start_reporter_thread(arena.path, settings_from_json(sys.argv[3]), arena=arena)
writer = arena.claim_slot()  # the application itself writes (no fork in thread mode)
for i in range(int(sys.argv[4])):
    span = [0, -1, 1, 2, "op", "", 0, 3, 7000, False, False, [], [], []]
    rec = [f"th-{i}", f"seg-{i}", "svc", "inst", False, [span]]
    while not writer.write(R.SEGMENT, orjson.dumps(rec)):
        time.sleep(0.001)
assert handle.reporter is not None
# Exit without stopping anything: the atexit hook must flush within the deadline.
"""


def test_thread_mode_flushes_at_interpreter_exit(tmp_path: Any) -> None:
    path = str(tmp_path / "delivered.jsonl")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            THREAD_APP,
            ROOT,
            str(tmp_path / "thread.arena"),
            settings_json(str(tmp_path), flush_interval_s=600.0, batch_max_records=100_000),
            "300",
        ],
        timeout=60,
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert sorted(trace_ids(path)) == sorted(f"th-{i}" for i in range(300))
