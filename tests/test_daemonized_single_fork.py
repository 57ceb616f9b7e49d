"""Applications that daemonize with a single fork: the ``daemonize`` package (fork, the parent
exits, the child calls ``setsid()`` and carries on as the application).

No at-fork hook sees such a daemon (``setsid()`` comes after the fork), so the sink asks on
its slow paths (``swmp.lifecycle.notice_single_fork_daemon``): before, the daemon counted as
the owner's helper (a reporting owner) or wrote into the owner's arena, whose reporter left
with the owner (everything after the first second lost). Real forks, the real ``daemonize``
package under ``swmp run``, the real reporter, the in-test collector.
"""

from __future__ import annotations

import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from reporter_proc import records as R
from swmp import _sink, lifecycle
from swmp._runtime import ProcessSink
from swmp._sink import MemorySink
from tests.collector import Collector
from tests.servers import agent_env
from tests.test_daemonized import DAEMON_RECORDS, DAEMON_WORK, _in_child, check_a_daemon_program

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
    # The owner a zombie still: waited for without being reaped (WNOWAIT), so the child never
    # looks before the owner has exited (with no wait at all it could, 1 run in ~20 under load).
    zombie = "os.waitid(os.P_PID, owner, os.WEXITED | os.WNOWAIT)"
    assert _single_fork(gone=zombie) == {"daemon": True}
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
# Records (``report_first``) or not before it daemonizes, then does DAEMON_WORK as the daemon.
DAEMONIZE = (
    textwrap.dedent(
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
    """
    )
    + textwrap.indent(DAEMON_WORK, "    ")
    + textwrap.dedent(
        """

    Daemonize(app="swmp-single-fork", pid=pidfile, action=main).start()
    """
    )
)


@pytest.mark.parametrize("report_first", [False, True], ids=["owner-silent", "owner-reported"])
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_daemonize_program_reports_before_and_long_after_its_first_process_exits(
    tmp_path: Path, collector: Collector, mode: str, report_first: bool
) -> None:
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
    expected = Counter(DAEMON_RECORDS)
    if report_first:
        expected.update({f"before-{i}": 1 for i in range(3)})
    pidfile = str(tmp_path / "daemon.pid")
    check_a_daemon_program(
        tmp_path, collector, env, DAEMONIZE, pidfile, "1" if report_first else "0", expected=expected
    )


# -- two threads at the daemon's first use -----------------------------------------------------
class _Unbindable(ProcessSink):
    """A sink whose claim is recorded (it must not happen: the process is a daemon)."""

    attached: list[int]

    def _attach(self, pid: int) -> None:
        self.attached.append(pid)


def test_a_second_threads_first_record_follows_the_hand_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """While one thread's first record waits for the answer (the owner's exit), another's
    waits for it too and goes to the agent started anew, rather than binding in the old
    arena meanwhile."""
    new = MemorySink()
    answers = iter([True])

    def notice() -> bool:  # the first asker learns it after a while; nobody later
        answer = next(answers, False)
        if answer:
            time.sleep(0.3)
            _sink.set_sink(new)  # as the agent's start anew does
        return answer

    monkeypatch.setattr(lifecycle, "notice_single_fork_daemon", notice)
    saved = _sink.get_sink()
    old = _Unbindable("svc", "inst")
    old.attached = []
    try:
        threads = [threading.Thread(target=old.write, args=(R.SEGMENT, b"[]")) for _ in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(10)
    finally:
        _sink.set_sink(saved)
    assert old.attached == []
    assert len(new.records) == 2
