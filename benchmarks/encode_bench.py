"""Reporter-side cost of turning decoded SEGMENT records into protobuf bytes.

Compares, in one run and on the same records:
  pb-objects  build a SegmentObject field by field with the generated classes, then
              SerializeToString() (the obvious way);
  hand        reporter_proc.encode.segment (hand-written wire encoder, cached strings);
and, per batch, wrapping the segments in a SegmentCollection both ways.

Workload: a typical HTTP segment, an entry span with 3 tags plus N-1 exit spans with 3 tags,
unique trace/segment ids per segment. Figures are microseconds per span (best of R repeats).

    python benchmarks/encode_bench.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import google.protobuf

from reporter_proc import encode
from reporter_proc.protocol.generated import tracing_pb2


def make_segment(i: int, n_spans: int) -> list[Any]:
    t0 = 1_700_000_000_000 + i
    spans = [[0, -1, t0, t0 + 25, "GET /api/users/{id}", "", 0, 3, 7000, False, False,
              ["http.method", "GET", "url", f"http://svc.local:8000/api/users/{i}",
               "http.status_code", "200"],
              [], [[0, f"trace-{i:08x}-parent", f"seg-{i:08x}-parent", 2, "frontend", "frontend-0@host",
                    "/checkout", "svc.local:8000"]]]]
    for s in range(1, n_spans):
        spans.append([s, 0, t0 + s, t0 + s + 3, "/db/query", "db.local:5432", 1, 1, 7001, False, False,
                      ["db.type", "sql", "db.instance", "users",
                       "db.statement", f"SELECT * FROM u WHERE id={i}"],
                      [], []])
    return [f"{i:032x}", f"{i:032x}.1.{i}", "python-service", "python-service-0@host", False, spans]


def pb_segment(rec: list[Any]) -> tracing_pb2.SegmentObject:
    trace_id, segment_id, service, instance, limited, spans = rec
    seg = tracing_pb2.SegmentObject(traceId=trace_id, traceSegmentId=segment_id, service=service,
                                    serviceInstance=instance, isSizeLimited=limited)
    for s in spans:
        span = seg.spans.add(spanId=s[0], parentSpanId=s[1], startTime=s[2], endTime=s[3],
                             operationName=s[4], peer=s[5], spanType=s[6], spanLayer=s[7],
                             componentId=s[8], isError=s[9], skipAnalysis=s[10])
        tags = s[11]
        for j in range(0, len(tags), 2):
            span.tags.add(key=tags[j], value=tags[j + 1])
        for time_ms, data in s[12]:
            entry = span.logs.add(time=time_ms)
            for j in range(0, len(data), 2):
                entry.data.add(key=data[j], value=data[j + 1])
        for r in s[13]:
            span.refs.add(refType=r[0], traceId=r[1], parentTraceSegmentId=r[2], parentSpanId=r[3],
                          parentService=r[4], parentServiceInstance=r[5], parentEndpoint=r[6],
                          networkAddressUsedAtPeer=r[7])
    return seg


def via_pb(recs: list[list[Any]]) -> bytes:
    return tracing_pb2.SegmentCollection(segments=[pb_segment(r) for r in recs]).SerializeToString()


def via_pb_each(recs: list[list[Any]]) -> list[bytes]:
    return [pb_segment(r).SerializeToString() for r in recs]


def via_hand(recs: list[list[Any]]) -> bytes:
    return encode.segment_collection([encode.segment(r) for r in recs])


def via_hand_each(recs: list[list[Any]]) -> list[bytes]:
    return [encode.segment(r) for r in recs]


def best_us_per_span(fns: dict[str, Callable[[list[list[Any]]], object]], recs: list[list[Any]],
                     spans: int, repeats: int) -> dict[str, float]:
    """Best time of each alternative; rounds interleave them so load bursts hit all alike."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn(recs)
            best[name] = min(best[name], time.perf_counter() - t)
    return {name: b / spans * 1e6 for name, b in best.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny run (smoke test)")
    ap.add_argument("--json", metavar="PATH", help="write results as JSON")
    args = ap.parse_args()
    n_segments, repeats = (50, 2) if args.quick else (2000, 15)

    rows = []
    for n_spans in (1, 3, 10):
        recs = [make_segment(i, n_spans) for i in range(n_segments)]
        # same bytes both ways, or the comparison means nothing
        assert via_hand(recs) == via_pb(recs), "encoders disagree"
        spans = n_segments * n_spans
        row: dict[str, Any] = {"spans_per_segment": n_spans, "segments": n_segments}
        row.update(best_us_per_span({"pb_objects_us": via_pb_each, "hand_us": via_hand_each,
                                     "pb_collection_us": via_pb, "hand_collection_us": via_hand},
                                    recs, spans, repeats))
        row["bytes_per_span"] = len(via_hand(recs)) / spans
        row["speedup"] = row["pb_collection_us"] / row["hand_collection_us"]
        rows.append(row)

    print(f"Python {platform.python_version()}, protobuf {google.protobuf.__version__} "
          f"({_pb_impl()}); us per span, best of {repeats}; {n_segments} segments per batch")
    print(f"{'spans/seg':>9} | {'pb-objects':>10} {'hand':>8} | {'pb+collection':>13} "
          f"{'hand+collection':>15} | {'speed-up':>8} | {'B/span':>6}")
    for r in rows:
        print(f"{r['spans_per_segment']:>9} | {r['pb_objects_us']:>10.2f} {r['hand_us']:>8.2f} | "
              f"{r['pb_collection_us']:>13.2f} {r['hand_collection_us']:>15.2f} | "
              f"{r['speedup']:>7.2f}x | {r['bytes_per_span']:>6.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "benchmark": "encode_bench", "python": platform.python_version(),
            "protobuf": google.protobuf.__version__, "protobuf_impl": _pb_impl(),
            "quick": args.quick, "repeats": repeats, "rows": rows}, indent=2))


def _pb_impl() -> str:
    from google.protobuf.internal import api_implementation

    return api_implementation.Type()


if __name__ == "__main__":
    main()
