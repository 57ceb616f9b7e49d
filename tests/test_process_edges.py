"""Edge cases of an application's processes under ``swmp run``: what they leave behind.

Real programs run under ``swmp run`` in child processes and report to the in-process test
collector over gRPC.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipc.wakeup import Doorbell, DoorbellListener, create_fifo
from tests.collector import Collector
from tests.test_agent_launcher import base_env

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(180)

# Three rounds of ``with Pool(2) as pool``: the block's end is ``terminate()``, which SIGTERMs
# the pool processes (no atexit, so no clean leave). Then one more process that starts
# reporting and leaves cleanly. The program lists the arena files while it still runs.
POOL_ROUNDS = textwrap.dedent(
    """
    import json, multiprocessing, os, sys

    import swmp


    def traced(i):
        with swmp.entry_span(f"task-{i}"):
            pass
        return os.getpid()


    def arenas(directory):
        return sorted(
            name
            for sub in os.listdir(directory)
            for name in os.listdir(os.path.join(directory, sub))
            if name.endswith((".arena", ".wake"))
        )


    if __name__ == "__main__":
        method, out = sys.argv[1:3]
        ctx = multiprocessing.get_context(method)
        traced(-1)
        pids = []
        for _ in range(3):
            with ctx.Pool(2) as pool:
                pids += pool.map(traced, range(4), chunksize=1)
        last = ctx.Process(target=traced, args=(99,))
        last.start()
        last.join()
        left = arenas(os.environ["SW_AGENT_ARENA_DIR"])
        with open(out, "w") as f:
            json.dump({"main": os.getpid(), "pids": pids, "left": left}, f)
    """
)


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector(enable_http=False) as c:
        yield c


def _env(tmp_path: Path, collector: Collector, **extra: str) -> dict[str, str]:
    return base_env(tmp_path, collector, SW_AGENT_NAME="edges", SW_AGENT_INSTANCE_NAME="edges", **extra)


def _swmp_run(*command: str) -> list[str]:
    return [sys.executable, "-m", "swmp.cli", "run", "--", *command]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_thread_mode_pool_processes_ended_by_terminate_leave_no_arena_behind(
    tmp_path: Path, collector: Collector, method: str
) -> None:
    """Thread mode: every pool process that reported has a private arena (4 MiB of ring in
    ``/dev/shm``); one SIGTERMed by ``Pool.terminate()`` cannot remove it. Before, each such
    file stayed until the next application started: a program opening a pool per batch
    filled ``/dev/shm`` (one file per pool process per batch). Now the next process that
    starts reporting (or the program's own reporter thread, on its tick) adopts those of
    dead processes: delivers what they held, then removes them; the live ones stay."""
    script = tmp_path / "pool_rounds.py"
    script.write_text(POOL_ROUNDS)
    out = tmp_path / "out.json"
    env = _env(tmp_path, collector, SW_AGENT_REPORTER_PROCESS="false")
    done = subprocess.run(
        _swmp_run(sys.executable, str(script), method, str(out)),
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads(out.read_text())
    main = info["main"]
    assert len(set(info["pids"])) >= 2  # the pools did run in processes of their own
    # Left while the program runs: its name registry and its own private arena (and doorbell),
    # nothing of a pool process.
    left = info["left"]
    assert [n for n in left if f"-{main}-" not in n] == [], left
    assert len([n for n in left if n.endswith(".arena")]) == 2, left


# A program that, once the agent holds its descriptors (the arena's; the doorbell, opened by
# a burst of records while the reporter sleeps), closes every descriptor it did not open
# itself, as daemon libraries do (python-daemon's DaemonContext, also without detaching, as
# under systemd), opens its own files (they take the freed numbers), and records bursts
# again while writing to its first file. Optional third argument: how many files it opens
# (4); at the end it checks that each descriptor still names its file.
CLOSES_ITS_FDS = textwrap.dedent(
    """
    import os, sys, time

    import swmp


    def burst(op, n):
        for _ in range(n):
            with swmp.entry_span(op):
                swmp.tag("payload", "x" * 400)


    out, n = sys.argv[1], int(sys.argv[2])
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    time.sleep(1.0)  # the reporter goes to sleep on its doorbell
    burst("before", n)
    time.sleep(1.0)
    os.closerange(3, 65536)
    files = [open(os.path.join(out, f"app{k}.log"), "wb", buffering=0) for k in range(count)]
    for i in range(5):
        time.sleep(0.5)
        burst(f"after-{i}", n)
        files[0].write(b"line %d\\n" % i)
    for k, f in enumerate(files):
        held, named = os.fstat(f.fileno()), os.stat(f.name)
        if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
            sys.exit(f"app{k}.log: its descriptor names another file now")
        f.close()
    """
)


@pytest.mark.parametrize(
    ("ring", "burst"),
    [
        # A quarter of the ring in a burst wakes the sleeping reporter: the doorbell's byte.
        (65536, 60),
        # A ring reserves its pages' room a stretch at a time, ahead of the writer: past the
        # first lap (4 MiB), each burst needs more.
        (4 << 20, 400),
    ],
    ids=["doorbell", "room"],
)
def test_a_program_that_closes_every_descriptor_keeps_its_files_intact(
    tmp_path: Path, collector: Collector, ring: int, burst: int
) -> None:
    """Before, the agent kept using the descriptor numbers it had opened, which by then
    named the program's own files: the doorbell wrote its wake-up bytes (``\\x01``) into
    one, the ring's room reservation (``posix_fallocate``) grew another by megabytes of
    zeros. Now each use checks that the number still names the agent's file."""
    script = tmp_path / "closes_fds.py"
    script.write_text(CLOSES_ITS_FDS)
    env = _env(tmp_path, collector, SW_AGENT_RING_SIZE=str(ring))
    done = subprocess.run(
        _swmp_run(sys.executable, str(script), str(tmp_path), str(burst)),
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    contents = [(tmp_path / f"app{k}.log").read_bytes() for k in range(4)]
    assert contents == [b"".join(b"line %d\n" % i for i in range(5)), b"", b"", b""]
    # The records made after the descriptors were closed are delivered all the same.
    assert collector.wait_for(lambda: len(collector.segments) >= 6 * burst, 30)


def test_a_doorbell_whose_descriptor_was_closed_never_writes_into_its_successor(tmp_path: Path) -> None:
    arena_path = str(tmp_path / "x.arena")
    create_fifo(arena_path)
    listener = DoorbellListener(arena_path)
    bell = Doorbell(arena_path)
    try:
        bell()
        assert listener.wait(0)
        fd = bell._fd
        os.close(fd)  # the application closes it...
        other = os.open(tmp_path / "app.log", os.O_WRONLY | os.O_CREAT, 0o600)
        assert other == fd  # ...and the number names one of its files now
        bell()
        assert os.path.getsize(tmp_path / "app.log") == 0
        assert listener.wait(0)  # rung through a new descriptor
        bell.close()
        os.fstat(other)  # still the application's, still open
        os.close(other)
    finally:
        bell.close()
        listener.close()


# A hand-written prefork program: it forks its workers, then reaps every child it has until
# there is none left (``os.wait()`` until ECHILD), the usual way to wait for "all of them".
WAITS_FOR_ALL_CHILDREN = textwrap.dedent(
    """
    import os

    import swmp

    for i in range(3):
        if os.fork() == 0:
            with swmp.entry_span(f"worker-{i}"):
                pass
            os._exit(0)
    reaped = 0
    while True:
        try:
            os.wait()
        except ChildProcessError:
            break
        reaped += 1
    print("reaped", reaped, flush=True)
    """
)


def test_a_program_that_waits_for_all_its_children_is_not_held_by_the_reporter(
    tmp_path: Path, collector: Collector
) -> None:
    """Before, the reporter's supervisor was a child of the program for the program's whole
    life: ``os.wait()`` never ran out of children, and the program hung for good. Now the
    supervisor is detached (as when a worker starts it): the program reaps its 3 workers and
    exits, and their segments are delivered."""
    script = tmp_path / "waits.py"
    script.write_text(WAITS_FOR_ALL_CHILDREN)
    done = subprocess.run(
        _swmp_run(sys.executable, str(script)),
        env=_env(tmp_path, collector),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,  # a hang: subprocess.TimeoutExpired
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "reaped 3"
    assert collector.wait_for(lambda: len(collector.segments) >= 3, 30)


# The program names its agent processes as tests and benchmarks find them (through its arena),
# traces one span, then ends: by returning, or by waiting for the test's SIGKILL.
NAMES_ITS_REPORTER = textwrap.dedent(
    """
    import json, os, sys

    import swmp
    from tests.agent_procs import owner_arena, wait_agent_pids

    found = wait_agent_pids(owner_arena(os.getpid(), os.environ["SW_AGENT_ARENA_DIR"]), 60)
    with swmp.entry_span("named"):
        pass
    parents = {pid: int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
               for pid in found.pids()}
    print(json.dumps({"pid": os.getpid(), "reporter": found.reporter, "supervisor": found.supervisor,
                      "parents": parents, "sid": os.getsid(0), "sup_sid": os.getsid(found.supervisor)}),
          flush=True)
    if sys.argv[1] == "wait":
        sys.stdin.read()  # until killed
    """
)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not reaped yet
    except OSError:
        return True


@pytest.mark.parametrize("end", ["exit", "sigkill"])
def test_the_detached_supervisor_and_reporter_leave_with_the_program(
    tmp_path: Path, collector: Collector, end: str
) -> None:
    """The supervisor is no child of the program (own session), yet it and the reporter end
    with it: after a normal exit, and after a SIGKILL (noticed through a pidfd on the owner,
    no parent-death signal); the segment is delivered and the arena removed."""
    from tests.servers import wait_until

    script = tmp_path / "named.py"
    script.write_text(NAMES_ITS_REPORTER)
    proc = subprocess.Popen(
        _swmp_run(sys.executable, str(script), "wait" if end == "sigkill" else "exit"),
        env=_env(tmp_path, collector),
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        named = json.loads(proc.stdout.readline())
        assert named["reporter"] and named["supervisor"]
        assert named["parents"][str(named["reporter"])] == named["supervisor"]
        assert named["parents"][str(named["supervisor"])] != named["pid"]  # detached
        assert named["sup_sid"] != named["sid"]
        assert collector.wait_for(lambda: len(collector.segments) >= 1, 30)
        if end == "sigkill":
            proc.kill()
        assert proc.wait(60) == (-9 if end == "sigkill" else 0)
        agent = (named["reporter"], named["supervisor"])
        wait_until(lambda: all(_gone(pid) for pid in agent), 60, "the reporter and supervisor to leave")
        wait_until(lambda: not list((tmp_path / "shm").glob("*/*.arena")), 30, "the arena to be removed")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
