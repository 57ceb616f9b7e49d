"""Applications that daemonize (double fork, ``setsid()``) after the agent started.

The process the agent starts in exits at once, and its reporter with it. Before, a daemon
kept writing into an arena nobody drained any more (all but its first second lost) and,
under Gunicorn's ``--daemon``, counted as the owner's helper: nothing at all was reported.
Now the daemon starts the agent anew (``swmp._daemonized``, ``swmp.agent``). Real forks,
real Gunicorn under ``swmp run``, the real reporter, the in-test collector.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from swmp import _daemonized
from swmp.ops.locate import registry_path
from tests.agent_procs import agent_processes, owner_arena
from tests.celery_support import REPO_ROOT, celery_env, new_queue, publish, worker_command
from tests.collector import Collector, free_port
from tests.daemons import ServerInfo
from tests.servers import (
    SWMP_RUN,
    agent_env,
    belongs,
    gunicorn_command,
    port_open,
    request,
    uwsgi_command,
    wait_until,
)
from tests.test_reporter_helpers import pid_alive

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector(enable_http=False) as c:
        yield c


# -- the decision, in real forks -------------------------------------------------------------
def _in_child(body: str, timeout: float = 20.0, wrap: tuple[str, ...] = ()) -> dict[str, object]:
    """Run ``body`` (which sets ``out``, a dict) in a fresh interpreter (started by the command
    ``wrap`` if given); its ``out``."""
    program = (
        textwrap.dedent(
            """
        import json, os, sys, time
        from swmp import _daemonized
        out = {}
        """
        )
        + textwrap.dedent(body)
        + "\nprint(json.dumps(out))\n"
    )
    done = subprocess.run(
        [*wrap, sys.executable, "-c", program], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


# The grandchild reports through a pipe to the program (the owner), which waits for it.
DOUBLE_FORK = """
owner, owner_sid = os.getpid(), {owner_sid}
r, w = os.pipe()
if os.fork() == 0:                    # the middle process: a session of its own, then exits
    os.setsid()
    if os.fork():
        {middle_exit}
    seen = _daemonized.made_a_daemon(owner, owner_sid, middle_forked_by={forked_by}, owner_reported=False)
    os.write(w, json.dumps(seen).encode())
    os._exit(0)
os.close(w)
with os.fdopen(r) as f:
    out["daemon"] = json.loads(f.read())
