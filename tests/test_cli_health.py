"""``swmp health`` against real arenas, a stand-in reporter process and real ring writers."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from swmp.ops.schema import HEALTH_SCHEMA
from tests import test_cli_support as support

HEALTH = jsonschema.Draft202012Validator(HEALTH_SCHEMA)  # built once: validate() re-checks the schema


S = support  # the helpers, under the short name these tests use


def checks_of(doc: dict[str, Any], agent: int = 0) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["agents"][agent]["checks"]}


def health(shm: Path, *args: str) -> Any:
    return S.cli("health", "--dir", str(shm), "--interval", "0.3", *args)


def health_json(shm: Path, *args: str) -> tuple[int, dict[str, Any]]:
    rc, doc = S.cli_json("health", "--dir", str(shm), "--interval", "0.3", *args)
    HEALTH.validate(doc)
    assert doc["exit_code"] == rc
    return rc, doc


def test_healthy_agent_exits_0(shm: Path, procs: Any, new_arena: Any) -> None:
    arena = new_arena()
    procs.reporter(arena, S.document(), success_ago_s=0.0)
    procs.writer(arena, count=50)
    proc = health(shm)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("healthy (all): service svc")
    assert "FAIL" not in proc.stdout

    rc, doc = health_json(shm)
    assert rc == 0 and doc["healthy"] is True
    c = checks_of(doc)
    # No spool configured; the stand-in reporter names no supervisor.
    assert [n for n, v in c.items() if v["status"] != "ok"] == ["spool", "supervisor"]
    assert c["spool"]["status"] == "skip" and c["supervisor"]["status"] == "skip"
    assert c["drops"]["figures"]["dropped"] == 0
    assert c["reporter"]["figures"]["pid"] == doc["agents"][0]["reporter_pid"]


def test_backend_failing_fails_readiness_not_liveness(shm: Path, procs: Any, new_arena: Any) -> None:
    arena = new_arena()
    failing = S.document(
        backend={"state": "failing", "consecutive_failures": 5, "last_error": "StatusCode.UNAVAILABLE"}
    )
    # The backend answered 2 s ago and has failed 5 times since: well within the 60 s window.
    procs.reporter(arena, failing, success_ago_s=2.0, error_ago_s=0.0)

    ready = health(shm, "--readiness")
    assert ready.returncode == 1, ready.stdout + ready.stderr
    fails = [ln for ln in ready.stdout.splitlines() if "FAIL" in ln]
    # The error text is clipped to 80 columns in the text output.
    assert fails == ["  FAIL backend: 127.0.0.1:11800: failing, 5 failures in a row: StatusCode.UNA..."]

    live = health(shm, "--liveness")
    assert live.returncode == 0, live.stdout + live.stderr

    # Only the window counts with --backend-failures 0: 2 s ago is fine for 60 s, not for 1 s.
    assert health(shm, "--readiness", "--backend-failures", "0").returncode == 0
    rc, doc = health_json(shm, "--readiness", "--backend-failures", "0", "--backend-window", "1")
    assert rc == 1
    backend = checks_of(doc)["backend"]
    assert backend["status"] == "fail" and "no success for" in backend["message"]
    assert backend["figures"]["last_success_age_s"] >= 1.0
    # Liveness ignores the backend entirely, but still reports it.
    rc, doc = health_json(shm, "--liveness", "--backend-window", "1")
    assert rc == 0 and checks_of(doc)["backend"] == {**checks_of(doc)["backend"], "selected": False}


def test_new_reporter_gets_a_grace_period(shm: Path, procs: Any, new_arena: Any) -> None:
    arena = new_arena()
    rep = procs.reporter(arena, S.document(backend={"state": "unknown"}))
    rc, doc = health_json(shm, "--readiness")
    assert rc == 0
    assert checks_of(doc)["backend"]["figures"]["in_grace"] is True
    # Without a grace period (window 0) a reporter that never reached the backend fails...
    rc, doc = health_json(shm, "--readiness", "--backend-window", "0")
    assert rc == 1 and "never reached" in checks_of(doc)["backend"]["message"]
    # ...and a failure ends the grace period at once.
    rep.update(S.document(backend={"state": "unknown", "consecutive_failures": 1}), error_ago_s=0.0)
    rc, doc = health_json(shm, "--readiness")
    assert rc == 1 and "never reached, 1 failure in a row" in checks_of(doc)["backend"]["message"]


def test_killed_reporter_is_reported(shm: Path, procs: Any, new_arena: Any) -> None:
    arena = new_arena()
    rep = procs.reporter(arena, S.document(), success_ago_s=0.0)
    assert health(shm, "--liveness").returncode == 0
    os.kill(rep.pid, signal.SIGKILL)
    rep.proc.wait(timeout=30)

    proc = health(shm, "--liveness")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("UNHEALTHY (liveness): service svc")
    assert f"  FAIL reporter: no live reporter process (the last one, pid {rep.pid}, is gone)" in lines
    rc, doc = health_json(shm, "--liveness")
    assert rc == 1
    assert checks_of(doc)["reporter"]["status"] == "fail"
    assert checks_of(doc)["reporter"]["figures"]["last_pid"] == rep.pid
    assert doc["agents"][0]["reporter_pid"] is None


def test_full_ring_without_reader_fails_the_drop_check(shm: Path, procs: Any, new_arena: Any) -> None:
    arena = new_arena(ring_capacity=4096)
    # Over totals (--interval 0): 200 records of 100 B, room for about 36.
    _, info = procs.writer(arena, count=200)
    assert 0 < info["ok"] < 50
    rc, doc = health_json(shm, "--interval", "0")
    assert rc == 1
    drops = checks_of(doc)["drops"]
    assert drops["status"] == "fail" and drops["figures"]["over"] == "totals"
    assert drops["figures"]["ring_dropped"] == 200 - info["ok"]
    assert drops["figures"]["offered"] == 200
    assert checks_of(doc)["rings"]["status"] == "skip"  # no interval, no progress to judge

    # Over an interval: a writer that keeps writing into the full ring drops everything.
    procs.writer(arena, count=0, rate=500)
    proc = S.cli("health", "--dir", str(shm), "--interval", "1")
    assert proc.returncode == 1
    drop_lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("  FAIL drops: ")]
    assert len(drop_lines) == 1 and "100% of records dropped over" in drop_lines[0]


def test_stuck_ring_fails_liveness_unless_the_backend_holds_it(shm: Path, procs: Any, new_arena: Any) -> None:
    arena = new_arena()
    rep = procs.reporter(arena, S.document(), drain=False, success_ago_s=0.0)
    _, info = procs.writer(arena, count=20)
    rc, doc = health_json(shm, "--liveness")
    assert rc == 1
    rings = checks_of(doc)["rings"]
    assert rings["status"] == "fail" and rings["figures"]["stuck_slots"] == [info["slot"]]
    proc = health(shm, "--liveness")
    assert proc.returncode == 1
    assert any(
        ln.startswith(f"  FAIL rings: ring(s) {info['slot']} not drained") for ln in proc.stdout.splitlines()
    )

    # A reporter holding back because the backend is failing is not something a restart fixes.
    rep.update(
        S.document(backend={"state": "failing", "consecutive_failures": 9}), drain=False, error_ago_s=0.0
    )
    rc, doc = health_json(shm, "--liveness")
    assert rc == 0
    assert checks_of(doc)["rings"]["figures"]["held_by_backend"] is True

    # Draining again: the ring empties and nothing is stuck.
    rep.update(S.document(), drain=True, success_ago_s=0.0)
    S.wait_for(lambda: arena.ring_stats(info["slot"]).used == 0, what="the ring to drain")
    rc, doc = health_json(shm)
    assert rc == 0 and checks_of(doc)["rings"]["figures"]["stuck_slots"] == []


def test_stale_heartbeat_and_full_spool(shm: Path, procs: Any, new_arena: Any) -> None:
    arena = new_arena()
    spool = {"enabled": True, "bytes": 1000, "cap": 1000, "records": 12}
    rep = procs.reporter(arena, S.document(spool=spool), success_ago_s=0.0)
    rc, doc = health_json(shm)
    assert rc == 1
    c = checks_of(doc)
    assert c["spool"]["status"] == "fail" and c["spool"]["message"] == "spool full: 1000 B of 1000 B"
    assert [n for n, v in c.items() if v["status"] == "fail"] == ["spool"]
    # The spool is not part of readiness.
    assert health(shm, "--readiness").returncode == 0
    # A heartbeat that stopped is stale once it is older than the limit. (Not "--max-heartbeat-age
    # 0" against a live one: a heartbeat written between the check's clock read and its status
    # read has age 0, which is within the limit.)
    rep.update(S.document(spool=spool), success_ago_s=0.0, heartbeat=False)
    S.wait_for(lambda: (arena.status.snapshot().heartbeat_age_s() or 0) > 0.3, what="the heartbeat to age")
    rc, doc = health_json(shm, "--liveness", "--max-heartbeat-age", "0.2")
    assert rc == 1 and checks_of(doc)["heartbeat"]["status"] == "fail", doc


def test_no_agent_exits_2(shm: Path, new_arena: Any, tmp_path: Path) -> None:
    proc = health(shm)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert f"swmp health: no agent found in {shm}" in " ".join(proc.stderr.split())
    rc, doc = health_json(shm)
    assert rc == 2 and doc["agents"] == [] and doc["error"].startswith("no agent found")

    missing = S.cli("health", "--arena", str(tmp_path / "nope.arena"))
    assert missing.returncode == 2 and "no arena at" in missing.stderr
    assert S.cli("health", "--dir", str(tmp_path / "does-not-exist")).returncode == 2

    new_arena()  # service "svc", no reporter
    wrong = health(shm, "--service", "other")
    msg = " ".join(wrong.stderr.split())
    assert wrong.returncode == 2 and "no agent with service 'other'" in msg and "found: svc" in msg


def test_stale_arena_is_not_an_agent(shm: Path, new_arena: Any) -> None:
    gone = S.subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    new_arena(owner_pid=gone.pid)  # the application exited, no reporter, no worker
    proc = health(shm)
    assert proc.returncode == 2
    assert "ignored 1 stale arena(s)" in " ".join(proc.stderr.split())


def test_usage_errors_exit_2(shm: Path) -> None:
    for args in (
        ["--liveness", "--readiness"],
        ["--max-drop-ratio", "2"],
        ["--interval", "-1"],
        ["--pid", "zero"],
        ["--nonsense"],
    ):
        proc = health(shm, *args)
        assert proc.returncode == 2, args
        assert proc.stderr.startswith("usage: swmp")
    assert S.cli().returncode == 2
    assert S.cli("health", "--help").returncode == 0


# The health options and the field of checks.Thresholds each one sets.
THRESHOLD_OPTIONS = {
    "--max-heartbeat-age": "max_heartbeat_age_s",
    "--backend-window": "backend_window_s",
    "--backend-failures": "backend_failures",
    "--max-drop-ratio": "max_drop_ratio",
}


def health_options() -> dict[str, argparse.Action]:
    from swmp import cli

    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.option_strings[0]: a for a in sub.choices["health"]._actions if a.option_strings}


def test_threshold_defaults_are_declared_once(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    """The defaults live in ``checks.Thresholds`` only: every option defaults to its field's
    default and says so in --help, the docs name the same values, ``--json`` reports them;
    and a changed default in the dataclass is what the CLI then uses and shows."""
    from swmp import cli
    from swmp.ops import checks

    fields = {f.name: f.default for f in dataclasses.fields(checks.Thresholds)}
    assert set(THRESHOLD_OPTIONS.values()) == set(fields)  # a new threshold needs its option
    options = health_options()
    docs = " ".join((S.REPO / "docs" / "operations.md").read_text().split())
    for option, name in THRESHOLD_OPTIONS.items():
        assert options[option].default == fields[name], option
        assert f"(default {fields[name]:g}" in options[option].help, option
        assert f"`{option}` ({fields[name]:g}" in docs, option
    rc, doc = S.cli_json("health", "--dir", str(tmp_path), "--interval", "0")
    assert rc == 2 and doc["thresholds"] == fields

    @dataclasses.dataclass(frozen=True)
    class Changed(checks.Thresholds):
        max_heartbeat_age_s: float = 12.5
        backend_window_s: float = 90.0
        backend_failures: int = 5
        max_drop_ratio: float = 0.05

    monkeypatch.setattr(checks, "Thresholds", Changed)
    changed = {f.name: f.default for f in dataclasses.fields(Changed)}
    options = health_options()
    for option, name in THRESHOLD_OPTIONS.items():
        assert options[option].default == changed[name], option
        assert f"(default {changed[name]:g}" in options[option].help, option
    capsys.readouterr()
    assert cli.main(["health", "--dir", str(tmp_path), "--interval", "0", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["thresholds"] == changed


def test_run_delegates_to_the_launcher() -> None:
    empty = S.cli("run")
    assert empty.returncode == 2 and "nothing to run" in empty.stderr
    # The launcher execs the command: its exit status comes back as ours.
    proc = S.cli("run", "--", "sh", "-c", "echo $SWMP_RUN_ACTIVE; exit 7")
    assert (proc.returncode, proc.stdout) == (7, "1\n")


def test_selection_by_service_pid_and_path(shm: Path, procs: Any, new_arena: Any) -> None:
    a = new_arena(meta={"service": "alpha"})
    # A second arena needs another owner pid: lend it the pid of a live helper.
    holder, _ = procs.writer(a, count=0)
    b = new_arena(meta={"service": "beta"}, owner_pid=holder.pid)
    rep_a = procs.reporter(a, S.document(), success_ago_s=0.0)
    rep_b = procs.reporter(b, S.document(), success_ago_s=0.0)
    wb, _ = procs.writer(b, count=1)

    rc, doc = health_json(shm, "--liveness")
    assert rc == 0 and sorted(x["service"] for x in doc["agents"]) == ["alpha", "beta"]

    def only(*args: str) -> list[str]:
        rc, doc = health_json(shm, "--liveness", *args)
        assert rc == 0, doc
        return [x["service"] for x in doc["agents"]]

    assert only("--service", "beta") == ["beta"]
    assert only("--pid", str(wb.pid)) == ["beta"]  # a worker
    assert only("--pid", str(rep_a.pid)) == ["alpha"]  # a reporter
    assert sorted(only("--pid", str(holder.pid))) == ["alpha", "beta"]  # owns beta, works for alpha
    rc, doc = S.cli_json("health", "--arena", a.path, "--liveness", "--interval", "0.3")
    assert rc == 0 and [x["service"] for x in doc["agents"]] == ["alpha"]
    # Killing beta's reporter makes the whole host unhealthy, alpha alone stays healthy.
    os.kill(rep_b.pid, signal.SIGKILL)
    rep_b.proc.wait(timeout=30)
    assert health(shm, "--liveness").returncode == 1
    assert health(shm, "--liveness", "--service", "alpha").returncode == 0


def test_arena_dir_from_environment(shm: Path, procs: Any, new_arena: Any) -> None:
    arena = new_arena()
    procs.reporter(arena, S.document(), success_ago_s=0.0)
    proc = S.cli("health", "--liveness", "--interval", "0", extra_env={"SW_AGENT_ARENA_DIR": str(shm)})
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_another_users_arena_is_refused(shm: Path, new_arena: Any) -> None:
    arena = new_arena()
    os.chown(arena.path, 65534, -1)
    proc = S.cli("health", "--arena", arena.path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    msg = " ".join(proc.stderr.split())
    assert f"refusing to read {arena.path}: it belongs to user" in msg
    assert "(uid 65534), and swmp runs as" in msg and "run swmp as that user" in msg

    # Found by discovery (named for us, owned by someone else): skipped with the same reason.
    found = health(shm)
    assert found.returncode == 2
    assert "refusing to read" in " ".join(found.stderr.split())

    # Another user's arena under its own name is pointed out, not read.
    foreign = shm / "swmp-65534-1.arena"
    foreign.write_bytes(b"")
    os.chown(foreign, 65534, 65534)
    os.chown(arena.path, os.getuid(), -1)
    os.unlink(arena.path)
    proc = health(shm)
    assert proc.returncode == 2
    assert "(uid 65534)" in proc.stderr and "run swmp as that user" in " ".join(proc.stderr.split())


def test_secrets_never_printed(shm: Path, procs: Any, new_arena: Any) -> None:
    secret = "s3cr3t-T0ken-value"
    arena = new_arena(meta={"authentication": secret, "backends": [f"https://user:{secret}@oap:12800"]})
    doc = S.document(
        backend={
            "state": "failing",
            "consecutive_failures": 4,
            "last_error": f"UNAUTHENTICATED: bad authentication={secret}",
        },
        authentication=secret,
    )
    procs.reporter(arena, doc, success_ago_s=100.0, error_ago_s=0.0)
    outputs = [
        health(shm, "-v"),
        S.cli("health", "--dir", str(shm), "--json", "--interval", "0"),
        S.cli("status", "--dir", str(shm), "--interval", "0"),
        S.cli("status", "--dir", str(shm), "--json", "--interval", "0"),
    ]
    for proc in outputs:
        assert secret not in proc.stdout + proc.stderr
    status = json.loads(outputs[3].stdout)["agents"][0]
    assert status["authentication"] == "****"
    assert status["backends"] == ["https://user:****@oap:12800"]
    assert status["backend"]["last_error"] == "UNAUTHENTICATED: bad authentication=****"


def test_text_output_fits_80_columns(shm: Path, procs: Any, new_arena: Any) -> None:
    long = "a-really-long-service-name-" * 8
    arena = new_arena(meta={"service": long, "namespace": long}, slots=6)
    instances = {str(i): {"pid": 1, "instance": long + str(i), "last_keepalive_ns": 1} for i in range(6)}
    doc = S.document(
        backend={
            "address": "very-long-host-name." * 6 + ":11800",
            "state": "failing",
            "consecutive_failures": 123456,
            "last_error": "StatusCode.UNAVAILABLE:\n" + "failed to connect to all addresses; " * 10,
        },
        instances=instances,
        spool={"enabled": True, "bytes": 10**12, "cap": 10**12, "records": 10**11},
        sent={"segment": 10**15},
    )
    procs.reporter(arena, doc, drain=False, error_ago_s=0.0)
    for _ in range(3):
        procs.writer(arena, count=10**3, size=50)
    outputs = [health(shm, "-v"), health(shm), S.cli("status", "--dir", str(shm), "--interval", "0.3")]
    for proc in outputs:
        lines = (proc.stdout + proc.stderr).splitlines()
        assert len(lines) >= 3
        too_wide = [ln for ln in lines if len(ln) > 80]
        assert not too_wide, too_wide
