"""The reporter's own settings file: ``python -m reporter_proc --settings-file FILE`` checks every
value against the same bounds the agent's configuration uses (reporter_proc.settings.BOUNDS).

Before, the JSON was taken as it was: a zero flush interval killed the reporter on its first
tick (ZeroDivisionError), a negative one made it spin a core, a batch size of 0 sent every
record alone, and so on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reporter_proc.process import settings_from_json
from reporter_proc.settings import BOUNDS, MAX_SECONDS, ReporterSettings, settings_from_mapping
from tests import test_cli_support as support
from tests.test_reporter_helpers import segment, trace_ids, write_all

# Per bounded setting: values just outside its range (and a wrong type), and one just inside.
CASES: dict[str, tuple[list[Any], Any]] = {
    "batch_max_records": ([0, -5, 1.5, True, "100"], 1),
    "batch_max_bytes": ([1023, -1], 1024),
    "flush_interval_s": ([0, -1.0, 0.0009, MAX_SECONDS + 1, 1e10, math.nan, math.inf, "5"], 0.001),
    "send_early_records": ([0, -1], 1),
    "poll_interval_s": ([0, -0.5, 1e10], 0.001),
    "keepalive_interval_s": ([0.04, 0, 1e300], 0.05),
    "properties_every_n_keepalives": ([0, -3], 1),
    "send_timeout_s": ([-1, 0.09, 1e10], 0.1),
    "retry_max_attempts": ([0, -1], 1),
    "retry_backoff_base_s": ([-0.1, 1e308], 0),
    "retry_backoff_max_s": ([-0.1, MAX_SECONDS * 2], MAX_SECONDS),
    "max_pending_bytes": ([0, 1023, -1], 1024),
    "shutdown_deadline_s": ([-1, 1e10], 0),
    "profile_task_interval_s": ([0, 0.5, 1e10], 1),
    "spool_max_bytes": ([-1], 0),
    "spool_segment_bytes": ([0, 4095], 4096),
    "restart_backoff_base_s": ([-1, 1e10], 0.5),
    "restart_backoff_max_s": ([-1, 1e10], 30),
    "restart_stable_s": ([-1, 1e10], 60),
    "status_interval_s": ([0.04, 1.5, 0], 1),
    "status_max_instances": ([-1], 0),
    "memory_fail_first": ([-1], 0),
}


def test_every_bound_has_cases() -> None:
    assert set(CASES) == set(BOUNDS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_out_of_range_values_are_refused_and_logged(name: str, caplog: pytest.LogCaptureFixture) -> None:
    bad, good = CASES[name]
    default = getattr(ReporterSettings(), name)
    for value in bad:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="swmp.reporter"):
            settings = settings_from_mapping({name: value})
        assert getattr(settings, name) == default, value
        assert [r.getMessage() for r in caplog.records] == [
            f"reporter setting {name}={value!r} is invalid ({_why(name, value)}); using {default!r} instead"
        ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="swmp.reporter"):
        assert getattr(settings_from_mapping({name: good}), name) == good
    assert caplog.records == []


def _why(name: str, value: Any) -> str:
    default = getattr(ReporterSettings(), name)
    integer = isinstance(default, int) and not isinstance(default, bool)
    if isinstance(value, (bool, str)) or (integer and isinstance(value, float)):
        return "not an integer" if integer else "not a number"
    if isinstance(value, float) and not math.isfinite(value):
        return "not a finite number"
    why = BOUNDS[name](value)
    assert why is not None
    return why


def test_wrong_types_are_refused_for_every_kind_of_setting(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="swmp.reporter"):
        s = settings_from_mapping(
            {"service": 5, "backends": [1, 2], "force_tls": "yes", "kafka_extra": {"acks": 1},
             "namespace": "ns"}
        )  # fmt: skip
    default = ReporterSettings()
    assert (s.service, s.backends, s.force_tls, s.kafka_extra) == (
        default.service, default.backends, default.force_tls, default.kafka_extra
    )  # fmt: skip
    assert s.namespace == "ns"
    assert len(caplog.records) == 4
    # A list from JSON becomes the tuple the dataclass holds.
    assert settings_from_json(json.dumps({"backends": ["a:1", "b:2"]})).backends == ("a:1", "b:2")


def test_a_bad_protocol_refuses_the_start() -> None:
    """No default is right for a mistyped protocol: it must not quietly become gRPC."""
    with pytest.raises(ValueError, match="protocol='grcp' is invalid"):
        settings_from_mapping({"protocol": "grcp"})
    for protocol in ("grpc", "http", "kafka", "memory"):
        assert settings_from_mapping({"protocol": protocol}).protocol == protocol


def test_the_agent_configuration_uses_the_same_bounds() -> None:
    """The SW_* variables feeding a reporter setting are checked with its bound (one declaration)."""
    from swmp import config as C

    checks = {s.name: s.check for s in C.settings()}
    fed = {
        "agent_reporter_batch_size": "batch_max_records",
        "agent_reporter_batch_max_bytes": "batch_max_bytes",
        "agent_reporter_flush_interval": "flush_interval_s",
        "agent_reporter_send_timeout": "send_timeout_s",
        "agent_reporter_max_pending_bytes": "max_pending_bytes",
        "agent_reporter_shutdown_timeout": "shutdown_deadline_s",
        "agent_spool_max_bytes": "spool_max_bytes",
        "agent_collector_properties_report_period_factor": "properties_every_n_keepalives",
        "agent_collector_get_profile_task_interval": "profile_task_interval_s",
    }
    for config_name, field in fed.items():
        assert checks[config_name] is BOUNDS[field], config_name
    # What the agent hands the reporter passes the reporter's own checks unchanged.
    settings = C.load({}).to_reporter_settings()
    as_json = json.dumps(dataclasses.asdict(settings))
    assert settings_from_json(as_json) == settings


def test_the_reporter_started_with_bad_values_logs_them_and_runs_with_defaults(tmp_path: Path) -> None:
    """``python -m reporter_proc --settings-file`` as users start it: before the fix the zero flush
    interval killed it on its first tick (exit 70); now each bad value is logged and its
    default used, and the reporter delivers."""
    shm = tmp_path / "shm"
    shm.mkdir()
    arena = support.make_arena(shm)
    delivered = tmp_path / "delivered.jsonl"
    bad = {"flush_interval_s": 0, "poll_interval_s": -1, "batch_max_records": -5, "status_interval_s": 1e10}
    settings_file = tmp_path / "settings.json"
    settings_file.write_text(json.dumps({"protocol": "memory", "memory_path": str(delivered), **bad}))
    output = tmp_path / "reporter.out"
    with open(output, "wb") as out:
        reporter = subprocess.Popen(
            [sys.executable, "-m", "reporter_proc", "--arena", arena.path, "--owner-pid", str(os.getpid()),
             "--settings-file", str(settings_file), "--no-supervise"],
            cwd=support.REPO, env=support.env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
        )  # fmt: skip
    try:
        support.wait_for(
            lambda: arena.reporter_pid() == reporter.pid or reporter.poll() is not None, 60, "the reporter"
        )
        assert reporter.poll() is None, output.read_text(errors="replace")
        write_all(arena.path, [(1, segment(f"bad-{i}")) for i in range(3)])
        # The default 5 s flush (not the refused 0) sends them; SIGTERM would too.
        support.wait_for(
            lambda: len(trace_ids(str(delivered))) == 3 or reporter.poll() is not None, 60, "delivery"
        )
        assert len(trace_ids(str(delivered))) == 3, output.read_text(errors="replace")
    finally:
        if reporter.poll() is None:
            reporter.send_signal(signal.SIGTERM)
        rc = reporter.wait(timeout=60)
        arena.unlink()
        arena.close()
    text = output.read_text(errors="replace")
    assert rc == 0, text
    for name, value in bad.items():
        default = getattr(ReporterSettings(), name)
        assert f"reporter setting {name}={value!r} is invalid (" in text
        assert f"using {default!r} instead" in text
    assert "Traceback" not in text


def test_the_reporter_refuses_to_start_with_a_bad_protocol(tmp_path: Path) -> None:
    settings_file = tmp_path / "settings.json"
    settings_file.write_text(json.dumps({"protocol": "grcp"}))
    proc = subprocess.run(
        [sys.executable, "-m", "reporter_proc", "--arena", str(tmp_path / "none"),
         "--settings-file", str(settings_file), "--no-supervise"],
        cwd=support.REPO, env=support.env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 78, proc.stderr
    assert "bad reporter settings: reporter setting protocol='grcp' is invalid (must be one of" in proc.stderr
