"""Refused profile commands reach ``swmp status``: a program started with the agent (its
reporter process polls the in-test collector over gRPC), a command SkyWalking would not
create queued there, and the real ``swmp status`` (text and ``--json``) reading the count
from the reporter's status document."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jsonschema

from swmp.ops.schema import STATUS_SCHEMA
from tests import test_cli_support as S
from tests.collector import Collector
from tests.test_agent_launcher import base_env

STATUS = jsonschema.Draft202012Validator(STATUS_SCHEMA)

PROGRAM = textwrap.dedent(
    """
    import sys
    import swmp
    swmp.start()
    with swmp.entry_span("/ready"):
        pass
    print("started", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    """
)


def status(shm: Path) -> dict[str, Any]:
    rc, doc = S.cli_json("status", "--dir", str(shm), "--interval", "0")
    assert rc == 0, doc
    return doc


def refused(shm: Path) -> int | None:
    agents = status(shm)["agents"]
    return agents[0].get("profile", {}).get("commands_refused") if agents else None


def test_a_refused_profile_command_is_counted_in_swmp_status(tmp_path: Path) -> None:
    with Collector(enable_http=False) as collector:
        collector.add_profile_task("too-long", "/slow", duration_min=16)  # SkyWalking: 1..15 minutes
        collector.add_profile_task("fine", "/slow", duration_min=1)
        env = base_env(
            tmp_path,
            collector,
            SW_AGENT_PROFILE_ACTIVE="true",
            SW_AGENT_COLLECTOR_GET_PROFILE_TASK_INTERVAL="1",
        )
        shm = tmp_path / "shm"
        app = subprocess.Popen(
            [sys.executable, "-c", PROGRAM],
            env=env, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert app.stdout is not None and app.stdout.readline() == b"started\n", app.stderr
            # The reporter polls once its worker is announced; the collector hands the
            # commands out on the first query only, so the count stays at what was refused.
            S.wait_for(lambda: collector.profile_queries, 60, "the reporter to poll for profile tasks")
            S.wait_for(lambda: refused(shm) == 1, 30, "swmp status to count the refused command")
            doc = status(shm)
            STATUS.validate(doc)
            assert doc["agents"][0]["profile"] == {"commands_refused": 1}
            text = S.cli("status", "--dir", str(shm), "--interval", "0")
            assert text.returncode == 0, text.stderr
            rows = [line for line in text.stdout.splitlines() if line.startswith("profile ")]
            assert len(rows) == 1 and "commands refused 1" in rows[0], text.stdout
        finally:
            assert app.stdin is not None
            app.stdin.close()
            try:
                app.wait(timeout=60)
            except subprocess.TimeoutExpired:
                app.kill()
                app.wait()
