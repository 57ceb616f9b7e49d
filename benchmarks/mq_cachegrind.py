"""Instructions the message-queue wrappers add per published and per consumed message,
counted by Valgrind's cachegrind: the steady companion of the ``in-process`` cases of
``benchmarks/mq_bench.py``, whose CPU-time figures move by tenths of a microsecond from run
to run on a shared machine.

The cases are those of :func:`mq_bench.in_process_cases` (the wrappers' own work, no client,
no network), each a pair of functions: ``base`` (what the message costs without the agent's
wrapper) and ``traced``:

* ``producer``: inside an entry span, what a Kafka send calls (``_mq.kafka_send_span``: the
  MQ exit span with its tags and the ``sw8`` header list), against the entry span alone;
  ``producer-amqp``: the same for an aiormq publish (the span, the copy of the caller's
  pamqp properties, the new headers table);
* ``consumer``: ``_mq.kafka_consumed`` for a Kafka record carrying ``sw8`` (decoding it, the entry
  span with its ref and tags, the segment written into a real shared-memory ring), against
  nothing; ``consumer-no-sw8``: the same for a record without the header (a new trace);
* ``consumer-callback``: ``_mq.amqp_consuming`` around a callback (pika / aiormq), the
  message's AMQP headers table carrying ``sw8``, against calling the callback alone;
  ``consumer-pika``: the callback the pika instrumentation makes of a BlockingChannel
  consumer's, called with pika's own objects (the message's facts read from them first);
  ``consumer-aiormq``: a delivery as aiormq runs it (the registered callback's call made a
  task on a running loop) through the aiormq instrumentation's wrapper;
* ``producer-aiormq``: an aiormq publish awaited through the instrumentation's wrapper in an
  entry span (the channel's own method doing nothing), against the method alone;
  ``producer-aiokafka``: the same for an aiokafka ``AIOKafkaProducer.send``.

Each function runs under ``valgrind --tool=cachegrind --cache-sim=no`` twice, N and 3N
times after the same warm-up; ``(I(3N) - I(N)) / 2N`` is the count per call with start-up
cancelled, and the table shows ``traced - base``. The ring is large enough for every
segment and is never drained inside the measured process (draining is the reporter's
work). Each measurement runs with ASLR off (``setarch -R``) and a fixed ``PYTHONHASHSEED``:
a rerun of the same code gives the same count within ~10 instructions. A code change still
moves the interpreter's type-attribute cache collisions by up to ~1,500 instructions, so
compare versions over several seeds (``--seeds 0 1 2``; the table shows their mean).

    python benchmarks/mq_cachegrind.py [--case NAME ...] [--calls N] [--seeds S ...] [--json PATH]

Run the real interpreter binary, not a pyenv shim (``--python``; default: this one's
``sys.executable`` resolved). Slow: ~50x the normal run time per case and function.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository
from benchmarks import _cachegrind as _cg

ROOT = Path(__file__).resolve().parent.parent
CASES = (
    "producer",
    "producer-amqp",
    "consumer",
    "consumer-no-sw8",
    "consumer-callback",
    "consumer-pika",
    "consumer-aiormq",
    "producer-aiormq",
    "producer-aiokafka",
)
WARM_UP = 500


def _child(case: str, which: str, n: int) -> None:
    """In the measured process: the case's ``which`` function, warmed up, then ``n`` calls."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import mq_bench as mb
    from swmp import _sink, tracing
    from swmp.config import load

    tracing.configure(load({}, agent_log_reporter_active=False))
    ring = mb.Ring(32 << 20)  # never drained while counting: room for every segment of 3N calls
    fn = mb.in_process_cases()[case][0 if which == "base" else 1]
    for _ in range(WARM_UP):
        fn()
    ring.drain()
    for _ in range(n):
        fn()
    _sink.set_sink(None)
    dropped = ring.writer.stats().dropped_records
    ring.arena.unlink()
    if dropped:
        raise SystemExit(f"the ring dropped {dropped} records: counts would be wrong")


def per_call(python: str, case: str, which: str, n: int, seed: int) -> float:
    return _cg.per_op(
        python, str(Path(__file__).resolve()), lambda k: ["--child", case, which, str(k)], n, seed
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", choices=CASES, help="case (repeatable; default: all)")
    ap.add_argument("--calls", type=int, default=2000, help="N (the runs make N and 3N calls)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--python", default=os.path.realpath(sys.executable))
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--child", nargs=3, metavar=("CASE", "WHICH", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    print(f"instructions per message (N={args.calls}, seeds {args.seeds}; mean over seeds)")
    _cg.compare_to_json(
        args.case or CASES,
        ("base", "traced"),
        lambda case, which, seed: per_call(args.python, case, which, args.calls, seed),
        args.seeds,
        json_path=args.json,
        meta={"calls": args.calls, "seeds": args.seeds, "python": args.python},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
