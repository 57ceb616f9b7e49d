"""swmp.lifecycle: the process moments (forked, bound, leaving) parts of the agent share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from reporter_proc import role
from swmp import lifecycle


@pytest.fixture
def events() -> Iterator[list[Any]]:
    seen: list[Any] = []
    hooks: list[Callable[..., None]] = [
        lambda: seen.append(("fork-a", os.getpid())),
        lambda: seen.append(("fork-b", os.getpid())),
    ]
    bound: Callable[[str], None] = lambda r: seen.append(("bound", r))  # noqa: E731
    leave: Callable[[], None] = lambda: seen.append(("leave",))  # noqa: E731
    for h in hooks:
        lifecycle.on_fork(h)
    lifecycle.on_bound(bound)
    lifecycle.on_leave(leave)
    yield seen
    for fn in (*hooks, bound, leave):
        lifecycle.unsubscribe(fn)
    lifecycle.announce_unbound()


def in_child(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a forked child; its JSON result comes back through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(w, json.dumps(fn()).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


# A master's fork through subprocess with preexec_fn, in a fresh interpreter: the child runs
# the at-fork hooks, and in this test process gRPC core's own fork handlers too, once earlier
# tests have used gRPC here with its fork support on; with a gRPC thread busy at that moment
# they restarted a poller in the child, which aborted in epoll_wait once subprocess had
# closed the descriptors (seen once in a whole-suite run). An application's master has no
# such history; the role logic under test is the same.
_PREEXEC_ROLE = """
import os, subprocess, sys, tempfile, types
from pathlib import Path
from swmp import lifecycle
for name in sys.argv[1:]:
    sys.modules[name] = types.ModuleType(name)
lifecycle._here.owner_pid = os.getpid()  # this process is the master
with tempfile.TemporaryDirectory() as tmp:
    seen = Path(tmp, "role")
    subprocess.run(["true"], check=True, preexec_fn=lambda: seen.write_text(lifecycle.role()))
    print(seen.read_text())
"""


def preexec_role(*server_modules: str) -> str:
    """The role a subprocess child with ``preexec_fn`` sees, the master's modules faked."""
    done = subprocess.run(
        [sys.executable, "-c", _PREEXEC_ROLE, *server_modules],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_fork_hooks_run_in_the_child_in_subscription_order(events: list[Any]) -> None:
    got = in_child(lambda: [list(e) for e in events])
    assert [e[0] for e in got] == ["fork-a", "fork-b"]
    assert all(e[1] != os.getpid() for e in got)
    assert events == []  # never in the parent


def test_no_fork_hook_runs_in_a_forked_reporter(events: list[Any]) -> None:
    role.set_forking(True)
    try:
        got = in_child(lambda: [list(e) for e in events])
    finally:
        role.set_forking(False)
    assert got == []


def test_binding_gives_the_role_until_the_next_fork(events: list[Any]) -> None:
    lifecycle.announce_bound(lifecycle.WORKER)
    assert events == [("bound", "worker")]
    assert lifecycle.role() == "worker" and lifecycle.is_reporting_worker()
    # A child is not bound by its parent's binding: forked by a reporting process, it is
    # a helper (inert) until a server hook declares it a worker.
    assert in_child(lifecycle.role) == "helper"
    assert in_child(lambda: (lifecycle.declare_server_worker(), lifecycle.role())[1]) == ""
    lifecycle.announce_unbound()
    assert lifecycle.role() == ""


def test_a_late_pid_check_announces_the_fork_once(events: list[Any]) -> None:
    def child() -> Any:
        # As if the fork hooks had not run (uWSGI without postfork): the pid check is first.
        events.clear()
        lifecycle._here.pid = -1
        lifecycle.check_fork()
        lifecycle.check_fork()
        lifecycle.announce_bound(lifecycle.MASTER)
        return [e[0] for e in events]

    assert in_child(child) == ["fork-a", "fork-b", "bound"]


def test_leaving_runs_the_leave_hooks(events: list[Any]) -> None:
    lifecycle.announce_leaving()
    assert events == [("leave",)]


def test_who_may_report() -> None:
    assert lifecycle.may_report_here()  # no owner known, not bound: a plain process
    lifecycle.announce_bound(lifecycle.MASTER)
    try:
        assert not lifecycle.may_report_here()
    finally:
        lifecycle.announce_unbound()
    assert in_child(lambda: (role.mark_reporter_process(), lifecycle.may_report_here())[1]) is False


# Gunicorn's Arbiter.spawn_worker, as far as the agent looks at it: the pre_fork hook, then the
# fork whose child is the worker.
_ARBITER = """
class Arbiter:
    def __init__(self, cfg):
        self.cfg = cfg

    def spawn_worker(self, fork):
        self.cfg.pre_fork(self, None)
        return fork()
"""


def test_only_spawn_worker_forks_gunicorn_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "uwsgi", raising=False)
    monkeypatch.setitem(sys.modules, "gunicorn.arbiter", types.ModuleType("gunicorn.arbiter"))
    monkeypatch.setattr(lifecycle._here, "owner_pid", os.getpid())  # this process is the master
    namespace: dict[str, Any] = {}
    exec(compile(_ARBITER, os.path.join("site-packages", "gunicorn", "arbiter.py"), "exec"), namespace)
    in_pre_fork: list[str] = []
    cfg = types.SimpleNamespace(pre_fork=lambda arbiter, worker: in_pre_fork.append(in_child(lifecycle.role)))
    # The worker: not a helper; the sink's bind names it.
    assert namespace["Arbiter"](cfg).spawn_worker(lambda: in_child(lifecycle.role)) == ""
    assert in_pre_fork == ["helper"]  # forked by the pre_fork hook, on spawn_worker's stack
    # Any other fork of the master: USR2's re-exec, a hook's os.fork or subprocess with
    # preexec_fn (which runs the at-fork hooks in the child, before the exec).
    assert in_child(lifecycle.role) == "helper"
    assert preexec_role("gunicorn.arbiter") == "helper"