"""


def _double_fork(
    middle_exit: str = "os._exit(0)", forked_by: str = "owner", owner_sid: str = "os.getsid(0)"
) -> str:
    return DOUBLE_FORK.format(middle_exit=middle_exit, forked_by=forked_by, owner_sid=owner_sid)


def test_the_grandchild_of_a_double_fork_is_a_daemon() -> None:
    assert _in_child(_double_fork()) == {"daemon": True}


def test_an_owner_in_session_zero_is_followed_into_its_daemon() -> None:
    """Session 0 is real: every process whose ancestors never called setsid() is in it (the
    jobs of a CI runner that init started, a container's processes). CI's run of this file
    had all its daemons missed, 0 having meant "unknown". (The owner here pretends to be in
    session 0: a process cannot join it.)"""
    assert _in_child(_double_fork(owner_sid="0")) == {"daemon": True}


# A new PID namespace's processes see the session they inherited as 0 (its leader is outside).
IN_SESSION_ZERO = ("unshare", "--pid", "--fork", "--mount-proc")


def test_an_owner_in_session_zero_for_real() -> None:
    probe = subprocess.run(
        [*IN_SESSION_ZERO, sys.executable, "-c", "import os; print(os.getsid(0))"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0 or probe.stdout.strip() != "0":
        pytest.skip(f"no PID namespace here (unshare: {probe.stderr.strip()[-200:]})")
    assert _in_child("assert os.getsid(0) == 0\n" + _double_fork(), wrap=IN_SESSION_ZERO) == {"daemon": True}


def test_a_grandchild_whose_middle_process_exited_before_its_hook_ran_is_a_daemon() -> None:
    """The middle process gone (a zombie, or reaped) before the grandchild looks."""
    body = _double_fork().replace(
        "    seen = ",
        "    while os.getppid() == os.getsid(0):\n        time.sleep(0.002)\n    seen = ",
    )
    assert _in_child(body) == {"daemon": True}


def test_a_child_of_a_session_leader_that_lives_on_is_no_daemon() -> None:
    """A server that called setsid() itself and forks its workers: the wait runs out."""
    body = "_daemonized.LEADER_EXIT_WAIT_S = 0.2\n" + _double_fork("os.waitpid(-1, 0); os._exit(0)")
    assert _in_child(body) == {"daemon": False}


def test_a_job_that_a_worker_detaches_is_no_daemon() -> None:
    """The same double fork made by a worker (not the owner): a job, which stays a helper."""
    assert _in_child(_double_fork(forked_by="owner + 1")) == {"daemon": False}


# An owner that reported before it forked: its grandchild is a daemon only once the owner is
# gone. The program forks the owner, then either reaps it before the grandchild looks
# (``gone``) or keeps it alive until the grandchild has answered.
REPORTING_OWNER = """
r, w = os.pipe()
go_r, go_w = os.pipe()
done_r, done_w = os.pipe()
owner = os.fork()
if owner == 0:
    owner, owner_sid = os.getpid(), os.getsid(0)
    if os.fork() == 0:
        os.setsid()
        if os.fork():
            os._exit(0)
        os.read(go_r, 1)              # the program has dealt with the owner
        seen = _daemonized.made_a_daemon(owner, owner_sid, middle_forked_by=owner, owner_reported=True)
        os.write(w, json.dumps(seen).encode())
        os._exit(0)
    {owner_then}
os.close(w)
{gone}
os.write(go_w, b"x")
with os.fdopen(r) as f:
    out["daemon"] = json.loads(f.read())
os.write(done_w, b"x")
os.waitpid(owner, 0) if {keep} else None
"""


def test_a_reporting_owner_makes_a_daemon_only_once_it_has_exited() -> None:
    gone = REPORTING_OWNER.format(owner_then="os._exit(0)", gone="os.waitpid(owner, 0)", keep=False)
    assert _in_child(gone) == {"daemon": True}
    lives = REPORTING_OWNER.format(
        owner_then="os.close(w); os.read(done_r, 1); os._exit(0)", gone="", keep=True
    )
    assert _in_child(lives) == {"daemon": False}


# uWSGI's ``--daemonize2``: the owner forks twice in C and ``_exit()``s, the daemon forks the
# workers, and no Python hook saw the daemon being made. A worker asks whether the owner is
# gone while the owner may not have run again yet (a loaded machine). The program forks the
# owner; the owner forks the daemon's line (``setsid()`` in the middle, as uWSGI does, or not
# with ``setsid=False``); the worker says it is about to ask, the owner then lives on for
# ``owner_lives`` seconds (or until the worker has answered: None) and exits.
LEFT_BEHIND = """
r, w = os.pipe()
asking_r, asking_w = os.pipe()
done_r, done_w = os.pipe()
_daemonized.LEADER_EXIT_WAIT_S = 1.0
owner = os.fork()
if owner == 0:
    owner, owner_sid = os.getpid(), os.getsid(0)
    if os.fork() == 0:
        if {setsid}:
            os.setsid()
        if os.fork():
            os._exit(0)
        os.write(asking_w, b"x")
        t0 = time.monotonic()
        gone = _daemonized.owner_left_behind(owner, owner_sid)
        os.write(w, json.dumps([gone, round(time.monotonic() - t0, 3)]).encode())
        os.write(done_w, b"x")
        os._exit(0)
    os.read(asking_r, 1)
    if {owner_lives} is None:
        os.read(done_r, 1)
    else:
        time.sleep({owner_lives})
    os._exit(0)
os.close(w)
with os.fdopen(r) as f:
    out["gone"], out["waited"] = json.loads(f.read())
os.waitpid(owner, 0)
"""


def test_a_daemonized_masters_worker_waits_for_the_owners_exit() -> None:
    """Seen by the worker before the owner has exited: with ``process_exited`` alone the worker
    took the daemon for the owner's helper and reported nothing (the uWSGI ``--daemonize2``
    tests lost a worker's records in 3 of 54 runs on a loaded machine)."""
    out = _in_child(LEFT_BEHIND.format(setsid=True, owner_lives=0.1))
    assert out["gone"] is True and out["waited"] < 0.9, out


def test_an_owner_that_lives_on_is_not_left_behind() -> None:
    """In another session, the wait runs out; in the owner's own, nothing is waited for."""
    out = _in_child(LEFT_BEHIND.format(setsid=True, owner_lives=None))
    assert out["gone"] is False and out["waited"] >= 0.9, out
    out = _in_child(LEFT_BEHIND.format(setsid=False, owner_lives=None))
    assert out["gone"] is False and out["waited"] < 0.5, out


def test_forks_in_the_applications_session_are_no_daemons() -> None:
    body = """
    r, w = os.pipe()
    if os.fork() == 0:
        owner = os.getppid()
        seen = [
            _daemonized.made_a_daemon(owner, os.getsid(0), middle_forked_by=owner, owner_reported=False),
            _daemonized.made_a_daemon(
                owner, _daemonized.UNKNOWN_SESSION, middle_forked_by=owner, owner_reported=False
            ),
        ]
        os.write(w, json.dumps(seen).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out["daemon"] = json.loads(f.read())
    os.wait()
    """
    assert _in_child(body) == {"daemon": [False, False]}


def test_without_pidfd_the_proc_state_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exited process (a zombie here) counts as gone; a live one does not, once waited for."""
    monkeypatch.delattr(os, "pidfd_open")
    child = subprocess.Popen([sys.executable, "-S", "-c", "pass"])  # no fork of this process
    try:
        wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, 10, "a zombie")
        assert _daemonized._exits_within(child.pid, 0.0)
        assert not _daemonized._exits_within(os.getpid(), 0.05)
    finally:
        child.wait()
    assert _daemonized._exits_within(child.pid, 0.0)  # reaped: no such process


def _swmp_run_returns(command: list[str], env: dict[str, str]) -> None:
    """``swmp run -- command``, which daemonizes: it returns once the first process exits, as
    neither the daemon nor any reporter keeps the streams it was started with (captured here)."""
    done = subprocess.run(
        [*SWMP_RUN, *command], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]


# -- a daemon program under swmp run ---------------------------------------------------------
# What a daemon program does once daemonized (``info``, ``go``, ``started_as`` set): records,
# writes both pids into ``info``, waits for the test's word (the ``go`` file, once the first
# process's reporter has left) and records again.
DAEMON_WORK = """
for i in range(5):
    with swmp.entry_span(f"early-{i}"):
        pass
with open(info + ".tmp", "w") as f:
    f.write(f"{started_as} {os.getpid()}")
os.rename(info + ".tmp", info)
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.02)
for i in range(5):
    with swmp.entry_span(f"late-{i}"):
        pass
