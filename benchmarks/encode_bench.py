"""Reporter-side cost of turning decoded SEGMENT records into protobuf bytes.

Compares, in one run and on the same records:
  pb-objects  build a SegmentObject field by field with the generated classes, then
              SerializeToString() (the obvious way);
  pure        reporter_proc.encode.segment_py (hand-written wire encoder, cached strings);
  native      reporter_proc._encode_native.segment (the C encoder, same bytes), when built;
  from-json   reporter_proc._encode_native.segment_json: the C encoder reading the record's
              JSON bytes directly (what the gRPC sender does), so its figure replaces
              decode + native;
and, per batch, wrapping the segments in a SegmentCollection each way. For scale, the
``decode`` column is what the reporter spends before encoding: orjson.loads of the record
as the worker wrote it.

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
import orjson

from reporter_proc import encode
from reporter_proc.process import tune_gc
from reporter_proc.protocol.generated import tracing_pb2


def make_segment(i: int, n_spans: int) -> list[Any]:
    t0 = 1_700_000_000_000 + i
    spans = [
        [
            0,
            -1,
            t0,
            t0 + 25,
            "GET /api/users/{id}",
            "",
            0,
            3,
            7000,
            False,
            False,
            ["http.method", "GET", "url", f"http://svc.local:8000/api/users/{i}", "http.status_code", "200"],
            [],
            [
                [
                    0,
                    f"trace-{i:08x}-parent",
                    f"seg-{i:08x}-parent",
                    2,
                    "frontend",
                    "frontend-0@host",
                    "/checkout",
                    "svc.local:8000",
                ]
            ],
        ]
    ]
    for s in range(1, n_spans):
        spans.append(
            [
                s,
                0,
                t0 + s,
                t0 + s + 3,
                "/db/query",
                "db.local:5432",
                1,
                1,
                7001,
                False,
                False,
                ["db.type", "sql", "db.instance", "users", "db.statement", f"SELECT * FROM u WHERE id={i}"],
                [],
                [],
            ]
        )
    return [f"{i:032x}", f"{i:032x}.1.{i}", "python-service", "python-service-0@host", False, spans]


def pb_segment(rec: list[Any]) -> tracing_pb2.SegmentObject:
    trace_id, segment_id, service, instance, limited, spans = rec
    seg = tracing_pb2.SegmentObject(
        traceId=trace_id,
        traceSegmentId=segment_id,
        service=service,
        serviceInstance=instance,
        isSizeLimited=limited,
    )
    for s in spans:
        span = seg.spans.add(
            spanId=s[0],
            parentSpanId=s[1],
            startTime=s[2],
            endTime=s[3],
            operationName=s[4],
            peer=s[5],
            spanType=s[6],
            spanLayer=s[7],
            componentId=s[8],
            isError=s[9],
            skipAnalysis=s[10],
        )
        tags = s[11]
        for j in range(0, len(tags), 2):
            span.tags.add(key=tags[j], value=tags[j + 1])
        for time_ms, data in s[12]:
            entry = span.logs.add(time=time_ms)
            for j in range(0, len(data), 2):
                entry.data.add(key=data[j], value=data[j + 1])
        for r in s[13]:
            span.refs.add(
                refType=r[0],
                traceId=r[1],
                parentTraceSegmentId=r[2],
                parentSpanId=r[3],
                parentService=r[4],
                parentServiceInstance=r[5],
                parentEndpoint=r[6],
                networkAddressUsedAtPeer=r[7],
            )
    return seg


def via_pb(recs: list[list[Any]]) -> bytes:
    return tracing_pb2.SegmentCollection(segments=[pb_segment(r) for r in recs]).SerializeToString()


def via_pb_each(recs: list[list[Any]]) -> list[bytes]:
    return [pb_segment(r).SerializeToString() for r in recs]


def via_pure(recs: list[list[Any]]) -> bytes:
    return encode.segment_collection_py([encode.segment_py(r) for r in recs])


def via_pure_each(recs: list[list[Any]]) -> list[bytes]:
    return [encode.segment_py(r) for r in recs]


def via_native(recs: list[list[Any]]) -> bytes:
    assert encode.NATIVE is not None
    native = encode.NATIVE
    return native.segment_collection([native.segment(r) for r in recs])


def via_native_each(recs: list[list[Any]]) -> list[bytes]:
    assert encode.NATIVE is not None
    segment = encode.NATIVE.segment
    return [segment(r) for r in recs]


def best_us_per_span(
    fns: dict[str, Callable[[list[list[Any]]], object]], recs: list[list[Any]], spans: int, repeats: int
) -> dict[str, float]:
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
    tune_gc()  # the reporter process's collector settings (decoding 2,000 records otherwise
    # triggers hundreds of young collections that rescan everything still alive)

    native = encode.NATIVE is not None
    rows = []
    for n_spans in (1, 3, 5, 10):
        recs = [make_segment(i, n_spans) for i in range(n_segments)]
        raw = [orjson.dumps(r) for r in recs]
        # same bytes every way, or the comparison means nothing
        assert via_pure(recs) == via_pb(recs), "encoders disagree"
        assert not native or via_native(recs) == via_pb(recs), "native encoder disagrees"
        spans = n_segments * n_spans
        row: dict[str, Any] = {"spans_per_segment": n_spans, "segments": n_segments}
        fns: dict[str, Callable[[list[list[Any]]], object]] = {
            "pb_objects_us": via_pb_each,
            "pure_us": via_pure_each,
            "pb_collection_us": via_pb,
            "pure_collection_us": via_pure,
            "decode_us": lambda _recs, raw=raw: [orjson.loads(b) for b in raw],
        }
        if native:
            assert encode.NATIVE is not None
            from_json = encode.NATIVE.segment_json
            assert [from_json(b) for b in raw] == via_native_each(recs), "JSON fast path disagrees"
            fns.update(
                native_us=via_native_each,
                native_collection_us=via_native,
                from_json_us=lambda _recs, raw=raw, f=from_json: [f(b) for b in raw],
            )
        row.update(best_us_per_span(fns, recs, spans, repeats))
        row["bytes_per_span"] = len(via_pure(recs)) / spans
        row["pure_vs_pb"] = row["pb_collection_us"] / row["pure_collection_us"]
        if native:
            row["native_vs_pure"] = row["pure_collection_us"] / row["native_collection_us"]
            row["from_json_vs_decode_pure"] = (row["decode_us"] + row["pure_us"]) / row["from_json_us"]
        rows.append(row)

    print(
        f"Python {platform.python_version()}, protobuf {google.protobuf.__version__} "
        f"({_pb_impl()}); us per span, best of {repeats}; {n_segments} segments per batch"
        + ("" if native else "; native encoder not built")
    )
    print(
        f"{'spans/seg':>9} | {'decode':>7} | {'pb-objects':>10} {'pure':>7} {'native':>7} "
        f"{'from-json':>9} | "
        f"{'pb+coll':>8} {'pure+coll':>10} {'native+coll':>12} | {'pure/pb':>7} {'native/pure':>11} | "
        f"{'B/span':>6}"
    )

    def nat(r: dict[str, Any], key: str, width: int) -> str:
        return f"{r[key]:>{width}.2f}" if native else f"{'-':>{width}}"

    for r in rows:
        print(
            f"{r['spans_per_segment']:>9} | {r['decode_us']:>7.2f} | {r['pb_objects_us']:>10.2f} "
            f"{r['pure_us']:>7.2f} {nat(r, 'native_us', 7)} {nat(r, 'from_json_us', 9)} | "
            f"{r['pb_collection_us']:>8.2f} "
            f"{r['pure_collection_us']:>10.2f} {nat(r, 'native_collection_us', 12)} | "
            f"{r['pure_vs_pb']:>6.2f}x {nat(r, 'native_vs_pure', 10)}x | {r['bytes_per_span']:>6.0f}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "benchmark": "encode_bench",
                    "python": platform.python_version(),
                    "protobuf": google.protobuf.__version__,
                    "protobuf_impl": _pb_impl(),
                    "quick": args.quick,
                    "repeats": repeats,
                    "rows": rows,
                },
                indent=2,
            )
        )


def _pb_impl() -> str:
    from google.protobuf.internal import api_implementation

    return api_implementation.Type()


if __name__ == "__main__":
    main()