def test_only_uwsgis_own_forks_are_uwsgi_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """uWSGI forks its workers in C: Python's at-fork hook, when uWSGI runs it, has no Python
    frame below it. A fork made by Python code in the master (the application's import) has."""
    uwsgi = types.ModuleType("uwsgi")
    monkeypatch.setitem(sys.modules, "uwsgi", uwsgi)
    monkeypatch.setattr(lifecycle._here, "owner_pid", os.getpid())  # this process is the master
    assert in_child(lifecycle.role) == "helper"  # os.fork
    assert preexec_role("uwsgi") == "helper"

    def c_fork() -> str:  # the hooks uWSGI runs in its worker: no Python caller to see
        lifecycle._here.pid, lifecycle._here.role = os.getppid(), lifecycle.MASTER  # as if no hook had run
        lifecycle._forked()
        return lifecycle.role()

    assert in_child(c_fork) == ""  # a worker: the sink's bind names it


# A fork hook interrupted by SIGINT (Python's handler raises KeyboardInterrupt in it), in a
# fresh interpreter: the child ends by SIGINT, as an uncaught KeyboardInterrupt ends Python;
# with ``keep`` the hook catches nothing and the child goes on (what Python's at-fork
# machinery alone does with the interrupt: it is ignored).
_INTERRUPTED_HOOK = r"""
import os, signal, sys
from swmp import lifecycle

def interrupted():
    signal.raise_signal(signal.SIGINT)  # Python's handler: KeyboardInterrupt raised here

if sys.argv[1] == "keep":
    os.register_at_fork(after_in_child=interrupted)
else:
    lifecycle.on_fork(interrupted)
    lifecycle._register_fork_hooks()
pid = os.fork()
if pid == 0:
    os._exit(7)  # the child went on past the fork
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.parametrize(("how", "exit_code"), [("agent", -2), ("keep", 7)])
def test_an_interrupt_in_the_fork_hook_ends_the_child(how: str, exit_code: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_HOOK, how],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert int(done.stdout.split()[-1]) == exit_code, done.stderr
