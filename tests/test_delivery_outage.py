"""Backend outages with the reporter's default settings lose nothing (issue 16).

Real processes: a stand-in master spawns the real reporter with the settings the agent
builds from its configuration defaults; paced writers fill their rings at a steady rate; the
test collector (a gRPC server in its own process) goes away for the outage and comes back on
the same port. The scenario lives in ``benchmarks/outage_bench.py``, which also runs the
full-size case (10 minutes at 1,000 segments/s) by hand.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.outage_bench import run_outage


def test_an_outage_with_default_settings_loses_nothing_and_delivery_resumes(tmp_path: Path) -> None:
    res = run_outage(tmp_path, rate=300, before_s=4, outage_s=30, after_s=6, deadline_s=120)
    print(f"\noutage result: {res}")
    assert res.written > 10_000
    assert res.ring_overflows == 0  # the reporter kept draining the rings during the outage
    assert res.lost == 0, f"{res.lost} of {res.written} segments never reached the backend"
    assert res.delivered == res.written
    # The default spool took what the retries could not deliver, and gave it back.
    assert res.spooled > 0 and res.replayed > 0
    assert not res.dropped
    assert 0 <= res.resume_s < 30  # measured ~1 s on a quiet machine; only "resumed" is asserted
