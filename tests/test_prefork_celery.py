"""Celery end to end: real brokers, a real web front end, real workers, the test collector.

A Flask app under Gunicorn (``swmp run``) enqueues tasks that a Celery worker (``swmp run
-- celery ... worker``) runs. Each test counts what was sent and checks what arrived:
one segment per task run, linked to the request that sent it, reported by the pool child
that ran it (``<service>-w<slot>``), one reporter per application, nothing committed lost
when children are recycled, SIGKILLed, or the worker shuts down under load.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.brokers import RabbitMQBroker
from tests.celery_support import (
    CELERY,
    celery_env,
    deliveries,
    new_queue,
    publish,
    publish_canvas,
    run_celery,
    slot_claims,
    succeeded,
    wait_exit,
    worker_command,
)
from tests.collector import CollectorProcess, free_port
from tests.daemons import ServerInfo
from tests.servers import (
    Result,
    announced,
    check_announced,
    collector_process,
    entry_span,
    exit_spans,
    gunicorn_command,
    load,
    quiet_for,
    run_server,
    segments_of,
    wait_segments,
    wait_until,
)
from tests.servers import (
    request as get,
)

pytestmark = [pytest.mark.servers, pytest.mark.timeout(180)]

WEB_APP = "examples.celery_app:web"
TASK_OP = "celery/examples.work"


def broker_url(request: pytest.FixtureRequest, kind: str) -> str:
    if kind == "redis":
        redis: ServerInfo = request.getfixturevalue("redis_server")
        return f"redis://127.0.0.1:{redis.port}/5"
    rabbit: RabbitMQBroker = request.getfixturevalue("rabbitmq")
    return rabbit.url


def web_env(tmp_path: Path, col: CollectorProcess, broker: str, queue: str) -> dict[str, str]:
    return celery_env(tmp_path / "web", col.grpc_address, broker, queue, service="web")


def task_ids(result: Result) -> list[str]:
    ids: list[str] = orjson.loads(result.body)
    return ids


def check_linked(col: CollectorProcess, web_service: str, cel_service: str) -> dict[str, dict[str, Any]]:
    """Every task segment's entry span has one CrossProcess ref to one web exit span, and no
    exit span is referenced twice. Returns the task segments by trace id (one per trace)."""
    exits = {}
    for seg in segments_of(col, web_service):
        for span in exit_spans(seg):
            if span["operationName"] == TASK_OP:
                exits[(seg["traceSegmentId"], int(span.get("spanId", 0)))] = (seg, span)
    used: Counter[tuple[str, int]] = Counter()
    for seg in segments_of(col, cel_service):
        entry = entry_span(seg)
        assert entry["operationName"] == TASK_OP
        assert entry["spanLayer"] == "MQ" and entry["componentId"] == 7011
        (ref,) = entry["refs"]
        assert ref.get("refType", "CrossProcess") == "CrossProcess"
        key = (ref["parentTraceSegmentId"], int(ref.get("parentSpanId", 0)))
        parent_seg, parent = exits[key]
        used[key] += 1
        assert seg["traceId"] == parent_seg["traceId"]
        assert ref["parentService"] == web_service
        assert ref["parentServiceInstance"] == parent_seg["serviceInstance"]
        assert ref["parentEndpoint"] == "/enqueue"
        assert ref["networkAddressUsedAtPeer"] == parent["peer"]
    assert not used or max(used.values()) == 1
    return {seg["traceId"]: seg for seg in segments_of(col, cel_service)}


_AGENT_TROUBLE = re.compile(r"Traceback|swmp:|ring slot|invalid record|lost [1-9]")


def check_agent_quiet(log: str) -> None:
    """Nothing from the agent in a worker's output: no error or warning, no corrupt ring,
    no record lost (the reporter's exit line says ``lost 0`` in thread mode)."""
    found = _AGENT_TROUBLE.search(log)
    assert found is None, log[max(0, found.start() - 2000) : found.end() + 500]


def child_names(n: int, service: str = "cel") -> set[str]:
    return {f"{service}-w{i}" for i in range(n)}


# -- the main scenario -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("broker_kind", "reporter_process"),
    [
        pytest.param("redis", True, id="redis"),
        pytest.param("rabbitmq", True, id="rabbitmq"),
        pytest.param("redis", False, id="redis-inprocess"),
    ],
)
def test_web_requests_enqueue_tasks_run_by_prefork_children(
    tmp_path: Path, request: pytest.FixtureRequest, broker_kind: str, reporter_process: bool
) -> None:
    """90 requests x 2 tasks through Gunicorn -> broker -> 4 prefork children recycled every
    25 tasks: every task's segment arrives once, linked to its request, from a child."""
    broker, queue = broker_url(request, broker_kind), new_queue()
    with collector_process(tmp_path) as col:
        port = free_port()
        env_w = celery_env(tmp_path / "cel", col.grpc_address, broker, queue)
        env_w["SW_AGENT_REPORTER_PROCESS"] = "true" if reporter_process else "false"
        cmd_w = worker_command("prefork", 4, ["--max-tasks-per-child", "25"])
        cmd_web = gunicorn_command(port, app=WEB_APP, workers=2)
        with (
            run_celery(tmp_path, env_w, cmd_w, children=4) as worker,
            run_server(
                "gunicorn", tmp_path, cmd_web, web_env(tmp_path, col, broker, queue), port=port, workers=2
            ),
        ):
            first_children = set(worker.worker_pids())
            results = load(port, ["/enqueue?n=2"], 90, concurrency=6, traced_every=1)
            assert all(r.status == 200 for r in results), Counter((r.status, r.error) for r in results)
            sent = {tid: r.trace_id for r in results for tid in task_ids(r)}
            assert len(sent) == 180
            wait_until(lambda: len(succeeded(worker)) >= 180, 60, "180 tasks to succeed")
            wait_segments(col, 180, "cel", timeout=30)
            quiet_for(col, 0.5)

            by_trace = check_linked(col, "web", "cel")
            cel = segments_of(col, "cel")
            assert len(cel) == 180
            got = Counter(s["traceId"] for s in cel)
            assert got == Counter(sent.values())  # two tasks per request
            assert set(by_trace) == {r.trace_id for r in results}

            # Instances are the pool children, named after their slots: with 180 tasks and
            # recycling every 25, far more than 4 children existed, yet only 4 names.
            assert {s["serviceInstance"] for s in cel} <= child_names(4)
            assert first_children - set(worker.worker_pids())  # some were recycled
            # Announcements go out on the reporter's keeper round (once a second), not with
            # the segments: wait for them. Every child is announced once, also one recycled
            # before its first round (its successor in the slot does not hide it).
            check_announced(col, worker, "cel")

            def cel_pids() -> set[int]:
                return {
                    int(p["Process No."])
                    for (svc, _), reps in announced(col).items()
                    if svc == "cel"
                    for p in reps
                }

            wait_until(lambda: len(cel_pids()) > 4, 10, "the recycled children announced")
            assert {inst for (svc, inst) in announced(col) if svc == "cel"} == child_names(4)
            assert len(worker.reporters()) == (1 if reporter_process else 0)
            assert "ring slots" not in worker.proc.log()


