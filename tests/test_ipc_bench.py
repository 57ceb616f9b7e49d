"""The ring benchmark runs end to end (smoke test) and writes the documented JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ipc_bench_quick_writes_the_documented_json(tmp_path: Path) -> None:
    out = tmp_path / "ipc.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "ipc_bench.py"),
            "--quick",
            "--records",
            "2000",
            "--json",
            str(out),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr  # it exits non-zero on lost records
    doc = json.loads(out.read_text())
    rows = doc["results"]
    impls = {r["impl"] for r in rows}
    assert {"swmp-ring", "mp.Queue", "mp.Pipe"} <= impls
    assert {r["record_bytes"] for r in rows} == {64, 300, 4096}
    for r in rows:
        assert set(r) >= {"impl", "record_bytes", "records_per_s", "ns_per_record"}
        assert r["records_per_s"] > 0
        assert r["ns_per_record"] == pytest.approx(1e9 / r["records_per_s"], rel=1e-3)
    assert "swmp-ring" in proc.stdout and "records/s" in proc.stdout
