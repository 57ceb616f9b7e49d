"""Applications that daemonize with a single fork: the ``daemonize`` package (fork, the parent
exits, the child calls ``setsid()`` and carries on as the application).

No at-fork hook sees such a daemon (``setsid()`` comes after the fork), so the sink asks on
its slow paths (``swmp.lifecycle.notice_single_fork_daemon``): before, the daemon counted as
the owner's helper (a reporting owner) or wrote into the owner's arena, whose reporter left
with the owner (everything after the first second lost). Real forks, the real ``daemonize``
package under ``swmp run``, the real reporter, the in-test collector.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_procs import agent_processes, owner_arena
from tests.collector import Collector
from tests.servers import agent_env, wait_until
from tests.test_daemonized import _in_child, _kill_marked, _swmp_run_returns
from tests.test_reporter_helpers import pid_alive

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector() as c:
        yield c


# -- the decision, in real forks -------------------------------------------------------------
# The program forks the owner, which forks the child and then exits (``owner_then``); the
# program reaps the owner (``gone``) or not, lets the child look, and reads its answer.
SINGLE_FORK = """
r, w = os.pipe()
go_r, go_w = os.pipe()
done_r, done_w = os.pipe()
owner = os.fork()
if owner == 0:
    owner, owner_sid = os.getpid(), {owner_sid}
    if os.fork() == 0:
        {child_first}
        os.read(go_r, 1)
        seen = _daemonized.detached_by_a_single_fork(owner, owner_sid, forked_by={forked_by}, wait={wait})
        os.write(w, json.dumps(seen).encode())
        os._exit(0)
    {owner_then}
os.close(w)
{gone}
os.write(go_w, b"x")
with os.fdopen(r) as f:
    out["daemon"] = json.loads(f.read())
os.write(done_w, b"x")
os.waitpid(owner, 0) if not {gone!r} else None
"""


def _single_fork(
    *,
    child_first: str = "os.setsid()",
    owner_then: str = "os._exit(0)",
    gone: str = "os.waitpid(owner, 0)",
    wait: float = 0.0,
    forked_by: str = "owner",
    owner_sid: str = "os.getsid(0)",
) -> dict[str, object]:
    return _in_child(
        SINGLE_FORK.format(
            child_first=child_first,
            owner_then=owner_then,
            gone=gone,
            wait=wait,
            forked_by=forked_by,
            owner_sid=owner_sid,
        )
    )


def test_the_child_that_called_setsid_after_its_owner_exited_is_a_daemon() -> None:
    assert _single_fork() == {"daemon": True}
    assert _single_fork(gone="") == {"daemon": True}  # the owner a zombie still
    assert _single_fork(owner_sid="0") == {"daemon": True}  # session 0 is a real one


def test_the_child_waits_a_moment_for_its_owners_exit() -> None:
    later = "time.sleep(0.2); os._exit(0)"
    assert _single_fork(owner_then=later, gone="", wait=10.0) == {"daemon": True}


def test_no_setsid_no_daemon() -> None:
    assert _single_fork(child_first="pass") == {"daemon": False}


def test_a_detached_job_of_an_owner_that_lives_on_is_no_daemon() -> None:
    lives = "os.close(w); os.read(done_r, 1); os._exit(0)"
    assert _single_fork(owner_then=lives, gone="", wait=0.2) == {"daemon": False}


def test_a_process_not_forked_by_the_owner_is_no_daemon() -> None:
    assert _single_fork(forked_by="owner + 1") == {"daemon": False}


# -- the daemonize package under swmp run ----------------------------------------------------
# Records (``report_first``) or not before it daemonizes; the daemon records before and after
# the process it was started as (the owner) is gone, and its first reporter with it.
DAEMONIZE = textwrap.dedent(
    """
    import os, sys, time

    from daemonize import Daemonize

    import swmp

    info, go, pidfile, report_first = sys.argv[1:5]
    started_as = os.getpid()
    if report_first == "1":
        for i in range(3):
            with swmp.entry_span(f"before-{i}"):
                pass


    def main():
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


    Daemonize(app="swmp-single-fork", pid=pidfile, action=main).start()
    """
)


@pytest.mark.parametrize("report_first", [False, True], ids=["owner-silent", "owner-reported"])
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_daemonize_program_reports_before_and_long_after_its_first_process_exits(
    tmp_path: Path, collector: Collector, mode: str, report_first: bool
) -> None:
    script = tmp_path / "daemonized.py"
    script.write_text(DAEMONIZE)
    info, go, pidfile = tmp_path / "info", tmp_path / "go", tmp_path / "daemon.pid"
    # Thread mode's gRPC cannot start again in a process that closed every descriptor after
    # its parent had used gRPC (daemonize closes them; docs/reporter.md): HTTP there.
    http = mode == "thread" and report_first
    env = agent_env(
        tmp_path,
        collector.http_address if http else collector.grpc_address,
        service="sfd",
        instance="sfd",
        reporter_process=mode == "process",
        extra={"SW_AGENT_PROTOCOL": "http"} if http else None,
    )
    arena_dir = env["SW_AGENT_ARENA_DIR"]
    daemon = 0
    try:
        argv = [sys.executable, str(script), str(info), str(go), str(pidfile), "1" if report_first else "0"]
        _swmp_run_returns(argv, env)
        wait_until(info.exists, 30, "the daemon's info file")
        started_as, daemon = (int(x) for x in info.read_text().split())
        own_arena = owner_arena(daemon, arena_dir)
        if mode == "process":
            # The first process's reporter has drained and left with it; the daemon has its own.
            wait_until(
                lambda: not os.path.exists(owner_arena(started_as, arena_dir)), 30, "the first arena gone"
            )
            wait_until(lambda: len(agent_processes(own_arena)) == 2, 30, "the daemon's own reporter")
        go.write_text("")
        wait_until(lambda: not pid_alive(daemon), 30, "the daemon's exit")
        expected = Counter({f"{w}-{i}": 1 for w in ("early", "late") for i in range(5)})
        if report_first:
            expected.update({f"before-{i}": 1 for i in range(3)})
        total = sum(expected.values())
        assert collector.wait_for(lambda: len(collector.segments) >= total, timeout=30), collector.summary()
        wait_until(lambda: not list(Path(arena_dir).glob("*/*.arena")), 30, "no arena left")
        assert agent_processes(own_arena) == []
        assert Counter(s.spans[0].operationName for s in collector.segments) == expected
    finally:
        if daemon and pid_alive(daemon):
            os.kill(daemon, signal.SIGKILL)
        _kill_marked(arena_dir)