# -- losing nothing that was committed --------------------------------------------------------
def test_sigkill_of_a_child_and_warm_shutdown_under_load(tmp_path: Path, redis_server: ServerInfo) -> None:
    """A child is SIGKILLed in the middle of a long task, then the worker gets SIGTERM while
    requests keep enqueuing: every task the worker reported as succeeded has its segment,
    exactly once; the replacement child took the killed one's slot."""
    broker, queue = f"redis://127.0.0.1:{redis_server.port}/6", new_queue()
    with collector_process(tmp_path) as col:
        port = free_port()
        env_w = celery_env(tmp_path / "cel", col.grpc_address, broker, queue)
        cmd_web = gunicorn_command(port, app=WEB_APP, workers=2)
        with (
            run_celery(tmp_path, env_w, worker_command("prefork", 4), children=4) as worker,
            run_server(
                "gunicorn", tmp_path, cmd_web, web_env(tmp_path, col, broker, queue), port=port, workers=2
            ),
        ):
            slots_before = worker.live_slots()
            marker = tmp_path / "sleeper.pid"
            long_run = get(port, f"/enqueue?task=sleep&s=60&marker={marker}", trace_id="f" * 32)
            assert long_run.status == 200
            wait_until(
                lambda: marker.exists() and marker.read_text().strip().isdigit(), 30, "the sleeper to start"
            )
            victim = int(marker.read_text())
            assert victim in slots_before.values()

            stop = threading.Event()
            lock = threading.Lock()
            answered = 0
            terminated_at = 0  # requests answered when SIGTERM went out (0: not yet)

            def on_result(res: Result) -> None:
                nonlocal answered, terminated_at
                with lock:
                    answered += res.status == 200
                    if answered == 80:
                        os.kill(victim, signal.SIGKILL)
                    # Warm shutdown under load, once the worker has finished the tasks the
                    # checks below need (its pace depends on the machine, not on this test).
                    if not terminated_at and answered >= 200 and len(succeeded(worker)) >= 80:
                        worker.proc.send(signal.SIGTERM)
                        terminated_at = answered
                    if terminated_at and answered >= terminated_at + 60:
                        stop.set()

            results = load(
                port, ["/enqueue?n=1"], 1000, concurrency=4, traced_every=1, stop=stop, on_result=on_result
            )
            if not terminated_at:  # the worker never got there: stop it; the count check fails
                worker.proc.send(signal.SIGTERM)
            assert wait_exit(worker) == 0, worker.proc.tail()
            wait_until(lambda: not worker.arena_path().exists(), 30, "the arena to be removed")
            sent = {tid: r.trace_id for r in results if r.status == 200 for tid in task_ids(r)}
            done = succeeded(worker)
            assert len(done) >= 80, len(done)
            assert done <= set(sent)  # the sleeper never succeeded
            quiet_for(col, 1.0)
            got = Counter(s["traceId"] for s in segments_of(col, "cel"))
            missing = [t for t in done if got[sent[t]] != 1]
            assert not missing, f"{len(missing)} of {len(done)} succeeded tasks have no segment"
            assert max(got.values()) == 1
            assert "f" * 32 not in got  # the killed run never finished: no segment, no duplicate
            check_linked(col, "web", "cel")
            # The killed child's slot was taken by its replacement.
            log = worker.proc.log()
            assert f"pid:{victim} exited with 'signal 9 (SIGKILL)'" in log, log[-2000:]
            assert {s["serviceInstance"] for s in segments_of(col, "cel")} <= child_names(4)


