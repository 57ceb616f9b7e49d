"""benchmarks/soak.py runs end to end in a short version and writes what it documents."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.servers, pytest.mark.timeout(300)]


def test_short_soak_writes_json_and_png_with_sane_figures(tmp_path: Path) -> None:
    out, png = tmp_path / "soak.json", tmp_path / "soak.png"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "soak.py"),
            "--minutes",
            "0.75",
            "--rate",
            "100",
            "--outage-s",
            "5",
            "--json",
            str(out),
            "--plot",
            str(png),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=280,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "served" in proc.stdout and "reporter" in proc.stdout  # the table
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(out.read_text())

    # The schedule ran: one outage, a reporter kill and a worker kill, each with a victim.
    kinds = [e["kind"] for e in doc["events"] if e["done"]]
    assert kinds == ["outage_start", "outage_end", "reporter_kill", "worker_kill"], doc["events"]
    assert all(e["detail"] for e in doc["events"] if e["kind"].endswith("_kill"))

    samples = doc["samples"]
    assert len(samples) >= 30
    # RSS of every role was seen (the reporter and a worker come back after their kills).
    for role in ("master", "workers", "reporter", "supervisor"):
        assert samples[-1]["rss_mib"][role] > 0, (role, samples[-1])
        assert doc["rss_mib"][role]["max"] < 1024
    # Delivery: consistent accounting, and the pipe flows again after the last fault.
    o = doc["outcome"]
    assert o["served"] >= 0.5 * 100 * 45
    assert 0 < o["delivered"] <= o["served"]
    assert o["lost"] == o["served"] - o["delivered"]
    worker_kill_at = next(e["at_s"] for e in doc["events"] if e["kind"] == "worker_kill")
    at_kill = next(s["delivered_total"] for s in samples if s["t_s"] >= worker_kill_at)
    assert samples[-1]["delivered_total"] > at_kill
    assert doc["leftover_processes"] == []
