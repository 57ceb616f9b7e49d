"""A chord on a result backend without native chord support: ``celery.chord_unlock`` polling.

The Redis backend (tested in tests/test_prefork_celery.py) sends a chord's callback from the
header run that completes the group. The SQLAlchemy database backend (like every backend
that keeps Celery's ``fallback_chord_unlock``; ``rpc://`` refuses chords) instead has the
publisher send ``celery.chord_unlock`` next to the header tasks; that task retries itself
(a new message, with a countdown) until the group is ready, then sends the callback. Each of
those messages must carry the trace on: one chain of runs, every one in the publisher's trace.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.celery_support import celery_env, new_queue, publish_canvas, run_celery, succeeded, worker_command
from tests.servers import collector_process, entry_span, exit_spans, quiet_for, segments_of, wait_until
from tests.test_prefork_celery import broker_url, check_agent_quiet, child_names
from tests.test_web_servers import tags_of

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]

APP = "tests.e2e_apps.celery_chord_unlock"
UNLOCK = "celery/celery.chord_unlock"
GATE_RETRIES = 2  # the header tasks wait for this many chord_unlock retries
_UNLOCK_RETRY = re.compile(r"Task celery\.chord_unlock\[[0-9a-f-]+\] retry: Retry in ")
_TSUM_DONE = re.compile(r"Task unlock\.tsum\[[0-9a-f-]+\] succeeded")


@pytest.mark.parametrize("broker_kind", ["redis", "rabbitmq"])
def test_chord_unlock_polling_stays_in_the_publishers_trace(
    tmp_path: Path, request: pytest.FixtureRequest, broker_kind: str
) -> None:
    """A chord of 3 ``add`` + ``tsum`` on the sqlite database backend, sent from one entry span
    to a prefork worker with 4 children (one free for ``chord_unlock`` while the header tasks
    wait for its retries): every header run, every ``chord_unlock`` run (retries included) and
    the callback run arrive once, in the publisher's trace, each hanging off the exit span
    that sent its message; the polling runs that retried are marked as retries, and the
    callback hangs off the exit span inside the ``chord_unlock`` run that found the group ready."""
    n = 3
    broker, queue = broker_url(request, broker_kind), new_queue()
    gate = tmp_path / "gate"
    gate.mkdir()
    extra = {
        "CELERY_RESULT_BACKEND": f"db+sqlite:///{tmp_path / 'results.db'}",
        "CHORD_GATE_DIR": str(gate),
        "CHORD_GATE_RETRIES": str(GATE_RETRIES),
    }
    with collector_process(tmp_path) as col:
        env_w = celery_env(tmp_path / "cel", col.grpc_address, broker, queue, extra=extra)
        env_p = celery_env(tmp_path / "pub", col.grpc_address, broker, queue, service="pub", extra=extra)
        with run_celery(tmp_path, env_w, worker_command("prefork", 4, app=APP), children=4) as worker:
            results = publish_canvas(env_p, n, tmp_path, module=APP)
            assert results["chord"] == sum(2 * i for i in range(n))
            # The callback's result is stored inside its run: wait for the worker's log line.
            wait_until(lambda: _TSUM_DONE.search(worker.proc.log()) is not None, 30, "the callback run")
            log = worker.proc.log()
            retries = len(_UNLOCK_RETRY.findall(log))
            assert retries >= GATE_RETRIES, log[-3000:]
            runs_expected = n + (retries + 1) + 1  # headers, chord_unlock runs, callback
            wait_until(lambda: len(succeeded(worker)) >= n + 2, 30, "every run to succeed")
            wait_until(lambda: len(segments_of(col, "cel")) >= runs_expected, 30, f"{runs_expected} runs")
            wait_until(lambda: len(segments_of(col, "pub")) >= 1, 30, "the publisher's segment")
            quiet_for(col, 0.5)
            log = worker.proc.log()
        assert len(_UNLOCK_RETRY.findall(log)) == retries

    trace_id = results["trace_id"]
    (pub,) = segments_of(col, "pub")
    assert pub["traceId"] == trace_id and entry_span(pub)["operationName"] == "/chord"
    runs = segments_of(col, "cel")
    ops = Counter(entry_span(s)["operationName"] for s in runs)
    assert ops == {"celery/unlock.add": n, UNLOCK: retries + 1, "celery/unlock.tsum": 1}
    assert {s["traceId"] for s in runs} == {trace_id}
    assert {s["serviceInstance"] for s in runs} <= child_names(4)

    exits: dict[tuple[str, int], tuple[dict[str, Any], dict[str, Any]]] = {}
    for seg in [pub, *runs]:
        for span in exit_spans(seg):
            if span["operationName"].startswith("celery/"):
                exits[(seg["traceSegmentId"], int(span.get("spanId", 0)))] = (seg, span)
    pub_ops = Counter(span["operationName"] for seg, span in exits.values() if seg is pub)
    assert pub_ops == {"celery/unlock.add": n, UNLOCK: 1}  # the header and the first poll

    parent_of: dict[str, dict[str, Any]] = {}  # run segment id -> the segment that sent it
    where = urlsplit(broker)
    peer = f"{where.hostname}:{where.port}"
    for run in runs:
        entry = entry_span(run)
        assert entry["componentId"] == 7011 and entry["spanLayer"] == "MQ"
        (ref,) = entry["refs"]
        assert ref.get("refType", "CrossProcess") == "CrossProcess"
        sender, sent = exits.pop((ref["parentTraceSegmentId"], int(ref.get("parentSpanId", 0))))
        assert sent["operationName"] == entry["operationName"]
        assert ref["parentEndpoint"] == entry_span(sender)["operationName"]
        assert ref["parentService"] == sender["service"]
        assert ref["parentServiceInstance"] == sender["serviceInstance"]
        assert ref["networkAddressUsedAtPeer"] == sent["peer"] == peer
        parent_of[run["traceSegmentId"]] = sender
    assert not exits  # every publish has exactly one run

    for run in runs:
        if entry_span(run)["operationName"] == "celery/unlock.add":
            assert parent_of[run["traceSegmentId"]] is pub

    # The chord_unlock runs: one chain from the publisher, the k-th retry sent by the run
    # before it; every run but the last asked for a retry, the last sent the callback.
    unlocks = sorted(
        (r for r in runs if entry_span(r)["operationName"] == UNLOCK),
        key=lambda r: int(tags_of(entry_span(r)).get("celery.retries", "0")),
    )
    assert parent_of[unlocks[0]["traceSegmentId"]] is pub
    for k, run in enumerate(unlocks):
        entry, tags = entry_span(run), tags_of(entry_span(run))
        assert tags.get("celery.retries", "0") == str(k)
        if k:
            assert parent_of[run["traceSegmentId"]] is unlocks[k - 1]
        if k < retries:
            assert tags["retry"].startswith("Retry in "), tags
            assert entry["isError"]
            assert [s["operationName"] for s in exit_spans(run)] == [UNLOCK]
        else:
            assert "retry" not in tags and not entry.get("isError", False), entry
            assert [s["operationName"] for s in exit_spans(run)] == ["celery/unlock.tsum"]
    (callback,) = [r for r in runs if entry_span(r)["operationName"] == "celery/unlock.tsum"]
    assert parent_of[callback["traceSegmentId"]] is unlocks[-1]
    check_agent_quiet(log)