BACKLOG = 3000
COLD_SHUTDOWN_S = 20.0  # Celery's cold shutdown of 4 children takes well under a second


def test_cold_shutdown_delivers_what_children_committed(tmp_path: Path, redis_server: ServerInfo) -> None:
    """SIGQUIT while 4 children work through a backlog: they are terminated at once, and every
    task the worker logged as succeeded has its segment; nothing of the agent is left."""
    broker, queue = f"redis://127.0.0.1:{redis_server.port}/10", new_queue()
    # A backlog queued before the worker starts, which its 4 children need seconds for (they
    # run ~1,000 of these tasks a second on an idle machine), so that the stop lands in the
    # middle of it. (Published while the worker ran, a loaded machine published no faster
    # than the children consumed, and the whole backlog was done before the stop.)
    sent = publish(broker, [queue], BACKLOG, tmp_path)[queue]
    with collector_process(tmp_path) as col:
        env = celery_env(tmp_path, col.grpc_address, broker, queue)
        with run_celery(tmp_path, env, worker_command("prefork", 4), children=4) as worker:
            wait_until(lambda: len(succeeded(worker)) >= 60, 60, "60 tasks to succeed")
            worker.proc.send(signal.SIGQUIT)
            code = wait_exit(worker, COLD_SHUTDOWN_S)
            if code is None:
                # Celery's own cold shutdown can hang (Celery 5.7, about 1 run in 40 here): when
                # SIGQUIT lands while the main process is between the parts of a job it writes
                # to a child, the shutdown puts its stop sentinel after the half-written job;
                # the child waits for the rest of that job and the pool's join for the child
                # (stacks: the main process in ``ResultHandler._flush_outqueue`` under
                # ``on_cold_shutdown``, the child in ``Connection._recv``). A supervisor ends
                # that with SIGKILL after its stop timeout (the children go with the main
                # process: Celery sets their parent-death signal); what is asked of the agent
                # below holds just the same.
                worker.proc.send(signal.SIGKILL)
                code = wait_exit(worker)
            assert code is not None, worker.proc.log()[-3000:]
            wait_until(lambda: not worker.arena_path().exists(), 30, "the arena to be removed")
            done = succeeded(worker)
            assert 60 <= len(done) < BACKLOG, len(done)  # stopped in the middle of the backlog
            quiet_for(col, 0.5)
            # Each task run is one segment: one segment id per run. Delivery is at-least-once
            # (docs/reporter.md): a batch whose send timed out under load, or that a restarted
            # reporter re-read from its ring, may arrive twice: the same segment, same content.
            runs: dict[str, dict[str, dict[str, Any]]] = {}
            for seg in segments_of(col, "cel"):
                first = runs.setdefault(seg["traceId"], {}).setdefault(seg["traceSegmentId"], seg)
                assert first == seg, ("one segment id, two contents", first, seg)
            task_of = {trace: task for task, trace in sent.items()}
            assert set(runs) <= set(task_of), set(runs) - set(task_of)
            # A task runs once per delivery of its message (the broker may deliver one again).
            received = deliveries(worker)
            extra = {t: sorted(ids) for t, ids in runs.items() if len(ids) > received[task_of[t]]}
            assert not extra, (extra, worker.proc.log()[-3000:])
            missing = [t for t in done if sent[t] not in runs]
            assert not missing, f"{len(missing)} of {len(done)} succeeded tasks have no segment"
            assert {s["serviceInstance"] for s in segments_of(col, "cel")} <= child_names(4)


