"""``swmp status`` against real arenas, a stand-in reporter process and real ring writers."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest

from swmp.ops.schema import STATUS_SCHEMA
from tests import test_cli_support as support

STATUS = jsonschema.Draft202012Validator(STATUS_SCHEMA)  # built once: validate() re-checks the schema


S = support  # the helpers, under the short name these tests use


@pytest.fixture
def running(procs: Any, new_arena: Any) -> dict[str, Any]:
    """An agent with a draining reporter (backend ok) and two workers that wrote 30 records."""
    arena = new_arena(meta={"namespace": "prod", "mode": "process"})
    w1, i1 = procs.writer(arena, count=30)
    w2, i2 = procs.writer(arena, count=30)
    instances = {
        str(i["slot"]): {"pid": w.pid, "instance": f"inst-{i['slot']}", "last_keepalive_ns": 1}
        for w, i in ((w1, i1), (w2, i2))
    }
    doc = S.document(
        instances=instances,
        sent={"segment": 57, "management": 3},
        retried=4,
        spool={"enabled": True, "bytes": 2048, "cap": 1 << 20, "records": 2, "spooled": 9},
        rates={"read_per_s": 12.5, "sent_per_s": 11.0},
        restarts=1,
    )
    rep = procs.reporter(arena, doc, success_ago_s=0.0)
    # Drained, and the document saying so published (the stand-in publishes after it reads).
    S.wait_for(lambda: all(arena.ring_stats(s).used == 0 for s in range(arena.slots)), what="drain")
    S.wait_for(
        lambda: orjson.loads(arena.status.snapshot().document)["read"] == {"segment": 60}, what="the count"
    )
    return {"arena": arena, "reporter": rep, "workers": [(w1, i1), (w2, i2)]}


def status(shm: Path, *args: str) -> Any:
    return S.cli("status", "--dir", str(shm), *args)


def test_status_table(shm: Path, running: dict[str, Any]) -> None:
    proc = status(shm, "--interval", "0.3")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"service   svc  (namespace prod)  grpc  process mode  owner pid {os.getpid()}"
    assert lines[1].startswith("backend   127.0.0.1:11800  ok  last success ")
    rep = running["reporter"]
    assert lines[2].startswith(f"reporter  pid {rep.pid}  up ") and "restarts 1" in lines[2]
    assert lines[3] == "totals    sent 60  retried 4  failed 0  spooled 9  dropped 0"
    assert lines[4] == "rates     written 0.0/s  read 12.5/s  sent 11.0/s"
    assert lines[5] == "buffers   pending 0 B  spool 2.0 KiB of 1.0 MiB (2 records)"
    assert lines[6].split() == ["SLOT", "PID", "INSTANCE", "WRITTEN", "DROPPED", "FILL", "REC/S"]
    rows = {int(ln.split()[0]): ln.split() for ln in lines[7:9]}
    for w, info in running["workers"]:
        assert rows[info["slot"]] == [
            str(info["slot"]),
            str(w.pid),
            f"inst-{info['slot']}",
            "30",
            "0",
            "0%",
            "0.0",
        ]
    assert lines[9] == "   + 2 free slot(s)"
    assert all(len(ln) <= 80 for ln in lines)


def test_status_json(shm: Path, running: dict[str, Any]) -> None:
    rc, doc = S.cli_json("status", "--dir", str(shm), "--interval", "0.2")
    assert rc == 0
    STATUS.validate(doc)
    (agent,) = doc["agents"]
    assert agent["service"] == "svc" and agent["namespace"] == "prod" and agent["mode"] == "process"
    assert agent["reporter"]["pid"] == running["reporter"].pid and agent["reporter"]["alive"]
    assert agent["backend"]["state"] == "ok" and agent["backend"]["last_success_age_s"] < 60
    assert agent["totals"] == {
        "written": 60,
        "ring_dropped": 0,
        "ring_skipped": 0,
        "unbuilt": 0,
        "stale": 0,
        "prestart": 0,
        "bad_input": 0,
        "read": 60,
        "sent": 60,
        "retried": 4,
        "failed": 0,
        "reporter_dropped": 0,
        "no_slot_dropped": 0,
        "no_slot_workers": 0,
        "helper_dropped": 0,
        "master_dropped": 0,
        "late_dropped": 0,
        "spooled": 9,
    }
    by_slot = {s["slot"]: s for s in agent["slots"]}
    for w, info in running["workers"]:
        s = by_slot[info["slot"]]
        assert (s["pid"], s["alive"], s["written"], s["read"], s["used_bytes"]) == (w.pid, True, 30, 30, 0)
        assert s["records_per_s"] == 0.0  # nothing written during the interval
    assert agent["idle_slots"] == 2

    # --interval 0: one reading, no rates of our own.
    rc, doc = S.cli_json("status", "--dir", str(shm), "--interval", "0")
    STATUS.validate(doc)
    assert doc["agents"][0]["rates"]["written_per_s"] is None


def test_status_rates_and_dead_workers(shm: Path, procs: Any, new_arena: Any) -> None:
    arena = new_arena()
    procs.reporter(arena, S.document(), success_ago_s=0.0)
    _, busy_info = procs.writer(arena, count=0, rate=200)
    gone, gone_info = procs.writer(arena, count=5)
    os.kill(gone.pid, signal.SIGKILL)
    gone.wait(timeout=30)
    rc, doc = S.cli_json("status", "--dir", str(shm), "--interval", "0.5")
    assert rc == 0
    STATUS.validate(doc)
    by_slot = {s["slot"]: s for s in doc["agents"][0]["slots"]}
    assert by_slot[busy_info["slot"]]["records_per_s"] > 0
    dead = by_slot[gone_info["slot"]]
    assert (dead["alive"], dead["pid"], dead["last_pid"], dead["written"]) == (False, None, gone.pid, 5)
    assert doc["agents"][0]["rates"]["written_per_s"] > 0
    text = status(shm, "--interval", "0")
    row = next(ln for ln in text.stdout.splitlines() if ln.split()[:1] == [str(gone_info["slot"])])
    assert row.split()[1] == f"({gone.pid})"


def test_status_watch(shm: Path, running: dict[str, Any]) -> None:
    proc = status(shm, "--watch", "--count", "2", "--interval", "0.2")
    assert proc.returncode == 0, proc.stderr
    frames = [ln for ln in proc.stdout.splitlines() if ln.startswith("swmp status ")]
    assert len(frames) == 2
    assert proc.stdout.count("service   svc") == 2
    assert "\x1b[" not in proc.stdout  # not a terminal: frames follow each other

    proc = status(shm, "--watch", "--count", "3", "--interval", "0.2", "--json")
    docs = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert len(docs) == 3
    for d in docs:
        STATUS.validate(d)
        assert d["agents"][0]["slots"][0]["records_per_s"] is not None

    assert status(shm, "--watch", "--interval", "0").returncode == 2


def test_status_watch_redraws_in_place_on_a_terminal(shm: Path, running: dict[str, Any]) -> None:
    import pty
    import subprocess

    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "swmp.cli", "status", "--dir", str(shm), "--watch", "--count", "2",
             "--interval", "0.2"],
            cwd=S.REPO, env=S.env(), stdout=follower, stderr=subprocess.PIPE, timeout=60, check=False,
        )  # fmt: skip
        os.close(follower)
        follower = -1
        out = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the writer side is closed and drained
                break
            if not chunk:
                break
            out += chunk
    finally:
        if follower >= 0:
            os.close(follower)
        os.close(leader)
    assert proc.returncode == 0
    assert out.count(b"\x1b[H\x1b[2J") == 2


def test_status_without_agents(shm: Path) -> None:
    proc = status(shm)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "no agent found" in proc.stderr
    rc, doc = S.cli_json("status", "--dir", str(shm))
    assert rc == 2
    STATUS.validate(doc)
    assert doc["agents"] == [] and doc["error"].startswith("no agent found")
