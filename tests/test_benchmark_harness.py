"""The benchmarks' shared pieces still fit their callers: each command below runs a benchmark
(or the measured child of a Valgrind one) for a handful of calls and must finish cleanly.

Why: ``benchmarks/`` is outside mypy's files, and docs/performance.md quotes these commands.
When the shared ring helper changed (``benchmarks/_ring.py``), four callers broke (an
argument, a return value, a tuple's length, private attributes) with the lint step green.
Nothing here is timed; the figures are the benchmarks' own business.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

COMMANDS = [
    ["framework_cachegrind.py", "--child", "wsgi-middleware", "traced", "20"],
    ["framework_cachegrind.py", "--child", "flask", "traced", "20"],
    ["celery_cachegrind.py", "--child", "publish alone", "swmp", "20"],
    ["mq_cachegrind.py", "--child", "consumer", "traced", "20"],
    ["mq_cachegrind.py", "--child", "producer-aiormq", "traced", "20"],
    ["mq_cachegrind.py", "--child", "producer-aiokafka", "traced", "20"],
    ["grpc_server_cost.py", "sync", "traced", "50"],
    ["gc_bench.py", "--quick"],
    ["hotpath_bench.py", "--quick"],
    ["cold_cache_bench.py", "--quick"],
    ["cold_cachegrind.py", "--child", "consumer-aiormq", "traced", "20", "0.25"],
    ["cold_cachegrind.py", "--child", "wsgi-request", "base", "20", "0.25"],
    ["wake_cost.py", "--seconds", "0.2"],
    # Servers, a sink and SIGSTOP/SIGCONT of the paused parts (~20 s).
    ["tail_probe.py", "--rounds", "1", "--duration", "1", "--warmup", "1"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_the_benchmark_runs(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / command[0]), *command[1:]],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warning: the ring dropped" not in done.stderr  # a dropped write is a cheaper one