def test_revoke_with_terminate_is_a_revoked_span(tmp_path: Path, redis_server: ServerInfo) -> None:
    """``revoke(terminate=True)`` kills the child running the task, so that run never finishes;
    the worker's main process reports the revocation as a failed entry span in the trace."""
    from celery import Celery

    from swmp.instrument._patch import original
    from tests.servers import sw8_header

    broker, queue = f"redis://127.0.0.1:{redis_server.port}/11", new_queue()
    app = Celery("revoker", broker=broker, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = True
    send = original(Celery, "send_task")  # this test process sends without the agent
    marker, trace_id = tmp_path / "sleeper.pid", "e" * 32
    with collector_process(tmp_path) as col:
        env = celery_env(tmp_path, col.grpc_address, broker, queue)
        with run_celery(tmp_path, env, worker_command("prefork", 2), children=2) as worker:
            sent = send(
                app, "examples.sleep", (60, str(marker)), queue=queue, headers={"sw8": sw8_header(trace_id)}
            )
            wait_until(
                lambda: marker.exists() and marker.read_text().strip().isdigit(), 30, "the sleeper to start"
            )
            app.control.revoke(sent.id, terminate=True, signal="SIGKILL")
            (seg,) = wait_segments(col, 1, "cel")
            span = entry_span(seg)
            assert seg["traceId"] == trace_id
            assert span["operationName"] == "celery/examples.sleep" and span["isError"]
            (log,) = span["logs"]
            fields = {kv["key"]: kv["value"] for kv in log["data"]}
            assert fields == {"event": "revoked", "message": "terminated by signal 9"}
            # Reported by the main process (it took a slot of its own), not by the killed child.
            # Which slot depends on timing: the lowest free one when the main process first
            # writes, which may be the one the killed child just left.
            instance = seg["serviceInstance"]
            assert instance in child_names(3), instance
            assert worker.live_slots()[int(instance.rpartition("-w")[2])] == worker.pid
    app.close()


def test_children_take_their_slots_with_the_instrumentation_disabled(
    tmp_path: Path, redis_server: ServerInfo
) -> None:
    """Slots and names of pool children are the agent's business, not the instrumentation's."""
    broker, queue = f"redis://127.0.0.1:{redis_server.port}/12", new_queue()
    with collector_process(tmp_path) as col:
        env = celery_env(
            tmp_path, col.grpc_address, broker, queue, extra={"SW_AGENT_DISABLE_PLUGINS": "sw_celery"}
        )
        with run_celery(tmp_path, env, worker_command("prefork", 2), children=2) as worker:
            publish(broker, [queue], 10, tmp_path)
            wait_until(lambda: len(succeeded(worker)) >= 10, 60, "10 tasks to succeed")
            check_announced(col, worker, "cel")
            quiet_for(col, 0.5)
            assert segments_of(col, "cel") == []


# -- other pools ---------------------------------------------------------------------------------
POOLS = ("solo", "threads", "gevent", "eventlet")


def test_other_pools_run_tasks_in_the_main_process(tmp_path: Path, redis_server: ServerInfo) -> None:
    """One worker per pool, side by side (each its own queue, service and arena): the main
    process runs the tasks and is the one instance; SIGTERM leaves nothing behind."""
    broker = f"redis://127.0.0.1:{redis_server.port}/7"
    with collector_process(tmp_path) as col, contextlib.ExitStack() as stack:
        queues = {pool: new_queue() for pool in POOLS}
        envs = {
            pool: celery_env(tmp_path / pool, col.grpc_address, broker, queues[pool], service=f"cel-{pool}")
            for pool in POOLS
        }
        # Started side by side (each still waited for until ready): one after the other, the
        # four start-ups (~2.5 s each, mostly imports) were most of the test's time.
        with ThreadPoolExecutor(len(POOLS)) as starting:
            started = {
                pool: starting.submit(
                    stack.enter_context, run_celery(tmp_path, envs[pool], worker_command(pool, 4), name=pool)
                )
                for pool in POOLS
            }
        workers = {pool: future.result() for pool, future in started.items()}
        by_queue = publish(broker, list(queues.values()), 40, tmp_path)
        traces = {pool: list(by_queue[queues[pool]].values()) for pool in POOLS}
        for pool, worker in workers.items():
            wait_until(lambda w=worker: len(succeeded(w)) >= 40, 60, f"40 tasks to succeed ({pool})")  # type: ignore[misc]
            wait_segments(col, 40, f"cel-{pool}")
        quiet_for(col, 0.3)
        for pool, worker in workers.items():
            segs = segments_of(col, f"cel-{pool}")
            assert Counter(s["traceId"] for s in segs) == Counter(traces[pool]), pool
            for seg in segs:
                (ref,) = entry_span(seg)["refs"]
                assert ref["parentTraceSegmentId"] == "client-segment"
            assert {s["serviceInstance"] for s in segs} == {f"cel-{pool}-w0"}, pool
            assert worker.live_slots() == {0: worker.pid}, pool
            assert len(worker.reporters()) == 1, pool
            worker.proc.send(signal.SIGTERM)
        for pool, worker in workers.items():
            assert wait_exit(worker) == 0, (pool, worker.proc.tail())
            wait_until(lambda w=worker: not w.arena_path().exists(), 30, f"the arena of {pool} to go")  # type: ignore[misc]


# -- beat ----------------------------------------------------------------------------------------
def test_beat_publishes_into_traces_the_worker_continues(tmp_path: Path, redis_server: ServerInfo) -> None:
    broker, queue = f"redis://127.0.0.1:{redis_server.port}/8", new_queue()
    with collector_process(tmp_path) as col:
        env_b = celery_env(tmp_path / "beat", col.grpc_address, broker, queue, service="beat")
        env_b["CELERY_BEAT_EVERY"] = "0.2"
        env_w = celery_env(tmp_path / "cel", col.grpc_address, broker, queue)
        beat_cmd = [
            *CELERY,
            "beat",
            "-s",
            str(tmp_path / "schedule"),
            "--max-interval",
            "1",
            "-l",
            "info",
        ]
        with (
            run_celery(tmp_path, env_w, worker_command("solo", 1), name="worker") as worker,
            run_celery(tmp_path, env_b, beat_cmd, name="beat", ready=r"beat: Starting") as beat,
        ):
            wait_until(lambda: len(segments_of(col, "cel")) >= 5, 30, "5 scheduled runs")
            beat.proc.send(signal.SIGTERM)
            assert wait_exit(beat) is not None
            wait_until(lambda: not beat.arena_path().exists(), 30, "beat's arena to be removed")
            wait_until(
                lambda: len(succeeded(worker)) >= len(segments_of(col, "beat")), 30, "the worker to catch up"
            )
            quiet_for(col, 0.5)
            sends = segments_of(col, "beat")
            runs = segments_of(col, "cel")
            assert len(runs) == len(sends) >= 5
            exits = {}
            for seg in sends:
                (span,) = seg["spans"]  # beat has no request: the exit span is the segment
                assert span["spanType"] == "Exit" and span["operationName"] == TASK_OP
                exits[seg["traceSegmentId"]] = seg
            for run in runs:
                (ref,) = entry_span(run)["refs"]
                assert ref["parentService"] == "beat"
                assert run["traceId"] == exits.pop(ref["parentTraceSegmentId"])["traceId"]
            assert not exits
            assert {s["serviceInstance"] for s in sends} == {"beat-w0"}


@pytest.mark.parametrize("reporter_process", [True, False], ids=["process", "thread"])
def test_embedded_beat_sends_tasks_prefork_children_run(
    tmp_path: Path, redis_server: ServerInfo, reporter_process: bool
) -> None:
    """``celery worker -B``: beat runs in a child process of the worker (not a pool child);
    its sends are exit spans, each task run an entry span in a pool child continuing the
    send's trace; every run the worker logged as succeeded has its segment, nothing breaks."""
    broker, queue = f"redis://127.0.0.1:{redis_server.port}/13", new_queue()
    with collector_process(tmp_path) as col:
        env = celery_env(tmp_path, col.grpc_address, broker, queue)
        env["CELERY_BEAT_EVERY"] = "0.2"
        env["SW_AGENT_REPORTER_PROCESS"] = "true" if reporter_process else "false"
        cmd = worker_command("prefork", 2, ["-B", "-s", str(tmp_path / "schedule")])
        with run_celery(tmp_path, env, cmd, children=2) as worker:
            wait_until(lambda: len(succeeded(worker)) >= 8, 60, "8 scheduled runs to succeed")
            pool_pids = set(worker.worker_pids())
            worker.proc.send(signal.SIGTERM)
            assert wait_exit(worker) == 0, worker.proc.tail()
            wait_until(lambda: not worker.arena_path().exists(), 30, "the arena to be removed")
            quiet_for(col, 0.5)
            done = succeeded(worker)
            log = worker.proc.log()
        segs = segments_of(col, "cel")
        sends = [s for s in segs if s["spans"][0].get("spanType") == "Exit"]
        runs = [s for s in segs if s["spans"][0].get("spanType") != "Exit"]
        assert len(sends) + len(runs) == len(segs)
        assert len(runs) == len(done) >= 8  # every run the worker logged has its segment
        exits = {}
        for seg in sends:
            (span,) = seg["spans"]  # beat has no request: the exit span is the segment
            assert span["operationName"] == TASK_OP and span["spanLayer"] == "MQ"
            exits[seg["traceSegmentId"]] = seg
        beat_instances = {s["serviceInstance"] for s in sends}
        run_instances = {s["serviceInstance"] for s in runs}
        assert len(beat_instances) == 1 and not beat_instances & run_instances
        assert run_instances <= child_names(3)
        for run in runs:
            entry = entry_span(run)
            assert entry["operationName"] == TASK_OP and entry["componentId"] == 7011
            (ref,) = entry["refs"]
            send = exits.pop(ref["parentTraceSegmentId"])
            assert run["traceId"] == send["traceId"]
            assert ref["parentServiceInstance"] == send["serviceInstance"]
        # What beat sent after the last run (stopped with the worker) stays in the queue.
        assert len(exits) <= len(sends) - len(runs)
        assert len(pool_pids) == 3  # the two pool children and beat
        assert len(sends) == log.count("Scheduler: Sending due task")  # every send, the last ones too
        if not reporter_process:  # beat's own reporter thread was stopped (and flushed) as it left
            assert re.search(r"INFO/Beat\] reporter \d+ exiting \(stop\)", log), log[-3000:]
        check_agent_quiet(log)


# -- canvas --------------------------------------------------------------------------------------
def test_chord_chain_and_group_are_one_trace(tmp_path: Path, redis_server: ServerInfo) -> None:
    """A publisher sends, inside one entry span, a chord of 12 ``add`` with a ``tsum``
    callback, a chain of two and a group of three (Redis broker and result backend) to a
    prefork worker: every run is an entry span of the publisher's trace; header and group
    tasks and the chain's first one hang off the publisher's exit spans, the callback off the
    exit span inside the header run that completed the chord (it sent it), the chain's
    second task off the first one's run. Every exit span is the parent of exactly one run."""
    n = 12
    broker, queue = f"redis://127.0.0.1:{redis_server.port}/14", new_queue()
    app = "tests.e2e_apps.celery_canvas"
    backend = {"CELERY_RESULT_BACKEND": f"redis://127.0.0.1:{redis_server.port}/15"}
    with collector_process(tmp_path) as col:
        env_w = celery_env(tmp_path / "cel", col.grpc_address, broker, queue, extra=backend)
        env_p = celery_env(tmp_path / "pub", col.grpc_address, broker, queue, service="pub", extra=backend)
        with run_celery(tmp_path, env_w, worker_command("prefork", 2, app=app), children=2) as worker:
            results = publish_canvas(env_p, n, tmp_path)
            assert results["chord"] == sum(2 * i for i in range(n))
            assert results["chain"] == 13 and results["group"] == [100, 101, 102]
            runs_expected = n + 1 + 2 + 3
            wait_until(lambda: len(succeeded(worker)) >= runs_expected, 60, "every run to succeed")
            wait_segments(col, runs_expected, "cel")
            wait_segments(col, 1, "pub")
            quiet_for(col, 0.5)
            log = worker.proc.log()
        trace_id = results["trace_id"]
        (pub,) = segments_of(col, "pub")
        assert pub["traceId"] == trace_id and entry_span(pub)["operationName"] == "/canvas"
        runs = segments_of(col, "cel")
        assert len(runs) == runs_expected and {s["traceId"] for s in runs} == {trace_id}
        assert {s["serviceInstance"] for s in runs} <= child_names(2)

        exits = {}  # (segment, span id) -> (segment, its entry operation, the exit span)
        for seg in [pub, *runs]:
            for span in exit_spans(seg):
                if span["operationName"].startswith("celery/"):
                    key = (seg["traceSegmentId"], int(span.get("spanId", 0)))
                    exits[key] = (seg, entry_span(seg)["operationName"], span)
        pub_exits = Counter(
            op for seg, _, span in exits.values() if seg is pub for op in [span["operationName"]]
        )
        assert pub_exits == {"celery/canvas.add": n + 1 + 3}  # chord header, chain head, group

        parents: dict[str, list[str]] = {}  # run operation -> operations of the parent's entry
        for run in runs:
            entry = entry_span(run)
            assert entry["componentId"] == 7011 and entry["spanLayer"] == "MQ"
            (ref,) = entry["refs"]
            key = (ref["parentTraceSegmentId"], int(ref.get("parentSpanId", 0)))
            parent_seg, parent_op, parent_exit = exits.pop(key)  # each exit is one run's parent
            assert parent_exit["operationName"] == entry["operationName"]
            assert ref["parentEndpoint"] == parent_op
            assert ref["parentService"] == parent_seg["service"]
            assert ref["parentServiceInstance"] == parent_seg["serviceInstance"]
            assert ref["networkAddressUsedAtPeer"] == parent_exit["peer"] == f"127.0.0.1:{redis_server.port}"
            parents.setdefault(entry["operationName"], []).append(parent_op)
        assert not exits  # and every exit span has its run
        assert parents["celery/canvas.tsum"] == ["celery/canvas.add"]  # sent by a header run
        assert Counter(parents["celery/canvas.add"]) == {"/canvas": n + 1 + 3, "celery/canvas.add": 1}
        check_agent_quiet(log)


# -- recycling -----------------------------------------------------------------------------------
@pytest.mark.parametrize("reporter_process", [True, False], ids=["process", "thread"])
def test_max_memory_per_child_replaces_children_after_each_task(
    tmp_path: Path, redis_server: ServerInfo, reporter_process: bool
) -> None:
    """``--max-memory-per-child`` below any interpreter's size: billiard replaces a child after
    every task. 60 tasks on 2 children, so 62 children in all: every task's segment arrives
    once, from a child named after one of the 2 slots; every child claimed slot 0 or 1 and
    released it for its replacement (no slot exhaustion, no other slot ever claimed)."""
    n = 60
    broker, queue = f"redis://127.0.0.1:{redis_server.port}/9", new_queue()
    with collector_process(tmp_path) as col:
        env = celery_env(tmp_path, col.grpc_address, broker, queue)
        env["SW_AGENT_REPORTER_PROCESS"] = "true" if reporter_process else "false"
        cmd = worker_command("prefork", 2, ["--max-memory-per-child", "1"])
        with run_celery(tmp_path, env, cmd, children=2) as worker:
            sent = publish(broker, [queue], n, tmp_path)[queue]
            wait_until(lambda: len(succeeded(worker)) >= n, 90, f"{n} tasks to succeed")
            # One task per child: each of the n children leaves after its task and is
            # replaced; the 2 replacements of the last ones take the slots again.
            wait_until(lambda: sum(slot_claims(worker).values()) >= n + 2, 30, "the last replacements")
            worker.wait_workers_claimed()
            claims = slot_claims(worker)
            assert claims == {0: claims[0], 1: claims[1]} and claims[0] + claims[1] == n + 2, claims
            wait_segments(col, n, "cel")
            quiet_for(col, 0.5)
            segs = segments_of(col, "cel")
            assert Counter(s["traceId"] for s in segs) == Counter(sent.values())
            assert {s["serviceInstance"] for s in segs} <= child_names(2)
            assert {inst for (svc, inst) in announced(col) if svc == "cel"} == child_names(2)
            check_announced(col, worker, "cel")
            log = worker.proc.log()
            assert len(set(re.findall(r"/(ForkPoolWorker-\d+)\] Task \S+ succeeded", log))) == n
            check_agent_quiet(log)
