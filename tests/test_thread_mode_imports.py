"""Thread mode's reporter thread and the application's forks.

A module the reporter thread is still importing when the application forks stays locked in
the child for good (importlib's per-module locks are not reset at fork): the child hangs at
its first import of it. Seen with an application that recorded and then daemonized at once
(its daemon hung importing grpc, which the thread was importing). So the thread imports all
it needs at its start, and a fork waits for that (``reporter_proc.thread_mode``). Here real
applications report through the real senders to the in-test collector: children forked at
every moment of the thread's start import what it imports, and the thread imports nothing
after the first fork returned.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.collector import Collector
from tests.servers import agent_env

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector() as c:
        yield c


# Records once (the reporter thread starts), forks (which waits for the thread's imports),
# notes the modules, records more, waits until the collector has them all and the instance was
# announced, notes the modules again.
PROGRAM = textwrap.dedent(
    """
    import json, os, sys, time

    import swmp

    with swmp.entry_span("first"):
        pass
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    at_start = set(sys.modules)
    for i in range(20):
        with swmp.entry_span(f"more-{i}"):
            pass
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not open(sys.argv[1]).read():
        time.sleep(0.05)
    print(json.dumps(sorted(set(sys.modules) - at_start)))
    """
)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_reporter_thread_imports_nothing_after_a_fork_returned(
    tmp_path: Path, collector: Collector, protocol: str
) -> None:
    script, done = tmp_path / "app.py", tmp_path / "done"
    script.write_text(PROGRAM)
    done.write_text("")
    backend = collector.grpc_address if protocol == "grpc" else collector.http_address
    env = agent_env(
        tmp_path,
        backend,
        service="imports",
        reporter_process=False,
        extra={"SW_AGENT_PROTOCOL": protocol, "SW_AGENT_METER_REPORTER_ACTIVE": "true"},
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "swmp.cli", "run", "--", sys.executable, str(script), str(done)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        delivered = collector.wait_for(
            lambda: len(collector.segments) >= 21 and bool(collector.properties), timeout=30
        )
        done.write_text("x")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert delivered, collector.summary()
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1]) == [], err[-2000:]


# Children forked 0-300 ms after the first record (the thread's start, its imports), each
# importing what the thread imports; the program says how many finished.
FORKS = textwrap.dedent(
    """
    import os, sys, time

    import swmp

    modules = sys.argv[1].split(",")
    with swmp.entry_span("first"):
        pass
    start, children = time.monotonic(), []
    for step in range(16):
        while time.monotonic() < start + step * 0.02:
            time.sleep(0.002)
        pid = os.fork()
        if pid == 0:
            for name in modules:
                __import__(name)
            os._exit(0)
        children.append(pid)
    deadline, finished = time.monotonic() + 20, 0
    while children and time.monotonic() < deadline:
        for pid in list(children):
            if os.waitpid(pid, os.WNOHANG)[0]:
                children.remove(pid)
                finished += 1
        time.sleep(0.01)
    for pid in children:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    print(finished)
    """
)


@pytest.mark.parametrize(("protocol", "modules"), [("grpc", "grpc,psutil"), ("http", "aiohttp,psutil")])
def test_children_forked_while_the_reporter_thread_starts_import_freely(
    tmp_path: Path, collector: Collector, protocol: str, modules: str
) -> None:
    script = tmp_path / "forks.py"
    script.write_text(FORKS)
    backend = collector.grpc_address if protocol == "grpc" else collector.http_address
    env = agent_env(
        tmp_path, backend, service="forks", reporter_process=False, extra={"SW_AGENT_PROTOCOL": protocol}
    )
    done = subprocess.run(
        [sys.executable, "-m", "swmp.cli", "run", "--", sys.executable, str(script), modules],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "16", done.stderr[-2000:]