"""
DAEMON_RECORDS = Counter({f"{w}-{i}": 1 for w in ("early", "late") for i in range(5)})

# The classic recipe, then DAEMON_WORK.
DAEMON = (
    textwrap.dedent(
        """
        import os, sys, time

        import swmp

        info, go = sys.argv[1:3]
        started_as = os.getpid()
        if os.fork():
            os._exit(0)
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)  # a daemon lets go of the streams it had
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        """
    )
    + DAEMON_WORK
)


def _marked(marker: str) -> list[psutil.Process]:
    """Live processes of the test's own arena directory ``marker`` (command line or environment)."""
    return [
        p for p in psutil.process_iter() if p.pid != os.getpid() and belongs(p, marker) and pid_alive(p.pid)
    ]


def _kill_marked(marker: str) -> None:
    for p in _marked(marker):
        with contextlib.suppress(psutil.Error):
            p.kill()


def check_a_daemon_program(
    tmp_path: Path,
    collector: Collector,
    env: dict[str, str],
    program: str,
    *args: str,
    expected: Counter[str] = DAEMON_RECORDS,
) -> None:
    """``swmp run`` of ``program`` (which daemonizes and does DAEMON_WORK; its arguments: the
    info and go files, then ``args``): the command returns, the daemon records before and long
    after the first process's reporter left, every record arrives once, nothing is left."""
    script = tmp_path / "daemon.py"
    script.write_text(program)
    info, go = tmp_path / "info", tmp_path / "go"
    arena_dir = env["SW_AGENT_ARENA_DIR"]
    daemon = 0
    try:
        _swmp_run_returns([sys.executable, str(script), str(info), str(go), *args], env)
        wait_until(info.exists, 30, "the daemon's info file")
        started_as, daemon = (int(x) for x in info.read_text().split())
        own_arena = owner_arena(daemon, arena_dir)
        if env["SW_AGENT_REPORTER_PROCESS"] == "true":
            # The first process's reporter has drained and left with it; the daemon has its own.
            wait_until(
                lambda: not os.path.exists(owner_arena(started_as, arena_dir)), 30, "the first arena gone"
            )
            wait_until(lambda: len(agent_processes(own_arena)) == 2, 30, "the daemon's own reporter")
        go.write_text("")
        wait_until(lambda: not pid_alive(daemon), 30, "the daemon's exit")
        n = sum(expected.values())
        assert collector.wait_for(lambda: len(collector.segments) >= n, timeout=30), collector.summary()
        wait_until(lambda: not list(Path(arena_dir).glob("*/*.arena")), 30, "no arena left")
        assert agent_processes(own_arena) == []
        assert Counter(s.spans[0].operationName for s in collector.segments) == expected
    finally:
        if daemon and pid_alive(daemon):
            os.kill(daemon, signal.SIGKILL)
        _kill_marked(arena_dir)


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_double_forking_program_reports_before_and_long_after_its_first_process_exits(
    tmp_path: Path, collector: Collector, mode: str
) -> None:
    env = agent_env(
        tmp_path, collector.grpc_address, service="dmn", instance="dmn", reporter_process=mode == "process"
    )
    check_a_daemon_program(tmp_path, collector, env, DAEMON)
    assert {s.serviceInstance for s in collector.segments} == {"dmn-w0"}


