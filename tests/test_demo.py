"""``swmp demo`` run end to end as a user runs it: bounded time, the printed trace trees, and
nothing left behind (no process, no file but the collector's database), also after Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.servers
ROOT = Path(__file__).resolve().parent.parent


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SW_", "SWMP_"))}
    (tmp_path / "data").mkdir()
    (tmp_path / "tmp").mkdir()
    env.update(
        XDG_DATA_HOME=str(tmp_path / "data"),  # where the collector's database goes by default
        TMPDIR=str(tmp_path / "tmp"),  # where the demo keeps its temporary files
        NO_COLOR="1",
        # the checkout under test, whatever swmp is installed (the demo runs from the cwd below)
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    )
    return env


# A test run started in the background of a shell without job control (`pytest ... &`)
# inherits SIGINT ignored, and so would the demo: Python then installs no Ctrl-C handler, as
# it should for a background job. The demo is tested as a user runs it, in the foreground:
# this shim sets SIGINT to its default, then execs the demo (same pid). Not a preexec_fn: in
# this process, where earlier tests used gRPC, a Python-level fork runs gRPC core's fork
# handlers, which once left a child aborting in epoll_wait after subprocess closed its
# descriptors (test_lifecycle, in a whole-suite run).
_SIGINT_DEFAULT_THEN_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def _demo(tmp_path: Path, requests: int, stdout: int) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-c", _SIGINT_DEFAULT_THEN_EXEC, "-m", "swmp.cli", "demo"]
    return subprocess.Popen(
        [*cmd, "--grpc-port", "0", "--http-port", "0", "--requests", str(requests)],
        env=_env(tmp_path),
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=stdout,
    )


class _Family:
    """Every process the demo started, sampled while it runs: its process tree (collector,
    Gunicorn masters and workers), plus anything whose command line names the test's
    directory (the agents' supervisors and reporters: detached, in no process's tree, but
    their titles name their arena). Gunicorn
    and the agent write their titles over the environment block, so an environment marker
    would not find them."""

    def __init__(self, proc: subprocess.Popen[str], tmp_path: Path) -> None:
        self.proc = proc
        self.tag = str(tmp_path)
        self.seen: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def sample(self) -> None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                self.seen.setdefault(p.pid, p)
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if p.pid != os.getpid() and self.tag in " ".join(p.cmdline()):
                    self.seen.setdefault(p.pid, p)

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            self.sample()

    def alive(self) -> list[psutil.Process]:
        out = []
        for p in list(self.seen.values()):  # the watcher thread may add to it meanwhile
            with contextlib.suppress(psutil.Error):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
        return out

    def close(self) -> None:
        """Stop watching; on failure, stop the demo the way a user would, then kill by pid."""
        self._stop.set()
        self._thread.join()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()
        for p in self.alive():
            with contextlib.suppress(psutil.Error):
                p.kill()


# Every process ``swmp demo`` runs (with ``--workers`` at its default, 4), by what it is.
_EXPECTED = {
    "demo": 1,
    "collector": 1,
    "master demo-frontend": 1,
    "worker demo-frontend": 4,
    "supervisor demo-frontend": 1,
    "reporter demo-frontend": 1,
    "master demo-inventory": 1,
    "worker demo-inventory": 2,
    "supervisor demo-inventory": 1,
    "reporter demo-inventory": 1,
}
_APPS = {"examples.app:app": "demo-frontend", "examples.inventory:app": "demo-inventory"}


def _role(family: _Family, p: psutil.Process) -> str:
    """What a process of the demo is, from its title (Gunicorn's and the agent's)."""
    if p.pid == family.proc.pid:
        return "demo"
    cmd = " ".join(p.cmdline())
    if "swmp.collector" in cmd:
        return "collector"
    if m := re.match(r"gunicorn: (master|worker) \[(\S+)\]", cmd):
        return f"{m[1]} {_APPS.get(m[2], m[2])}"
    if m := re.match(r"swmp-(supervisor|reporter) \[(\S+)\]", cmd):
        return f"{m[1]} {m[2]}"
    return cmd


def _wait_all_started(family: _Family, timeout: float = 120.0) -> dict[str, int]:
    """Wait until every process in ``_EXPECTED`` runs under its title; the count by role.

    The demo starts its load once one worker of each server answers; Gunicorn's master forks
    the others one by one (with a random pause of up to 0.1 s between two), and a loaded
    machine can answer the first request before the last worker exists (seen: 10 of 14)."""
    deadline = time.monotonic() + timeout
    while True:
        family.sample()
        roles: dict[str, int] = {}
        for p in family.alive():
            with contextlib.suppress(psutil.Error):
                role = _role(family, p)
                roles[role] = roles.get(role, 0) + 1
        done = all(roles.get(r, 0) >= n for r, n in _EXPECTED.items())
        if done or family.proc.poll() is not None or time.monotonic() > deadline:
            return roles
        time.sleep(0.1)  # a poll interval, not a wait for the state: that is the loop's test


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_demo_end_to_end(tmp_path: Path) -> None:
    proc = _demo(tmp_path, 160, subprocess.PIPE)
    family = _Family(proc, tmp_path)
    try:
        text, err = proc.communicate(timeout=150)
        family.sample()
        started = len(family.seen)
        left = family.alive()
    finally:
        family.close()
    assert proc.returncode == 0, text + err
    assert started >= 12, started  # demo, collector, 2 x (master, supervisor, reporter), 6 workers
    assert not left, left
    assert "Sent 160 requests (40 fan out to demo-inventory, 16 answered with an error)" in text
    assert "The collector has all" in text
    # the status table of both services
    assert re.search(r"^service\s+demo-frontend\s+grpc", text, re.M)
    assert re.search(r"^service\s+demo-inventory\s+grpc", text, re.M)

    crossing = text.split("A trace across both services:", 1)[1].split("\n\n", 1)[0].splitlines()
    assert re.fullmatch(r"  swmp traces \S+", crossing[0])
    assert re.match(
        r"trace \S+  2 segments, 3 spans, [\d.]+ m?s, services: demo-frontend, demo-inventory$", crossing[1]
    )
    assert crossing[2].startswith("/call  Entry") and "[demo-frontend @ " in crossing[2]
    assert crossing[3].startswith("└─ /stock  Exit  -> 127.0.0.1:")
    assert crossing[4].startswith("   └─ /stock  Entry") and "[demo-inventory @ " in crossing[4]
    assert "ERROR" not in "\n".join(crossing)

    failing = text.split("A trace with an error:", 1)[1].split("\n\n", 1)[0].splitlines()
    assert "error span" in failing[1] and "demo-inventory" in failing[1]
    assert failing[2].startswith("/call  Entry") and failing[2].endswith("status 500  ERROR")
    assert failing[4].startswith("   └─ /stock  Entry") and failing[4].endswith("status 500  ERROR")

    trace_id = crossing[0].split()[-1]
    assert re.search(rf"^Trace page: http://127\.0\.0\.1:\d+/#/trace/{re.escape(trace_id)}$", text, re.M)
    # what is left: the collector's database, private, and nothing else
    assert _files(tmp_path / "tmp") == []
    assert _files(tmp_path / "data") == ["swmp", "swmp/collector.db"]
    assert (tmp_path / "data" / "swmp" / "collector.db").stat().st_mode & 0o777 == 0o600


def test_demo_ctrl_c_stops_everything(tmp_path: Path) -> None:
    proc = _demo(tmp_path, 100_000, subprocess.STDOUT)
    family = _Family(proc, tmp_path)
    lines = []
    rest = ""
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until the load runs
            lines.append(line)
            if "requests" in line and line.startswith("["):
                break
        roles = _wait_all_started(family)  # the load may run before every worker is forked
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
        rest, _ = proc.communicate(timeout=60)
        left = family.alive()
    finally:
        family.close()
    assert all(roles.get(r, 0) >= n for r, n in _EXPECTED.items()), (roles, "".join(lines))
    assert proc.returncode == 130, "".join(lines) + rest
    assert "interrupted: stopping the demo's processes" in rest
    assert not left, left
    assert _files(tmp_path / "tmp") == []


def test_a_ctrl_c_while_the_load_starts_its_threads_still_joins() -> None:
    """The Ctrl-C can land between two ``Thread.start`` calls of ``Load.send`` (seen once in a
    whole-suite run: the demo then exited with 'cannot join thread before it is started')."""
    import io
    import threading

    from swmp.demo.load import Load

    load = Load(io.StringIO(), 2)
    started = threading.Thread(target=lambda: None)
    started.start()
    load._threads = [started, threading.Thread(target=lambda: None)]  # the second never started
    load.stop()
    load.join(timeout=5)
    assert not started.is_alive()
