"""Cost of the Celery instrumentation per task: publishing and executing, instrumented vs not.

Three operations, each timed with Celery's own code with and without swmp in one run:

* ``publish in a request``: ``app.send_task`` inside an entry span (the web request that
  enqueues); instrumented adds the exit span, the ``sw8`` headers in the message and the
  larger segment. Baseline: the same entry span, the original ``send_task``.
* ``publish alone``: ``app.send_task`` outside any trace (a script, beat); instrumented
  adds a whole segment (one exit span) per message.
* ``execute``: one task run through the function a worker calls for every task
  (``celery.app.trace.build_tracer``, not eager), with a request dict that carries the
  ``sw8`` headers as a worker receives them; instrumented adds the entry span continuing the
  publisher's trace and its segment. Pool dispatch and broker I/O are not included.

The ``wrapper:`` rows time the same instrumentation wrappers around originals that do
nothing: what swmp adds per task, without the noise of Celery's own work around it (the
end-to-end rows differ by that plus scatter; Celery's publish is ~100x the added cost).

The broker is kombu's in-memory transport by default (``--broker URL`` for a real one):
what is measured is what swmp adds to Celery's own work, without network noise. Finished
segments go into a real shared-memory ring (an ipc Arena in a temp dir, drained between
rounds, untimed), as in the agent. Plain and instrumented calls alternate call by call
(ABBA, each call timed), so both see the caches as Celery's own work between them left them
and machine drift hits both alike; the table shows the median time per task of each, the
median over rounds of each round's median pair difference ("added") and the range of those
per-round figures (steady to a few tenths of a microsecond, where timing whole rounds of
each mode moved by ten microseconds and more).

    python benchmarks/celery_bench.py [--quick] [--rounds N] [--tasks N] [--broker URL] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if TYPE_CHECKING:
    from benchmarks._ring import Ring

Op = Callable[[], Any]


def setup(broker: str) -> tuple[dict[str, tuple[Op, Op]], Callable[[], None], Callable[[], None], Ring]:
    """``{operation: (plain, instrumented)}``, a drain function, a close function and the ring."""
    from celery import Celery
    from celery.app import trace

    from benchmarks._ring import Ring
    from swmp import instrument, tracing
    from swmp.config import load
    from swmp.instrument._patch import original
    from swmp.tracing import Component, Layer
    from swmp.tracing.context import new_entry_span

    cfg = load({}, agent_log_reporter_active=False)
    tracing.configure(cfg)
    status = instrument.install_one("swmp.instrument.celery", cfg)
    assert status[1] == "installed", status

    ring = Ring()

    app = Celery("bench", broker=broker, set_as_current=False)
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    app.conf.update(
        task_default_queue=queue, task_ignore_result=True, broker_connection_retry_on_startup=True
    )

    @app.task(name="bench.add")
    def add(x: int, y: int) -> int:
        return x + y

    producer = app.producer_pool.acquire(block=True)
    plain_send = original(type(app), "send_task")

    def send_plain() -> Any:
        return plain_send(app, "bench.add", (1, 2), producer=producer)

    def send_traced() -> Any:
        return app.send_task("bench.add", (1, 2), producer=producer)

    def in_request(send: Op) -> Op:
        def op() -> Any:
            with new_entry_span("/enqueue", None, Component.FLASK, Layer.HTTP):
                return send()

        return op

    # The worker side: tracers as a worker builds them (not eager), called with the request
    # dict a message with swmp's headers gives.
    with new_entry_span("/enqueue", None, Component.FLASK, Layer.HTTP):
        from swmp.tracing.span import current_span

        headers = current_span.get().inject()
    request = {
        "id": "x",
        "task": "bench.add",
        "origin": "gen1@web",
        "retries": 0,
        "delivery_info": {},
        **headers,
    }
    plain_tracer = original(trace, "build_tracer")("bench.add", add, app=app, hostname="bench")
    traced_tracer = trace.build_tracer("bench.add", add, app=app, hostname="bench")
    uid = uuid.uuid4().hex

    def run_plain() -> Any:
        return plain_tracer(uid, (1, 2), {}, dict(request))

    def run_traced() -> Any:
        return traced_tracer(uid, (1, 2), {}, dict(request))

    # The same wrappers around originals that do nothing: what swmp adds, without the noise
    # of Celery's own (much larger) work around it.
    from celery.app import amqp

    from swmp.instrument import celery as instr

    def noop_send(self: Any, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        # Builds the message's tuple as Celery's send does (where the traced send's headers
        # go in, swmp/instrument/_celery_message.py), and nothing else.
        return amqp.task_message({}, options, (), None)

    def noop_trace(uid: Any, args: Any, kwargs: Any, request: Any = None) -> Any:
        return (None, None, 0.0, None)

    wrapped_send = instr._wrap_send_task(noop_send)
    wrapped_trace = instr._traced(noop_trace, "bench.add", add, False)

    def bare_send_plain() -> Any:
        return noop_send(app, "bench.add", (1, 2), producer=producer)

    def bare_send_traced() -> Any:
        return wrapped_send(app, "bench.add", (1, 2), producer=producer)

    def bare_run_plain() -> Any:
        return noop_trace(uid, (1, 2), {}, dict(request))

    def bare_run_traced() -> Any:
        return wrapped_trace(uid, (1, 2), {}, dict(request))

    ops = {
        "publish in a request": (in_request(send_plain), in_request(send_traced)),
        "publish alone": (send_plain, send_traced),
        "execute": (run_plain, run_traced),
        "wrapper: publish in req": (in_request(bare_send_plain), in_request(bare_send_traced)),
        "wrapper: publish alone": (bare_send_plain, bare_send_traced),
        "wrapper: execute": (bare_run_plain, bare_run_traced),
    }

    def drain() -> None:
        ring.drain()
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge(queue)

    def close() -> None:
        drain()
        producer.release()
        ring.close()
        instrument.uninstall_all()

    return ops, drain, close, ring


def _pairs(plain: Op, traced: Op, n: int, drain: Callable[[], None]) -> tuple[list[int], list[int]]:
    """``n`` calls of each, alternated call by call (benchmarks/_abba.py); the in-memory queue
    and the ring emptied every 200 pairs (untimed). Per-call times in ns."""
    from benchmarks._abba import alternate

    def between(i: int) -> None:
        if i % 200 == 199:
            drain()

    p, t = alternate(plain, traced, n, between=between)
    drain()
    return p, t


def run(rounds: int, tasks: int, broker: str) -> list[dict[str, Any]]:
    ops, drain, close, ring = setup(broker)
    per: dict[str, dict[str, list[int]]] = {name: {"plain": [], "swmp": []} for name in ops}
    added: dict[str, list[float]] = {name: [] for name in ops}
    try:
        for plain, traced in ops.values():  # warm-up
            for _ in range(min(tasks, 300)):
                plain()
                traced()
            drain()
        for _ in range(rounds):
            for name, (plain, traced) in ops.items():
                gc.collect()
                ring.warm()  # resident, as a busy worker's ring is (benchmarks/_ring.py)
                p, t = _pairs(plain, traced, tasks, drain)
                per[name]["plain"] += p
                per[name]["swmp"] += t
                added[name].append(statistics.median(b - a for a, b in zip(p, t, strict=True)))
    finally:
        close()
    return [
        {
            "operation": name,
            "plain_us": round(statistics.median(per[name]["plain"]) / 1000, 2),
            "swmp_us": round(statistics.median(per[name]["swmp"]) / 1000, 2),
            "added_us": round(statistics.median(added[name]) / 1000, 2),
            "added_min_us": round(min(added[name]) / 1000, 2),
            "added_max_us": round(max(added[name]) / 1000, 2),
            "rounds": rounds,
            "tasks_per_round": tasks,
        }
        for name in ops
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few short rounds (smoke test)")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--tasks", type=int, default=2000, help="tasks per round and operation")
    ap.add_argument("--broker", default="memory://", help="broker URL (default: kombu's in-memory transport)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    rounds, tasks = (3, 200) if args.quick else (args.rounds, args.tasks)
    results = run(rounds, tasks, args.broker)
    import celery

    print(
        f"Celery {celery.__version__} per task, plain vs swmp ({rounds} rounds x {tasks} tasks, "
        f"broker {args.broker}, Python {sys.version.split()[0]})"
    )
    print(f"{'operation':<24}{'plain us':>10}{'swmp us':>10}{'added us':>10}{'rounds min-max':>17}")
    for r in results:
        spread = f"{r['added_min_us']:.2f}-{r['added_max_us']:.2f}"
        print(
            f"{r['operation']:<24}{r['plain_us']:>10.2f}{r['swmp_us']:>10.2f}{r['added_us']:>10.2f}{spread:>17}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"broker": args.broker, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
