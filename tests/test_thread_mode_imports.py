"""Thread mode's reporter imports what it needs before the application goes on.

A module the reporter thread is still importing when the application forks stays locked in
the child for good (importlib's per-module locks are not reset at fork): the child hangs at
its first import of it. Seen with an application that recorded and then daemonized at once
(its daemon hung importing grpc, which the thread was importing). So the thread imports its
sender's client library and the instance properties' modules before ``start()`` returns
(``reporter_proc.thread_mode``); here a real application reports through the real senders to
the in-test collector, and every module present later was already there when the
application's first record returned.
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


# Records once (the reporter thread starts), notes the modules, records more, waits until the
# collector has them all and the instance was announced, notes the modules again.
PROGRAM = textwrap.dedent(
    """
    import json, sys, time

    import swmp

    with swmp.entry_span("first"):
        pass
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
def test_the_reporter_thread_imports_nothing_after_it_started(
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
