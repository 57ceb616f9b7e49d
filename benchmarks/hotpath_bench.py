"""In-worker cost of one traced HTTP request, side by side.

One "request" = an entry span (method, URL, status tags) + one exit span (method, URL,
status tags, propagation headers injected into an outgoing header dict), finished, the
segment serialized and handed to the transport's in-process queue:

* ``swmp``: spans -> one positional orjson record -> written into a real shared-memory
  ring (an ipc Arena in a temp dir; a reader drains it between rounds, untimed);
* ``apache-skywalking`` (1.2.0): its context API; segments go to its real segment queue.
  The agent's queues are initialised but its reporter threads are not started, so nothing
  connects anywhere and what is measured is its in-process tracing + queueing;
* ``opentelemetry``: the SDK with a BatchSpanProcessor and an exporter that discards, W3C
  ``traceparent`` injected;
* ``untraced``: the same request body with no tracing (the loop's own cost).

Each round runs every implementation in turn (interleaved, so drift hits all alike);
the table shows the median and the minimum over rounds of ns per request.

    python benchmarks/hotpath_bench.py [--quick] [--rounds N] [--requests N] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

URL_IN = "http://127.0.0.1:8000/api/orders"
URL_OUT = "http://stock:8080/stock"


# -- implementations: each returns (request_fn, drain_fn, close_fn) ----------------------------


def make_untraced() -> tuple[Callable[[], Any], Callable[[], None], Callable[[], None]]:
    def request() -> Any:
        headers = {"accept": "application/json"}
        status = 200
        return headers, status

    return request, lambda: None, lambda: None


def make_swmp(requests: int = 3000) -> tuple[Callable[[], Any], Callable[[], None], Callable[[], None]]:
    from benchmarks._ring import Ring, ring_size_for
    from swmp.tracing import Component, Layer
    from swmp.tracing.context import new_entry_span, new_exit_span

    # Drained and gone round once before every timed round (benchmarks/_ring.py): the other
    # implementations' rounds in between are a pause after which it would free its pages.
    ring = Ring(ring_size_for(requests))

    def request() -> Any:
        with new_entry_span("/api/orders", None, Component.FLASK, Layer.HTTP) as span:
            span.tag("http.method", "GET")
            span.tag("http.url", URL_IN)
            with new_exit_span("/stock", "stock:8080", Component.REQUESTS, Layer.HTTP) as ex:
                ex.tag("http.method", "GET")
                ex.tag("http.url", URL_OUT)
                headers = {"accept": "application/json"}
                headers.update(ex.inject())
                ex.tag("http.status_code", "200")
            span.tag("http.status_code", "200")
        return headers

    return request, ring.warm, ring.close


def make_skywalking() -> tuple[Callable[[], Any], Callable[[], None], Callable[[], None]]:
    import logging

    from skywalking import Component, Layer, config

    config.init(
        agent_name="bench",
        agent_protocol="grpc",
        agent_collector_backend_services="127.0.0.1:1",
        agent_profile_active=False,  # its profiler needs the reporter threads; off is also its cheaper path
        agent_meter_reporter_active=False,
        agent_log_reporter_active=False,
    )
    from skywalking.agent import agent
    from skywalking.trace.carrier import Carrier
    from skywalking.trace.context import get_context
    from skywalking.trace.tags import TagHttpMethod, TagHttpStatusCode, TagHttpURL

    logging.getLogger("skywalking").setLevel(logging.ERROR)
    # The real segment queue, without reporter threads or a protocol client.
    agent._SkyWalkingAgent__init_queues()
    queue = agent._SkyWalkingAgent__segment_queue

    def request() -> Any:
        context = get_context()
        with context.new_entry_span(op="/api/orders", carrier=Carrier()) as span:
            span.layer = Layer.Http
            span.component = Component.Flask
            span.tag(TagHttpMethod("GET"))
            span.tag(TagHttpURL(URL_IN))
            with context.new_exit_span(op="/stock", peer="stock:8080", component=Component.Requests) as ex:
                ex.layer = Layer.Http
                ex.tag(TagHttpMethod("GET"))
                ex.tag(TagHttpURL(URL_OUT))
                headers = {"accept": "application/json"}
                for item in ex.inject():
                    headers[item.key] = item.val
                ex.tag(TagHttpStatusCode(200))
            span.tag(TagHttpStatusCode(200))
        return headers

    def drain() -> None:
        while not queue.empty():
            queue.get_nowait()
            queue.task_done()

    return request, drain, drain


def make_otel() -> tuple[Callable[[], Any], Callable[[], None], Callable[[], None]]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            return None

    provider = TracerProvider()
    processor = BatchSpanProcessor(Discard(), max_queue_size=65536)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("bench")
    propagator = TraceContextTextMapPropagator()

    def request() -> Any:
        with tracer.start_as_current_span(
            "/api/orders", kind=SpanKind.SERVER, attributes={"http.method": "GET", "http.url": URL_IN}
        ) as span:
            with tracer.start_as_current_span(
                "/stock", kind=SpanKind.CLIENT, attributes={"http.method": "GET", "http.url": URL_OUT}
            ) as ex:
                headers = {"accept": "application/json"}
                propagator.inject(headers)
                ex.set_attribute("http.status_code", 200)
            span.set_attribute("http.status_code", 200)
        return headers

    def drain() -> None:
        processor.force_flush()

    def close() -> None:
        provider.shutdown()

    return request, drain, close


IMPLS: dict[str, Callable[[], tuple[Callable[[], Any], Callable[[], None], Callable[[], None]]]] = {
    "untraced": make_untraced,
    "swmp": make_swmp,
    "apache-skywalking": make_skywalking,
    "opentelemetry": make_otel,
}


def run(rounds: int, requests: int, only: list[str]) -> list[dict[str, Any]]:
    setups = {}
    for name in only:
        try:
            setups[name] = make_swmp(requests) if name == "swmp" else IMPLS[name]()
        except ImportError as e:
            print(f"skipping {name}: {e}", file=sys.stderr)
    samples: dict[str, list[float]] = {name: [] for name in setups}
    for req, drain, _ in setups.values():  # warm-up
        for _ in range(min(requests, 200)):
            req()
        drain()
    for _ in range(rounds):
        for name, (req, drain, _) in setups.items():
            gc.collect()
            drain()  # untimed; swmp's ring also goes round once (see make_swmp)
            t0 = time.perf_counter_ns()
            for _ in range(requests):
                req()
            dt = time.perf_counter_ns() - t0
            samples[name].append(dt / requests)
            drain()
    for _, (_, _, close) in setups.items():
        close()
    return [
        {
            "impl": name,
            "ns_per_request": round(statistics.median(s)),
            "ns_min": round(min(s)),
            "rounds": rounds,
            "requests_per_round": requests,
        }
        for name, s in samples.items()
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few short rounds (smoke test)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--requests", type=int, default=3000, help="requests per round")
    ap.add_argument("--impl", action="append", choices=list(IMPLS), help="only these (repeatable)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    rounds, requests = (3, 300) if args.quick else (args.rounds, args.requests)
    results = run(rounds, requests, args.impl or list(IMPLS))

    by = {r["impl"]: r for r in results}
    sky = by.get("apache-skywalking")
    print(
        f"in-worker cost of one traced request ({rounds} rounds x {requests} requests, Python "
        f"{sys.version.split()[0]})"
    )
    print(f"{'impl':<20}{'median ns':>12}{'min ns':>12}{'vs skywalking':>16}")
    for r in results:
        ratio = f"{r['ns_per_request'] / sky['ns_per_request']:.2f}x" if sky else "-"
        print(f"{r['impl']:<20}{r['ns_per_request']:>12,}{r['ns_min']:>12,}{ratio:>16}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
