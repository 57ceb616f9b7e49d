"""Log reporting under real Gunicorn (``swmp run``), counted at the test collector.

One server runs tests/e2e_apps/logging_app.py, which reconfigures logging the way
applications do (``dictConfig`` of the root logger at import, ``basicConfig(force=True)``,
a handler reset, a ``propagate=False`` logger, loguru after ``logger.remove()``, structlog)
and logs from a thread pool and a thread. Every request carries its own trace id; every
message must arrive exactly once, with that trace id. A second server checks the prefork
master's own records (start-up, worker timeout) and a layout that cannot work.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.collector import CollectorProcess, free_port
from tests.servers import (
    SWMP_RUN,
    Proc,
    agent_env,
    collector_process,
    gunicorn_command,
    messages,
    request,
    run_server,
    segments_of,
    wait_until,
)

pytestmark = [pytest.mark.servers, pytest.mark.timeout(180)]

LAYOUT = "[%(tid)s] %(levelname)s %(name)s: %(message)s"
CASES = ("dictconfig", "force", "reset", "quiet", "loguru", "structlog", "pool", "thread")


def logs_of(col: CollectorProcess, service: str) -> list[dict[str, Any]]:
    return [m for m in messages(col, "log") if m.get("service") == service]


def body(log: dict[str, Any]) -> str:
    return str(log["body"]["text"]["text"])


def tags(log: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t.get("value", "") for t in log.get("tags", {}).get("data", [])}


def test_logs_survive_the_applications_logging_setup(tmp_path: Path) -> None:
    app_log = tmp_path / "app.log"
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(
            tmp_path,
            col.grpc_address,
            service="logs",
            extra={
                "SW_AGENT_LOG_REPORTER_ACTIVE": "true",
                "SW_AGENT_LOG_REPORTER_LAYOUT": LAYOUT,
                "APP_LOG_FILE": str(app_log),
            },
        )
        cmd = gunicorn_command(port, app="tests.e2e_apps.logging_app:app", workers=1)
        with run_server("gunicorn", tmp_path, cmd, env, port=port, workers=1) as srv:
            traces = {case: f"{case}-{uuid.uuid4().hex}" for case in CASES}
            keys = {case: uuid.uuid4().hex[:12] for case in CASES}
            for case in CASES:  # in order: /force and /reset change the root logger for later ones
                r = request(port, f"/{case}?key={keys[case]}", traces[case])
                assert r.status == 200, (case, r, srv.proc.tail())

            def find(case: str, label: str | None = None) -> list[dict[str, Any]]:
                # structlog's console renderer pads the event: any run of spaces between.
                needle = re.compile(rf"case={label or case}\s+key={keys[case]}")
                return [m for m in logs_of(col, "logs") if needle.search(body(m))]

            wanted = [(c, c) for c in CASES] + [("quiet", "gunicorn")]
            try:
                wait_until(lambda: all(find(c, lab) for c, lab in wanted), 30, "every case's log record")
            except AssertionError:
                missing = [lab for c, lab in wanted if not find(c, lab)]
                got = [body(m) for m in logs_of(col, "logs")]
                raise AssertionError(f"no record for {missing}; got {got}\n{srv.proc.tail()}") from None
            wait_until(lambda: len(segments_of(col, "logs")) >= len(CASES) + 2, 30, "the segments")
            segments = segments_of(col, "logs")

            for case, label in wanted:
                (log,) = find(case, label)  # exactly once, whatever the path
                assert log["traceContext"]["traceId"] == traces[case], (case, label, log)
                assert log["serviceInstance"] == "logs-w0"
                t = tags(log)
                assert t["level"] in ("WARNING", "warning")
                if case == "loguru":
                    assert t["logger"] == "loguru" and body(log) == f"case=loguru key={keys[case]}"
                elif case == "structlog":
                    assert t["logger"] == "structlog" and f"key={keys[case]}" in body(log)
                else:  # stdlib: the configured layout, %(tid)s included
                    assert body(log).startswith(f"[{traces[case]}] WARNING {t['logger']}: "), body(log)
                    assert log["endpoint"] if case not in ("pool", "thread") else True

            # Threads continue the request's trace: their span's segment refers to the entry's.
            for case in ("pool", "thread"):
                (seg,) = [s for s in segments if s["spans"][0]["operationName"] == f"background/{case}"]
                (entry,) = [s for s in segments if s["spans"][-1]["operationName"] == f"/{case}"]
                assert seg["traceId"] == traces[case]
                ref = seg["spans"][0]["refs"][0]
                assert ref["refType"] == "CrossThread"
                assert ref["parentTraceSegmentId"] == entry["traceSegmentId"]
                (log,) = find(case)
                assert log["traceContext"]["traceSegmentId"] == seg["traceSegmentId"]

            # The application's own formatter printed the trace id (the record attribute).
            text = app_log.read_text()
            assert f"tid={traces['dictconfig']} WARNING app.views case=dictconfig" in text
            assert "cannot format" not in srv.proc.log()


def test_master_logs_and_a_bad_layout(tmp_path: Path) -> None:
    """The arbiter's records (start-up, a worker timeout) arrive from the master instance
    over the reporter; a layout that cannot format records is reported once and replaced."""
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(
            tmp_path,
            col.grpc_address,
            service="m",
            extra={
                "SW_AGENT_LOG_REPORTER_ACTIVE": "true",
                "SW_AGENT_LOG_REPORTER_LEVEL": "INFO",
                "SW_AGENT_LOG_REPORTER_LAYOUT": "%(message",  # not a valid %-style layout
            },
        )
        cmd = gunicorn_command(port, workers=1, timeout=2)
        with run_server("gunicorn", tmp_path, cmd, env, port=port, workers=1) as srv:
            assert request(port, "/cpu").status == 200
            hung = request(port, "/sleep?s=30", timeout=60)
            assert hung.status != 200  # the master killed the worker serving it
            srv.proc.wait_log(r"WORKER TIMEOUT \(pid:\d+\)", count=1)

            def master_logs() -> list[dict[str, Any]]:
                return [m for m in logs_of(col, "m") if m["serviceInstance"] == "m-master"]

            timeout_seen = lambda: any("WORKER TIMEOUT" in body(m) for m in master_logs())  # noqa: E731
            wait_until(timeout_seen, 30, "the master's timeout record")
            bodies = [body(m) for m in master_logs()]
            stamp = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
            default = stamp + r" \[MainThread\] (INFO|CRITICAL) gunicorn\.error - "  # the default layout
            assert any(re.match(default + r"Starting gunicorn", b) for b in bodies), bodies
            assert any(re.match(default + r"WORKER TIMEOUT \(pid:\d+\)", b) for b in bodies), bodies

            # The worker's own records come from its instance, not the master's.
            def booted() -> bool:
                logs = logs_of(col, "m")
                return any("Booting worker" in body(m) and m["serviceInstance"] == "m-w0" for m in logs)

            wait_until(booted, 30, "a worker's start-up record")
            assert srv.proc.log().count("SW_AGENT_LOG_REPORTER_LAYOUT='%(message' cannot format") == 1
            # The master's instance was announced like a worker's, on the highest slot.
            props = [p for p in messages(col, "properties") if p["serviceInstance"] == "m-master"]
            assert props, "the master instance was never announced"


def test_a_start_up_error_reaches_the_backend(tmp_path: Path) -> None:
    """The worker cannot import the application and exits; the master logs that and shuts
    down. Both records arrive (the reporter drains the rings after the master is gone)."""
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(
            tmp_path, col.grpc_address, service="b", extra={"SW_AGENT_LOG_REPORTER_ACTIVE": "true"}
        )
        cmd = gunicorn_command(port, app="tests.e2e_apps.broken_app:app", workers=1)
        proc = Proc([*SWMP_RUN, *cmd], env, tmp_path / "broken.log", marker=env["SW_AGENT_ARENA_DIR"])
        proc.start()
        try:
            assert proc.wait_exit(60) is not None, proc.tail()  # Gunicorn gives up: worker failed to boot
            assert "Worker failed to boot" in proc.log()

            def arrived() -> bool:
                logs = logs_of(col, "b")
                master = [m for m in logs if m["serviceInstance"] == "b-master"]
                worker = [m for m in logs if m["serviceInstance"] == "b-w0"]
                return any(
                    re.search(r"Worker \(pid:\d+\) exited with code 3", body(m)) for m in master
                ) and any("configuration missing (on purpose)" in body(m) for m in worker)

            wait_until(arrived, 30, "the master's and the worker's start-up error records")
        finally:
            proc.stop()