# A reporting program that detaches a job with the same double fork and lives on: the job is
# no daemon (no arena or reporter of its own); it stays the program's inert helper.
DETACHES_A_JOB = textwrap.dedent(
    """
    import json, os, sys, time

    import swmp
    from swmp import agent, lifecycle

    info, go = sys.argv[1:3]
    with swmp.entry_span("before"):
        pass
    if os.fork() == 0:
        os.setsid()
        if os.fork():
            os._exit(0)
        with swmp.entry_span("job"):
            pass
        run = agent.current()
        facts = {"owner": run.owner_pid if run else 0, "role": lifecycle.role(), "pid": os.getpid()}
        with open(info + ".tmp", "w") as f:
            json.dump(facts, f)
        os.rename(info + ".tmp", info)
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.02)
        os._exit(0)
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)
    with swmp.entry_span("after"):
        pass
    """
)


@pytest.mark.parametrize("forks", ["double", "single"])
def test_a_job_detached_by_a_reporting_program_stays_its_helper(
    tmp_path: Path, collector: Collector, forks: str
) -> None:
    """With one fork (``setsid()`` in the child, no second fork) the job is a daemon only once
    the program has exited (tests/test_daemonized_single_fork.py): here it lives on."""
    script = tmp_path / "detaches.py"
    single = DETACHES_A_JOB.replace("    if os.fork():\n        os._exit(0)\n", "", 1)
    assert single != DETACHES_A_JOB
    script.write_text(single if forks == "single" else DETACHES_A_JOB)
    info, go = tmp_path / "info", tmp_path / "go"
    env = agent_env(tmp_path, collector.grpc_address, service="job", instance="job")
    arena_dir = env["SW_AGENT_ARENA_DIR"]
    proc = subprocess.Popen(
        [*SWMP_RUN, sys.executable, str(script), str(info), str(go)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    job = 0
    try:
        wait_until(info.exists, 30, "the job's info file")
        facts = json.loads(info.read_text())
        job = facts["pid"]
        assert facts["owner"] == proc.pid and facts["role"] == "helper", facts
        assert len(list(Path(arena_dir).glob("*/*.arena"))) == 1  # the program's only
        go.write_text("")
        assert proc.wait(60) == 0
        assert collector.wait_for(lambda: len(collector.segments) >= 2, timeout=30), collector.summary()
        wait_until(lambda: not list(Path(arena_dir).glob("*/*.arena")), 30, "no arena left")
        assert sorted(s.spans[0].operationName for s in collector.segments) == ["after", "before"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if job and pid_alive(job):
            os.kill(job, signal.SIGKILL)
        _kill_marked(arena_dir)


# -- servers' own daemon modes --------------------------------------------------------------
@contextlib.contextmanager
def _daemon_server(command: list[str], env: dict[str, str], pidfile: Path) -> Iterator[int]:
    """``swmp run -- command`` (which daemonizes): returns once the command has, the daemon's
    pid from its pid file; on the way out, the daemon and everything of the test's arena
    directory are killed by pid if still there."""
    arena_dir = env["SW_AGENT_ARENA_DIR"]
    master = 0
    try:
        _swmp_run_returns(command, env)
        # uWSGI's --daemonize2 writes the file first in the process the command started
        # (gone by now: the command returned), and again in the daemon.
        wait_until(lambda: _pid_in(pidfile) and pid_alive(_pid_in(pidfile)), 30, "a live pid in the pid file")
        master = _pid_in(pidfile)
        yield master
    finally:
        if master and pid_alive(master):
            with contextlib.suppress(psutil.Error):
                for p in psutil.Process(master).children(recursive=True):
                    p.kill()
            os.kill(master, signal.SIGKILL)
        _kill_marked(arena_dir)
        deadline = time.monotonic() + 10
        while master and pid_alive(master) and time.monotonic() < deadline:
            time.sleep(0.02)


def _pid_in(pidfile: Path) -> int:
    """The pid the file names (0: no file, or not a pid yet)."""
    try:
        text = pidfile.read_text().strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def _stopped_clean(master: int, sig: int, arena_dir: str) -> None:
    """Stop the daemon with ``sig``: its reporter drains and leaves, no arena file is left."""
    os.kill(master, sig)
    wait_until(lambda: not pid_alive(master), 60, "the daemon's exit")
    wait_until(lambda: not list(Path(arena_dir).glob("*/*.arena")), 30, "no arena left")
    wait_until(lambda: not _marked(arena_dir), 30, "no agent process left")


def _serves_and_reports(
    port: int, collector: Collector, service: str, env: dict[str, str], *, master: int, mode: str
) -> None:
    """The daemonized server answers 40 requests, each reported once by its workers; in
    process mode the daemon has a supervisor and a reporter of its own."""
    wait_until(lambda: port_open(port), 30, f"port {port}")
    assert all(request(port, f"/cpu?i={i}").status == 200 for i in range(40))
    _check_web_segments(collector, 40, service)
    _every_worker_answers(port, 2)
    if mode == "process":
        arena = owner_arena(master, env["SW_AGENT_ARENA_DIR"])
        assert len(agent_processes(arena)) == 2  # the daemon's own supervisor and reporter


def _every_worker_answers(port: int, workers: int) -> None:
    """Each worker has finished starting (the agent with it) before the test stops the server:
    requests that hold a worker for a moment, ``workers`` at a time, until as many workers
    answered. (A stop that reaches a worker still starting: test_lifecycle's interrupt test.)"""
    seen: set[int] = set()

    def all_answered() -> bool:
        with ThreadPoolExecutor(workers) as pool:
            answers = list(pool.map(lambda _: request(port, "/sleep?s=0.3"), range(workers)))
        seen.update(r.worker_pid for r in answers if r.status == 200)
        return len(seen) >= workers

    wait_until(all_answered, 60, f"{workers} workers answering")


def _check_web_segments(collector: Collector, n: int, service: str) -> None:
    assert collector.wait_for(lambda: len(collector.segments) >= n, timeout=30), collector.summary()
    segments = list(collector.segments)
    assert len({s.traceSegmentId for s in segments}) == len(segments) == n
    assert {s.spans[0].operationName for s in segments} == {"/cpu"}
    instances = {s.serviceInstance for s in segments}
    assert instances and all(i.startswith(f"{service}-w") for i in instances), instances


@pytest.mark.servers
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_gunicorn_daemon_reports_from_its_workers(tmp_path: Path, collector: Collector, mode: str) -> None:
    """``swmp run -- gunicorn --daemon``: the command returns, the daemonized master's workers
    report (each its own instance), and stopping the master by its pid file leaves no agent
    process and no arena behind."""
    port = free_port()
    pidfile = tmp_path / "gunicorn.pid"
    env = agent_env(tmp_path, collector.grpc_address, service="gd", reporter_process=mode == "process")
    extra = ["--daemon", "--pid", str(pidfile), "--log-file", str(tmp_path / "gunicorn.log")]
    with _daemon_server(gunicorn_command(port, workers=2, extra=extra), env, pidfile) as master:
        _serves_and_reports(port, collector, "gd", env, master=master, mode=mode)
        _stopped_clean(master, signal.SIGTERM, env["SW_AGENT_ARENA_DIR"])


@pytest.mark.servers
def test_uwsgi_daemonize_reports_from_its_workers(tmp_path: Path, collector: Collector) -> None:
    """uWSGI daemonizes in C before Python starts: the agent starts in the daemon itself."""
    port = free_port()
    pidfile = tmp_path / "uwsgi.pid"
    env = agent_env(tmp_path, collector.grpc_address, service="ud")
    extra = ["--daemonize", str(tmp_path / "uwsgi.log"), "--pidfile", str(pidfile)]
    with _daemon_server(uwsgi_command(port, workers=2, extra=extra), env, pidfile) as master:
        _serves_and_reports(port, collector, "ud", env, master=master, mode="process")
        _stopped_clean(master, signal.SIGINT, env["SW_AGENT_ARENA_DIR"])


@pytest.mark.servers
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_uwsgi_daemonize2_reports_from_its_workers(tmp_path: Path, collector: Collector, mode: str) -> None:
    """``--daemonize2`` loads the application (and so starts the agent) first, then
    daemonizes in C (no Python hook runs) and the daemon forks the workers: they find the
    process the agent started in gone and join their daemonized master's arena."""
    port = free_port()
    pidfile = tmp_path / "uwsgi.pid"
    env = agent_env(tmp_path, collector.grpc_address, service="ud2", reporter_process=mode == "process")
    extra = ["--daemonize2", str(tmp_path / "uwsgi.log"), "--pidfile", str(pidfile)]
    with _daemon_server(uwsgi_command(port, workers=2, extra=extra), env, pidfile) as master:
        _serves_and_reports(port, collector, "ud2", env, master=master, mode=mode)
        if mode == "process":
            _stopped_clean(master, signal.SIGINT, env["SW_AGENT_ARENA_DIR"])
        else:
            # uWSGI's master runs no Python exit hook, so in thread mode the name registry its
            # workers made stays (as under any uWSGI in thread mode; the next start's stale
            # clean-up removes it); the workers' own arenas go.
            registry = Path(registry_path(owner_arena(master, env["SW_AGENT_ARENA_DIR"])))
            assert registry.exists()
            os.kill(master, signal.SIGINT)
            wait_until(lambda: not pid_alive(master), 60, "the daemon's exit")
            wait_until(lambda: not _marked(env["SW_AGENT_ARENA_DIR"]), 30, "no agent process left")
            assert set(Path(env["SW_AGENT_ARENA_DIR"]).glob("*/*.arena")) == {registry}


@pytest.mark.servers
def test_celery_detach_reports_from_its_pool(
    tmp_path: Path, collector: Collector, redis_server: ServerInfo
) -> None:
    """``celery worker --detach`` daemonizes and then execs a new worker: its pool children
    report each task once, continuing the publisher's trace."""
    broker = f"redis://127.0.0.1:{redis_server.port}/6"
    queue = new_queue()
    pidfile = tmp_path / "celery.pid"
    env = celery_env(tmp_path, collector.grpc_address, broker, queue, service="cd")
    log = tmp_path / "celery.log"
    extra = ["--detach", "--pidfile", str(pidfile), "--logfile", str(log)]
    with _daemon_server(worker_command(concurrency=2, extra=extra), env, pidfile) as master:
        wait_until(
            lambda: log.exists() and re.search(r"\S+@\S+ ready\.", log.read_text()) is not None, 60, "ready"
        )
        traces = publish(broker, [queue], 20, tmp_path)[queue]
        assert collector.wait_for(lambda: len(collector.segments) >= 20, timeout=30), collector.summary()
        segments = list(collector.segments)
        assert len(segments) == 20
        assert sorted(s.traceId for s in segments) == sorted(traces.values())
        assert {s.spans[0].operationName for s in segments} == {"celery/examples.work"}
        assert all(s.serviceInstance.startswith("cd-w") for s in segments)
        _stopped_clean(master, signal.SIGTERM, env["SW_AGENT_ARENA_DIR"])
