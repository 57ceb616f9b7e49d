"""Options of ``swmp demo`` (the work is in :mod:`swmp.demo.runner`, imported on use)."""

from __future__ import annotations

import argparse

from swmp.collector.options import tcp_port


def _count(text: str) -> int:
    """A number of requests, workers...: 0 workers waited 30 s for an app that never came up."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--oap",
        metavar="HOST:PORT",
        help="report to this SkyWalking OAP (its gRPC address) instead of starting `swmp collector`",
    )
    p.add_argument(
        "--oap-query", metavar="URL", help="with --oap: its GraphQL address (default http://HOST:12800)"
    )
    p.add_argument("--requests", type=_count, default=300, help="requests to send (default 300)")
    p.add_argument("--concurrency", type=_count, default=8, help="requests in flight (default 8)")
    p.add_argument(
        "--workers", type=_count, default=4, help="Gunicorn workers of the example app (default 4)"
    )
    p.add_argument(
        "--protocol", choices=("grpc", "http"), default="grpc", help="agent transport (default grpc)"
    )
    p.add_argument(
        "--db", metavar="PATH", help="the collector's database (default: `swmp collector`'s default)"
    )
    p.add_argument(
        "--grpc-port", type=tcp_port, default=11800, help="collector gRPC port (default 11800; 0 = free)"
    )
    p.add_argument(
        "--http-port", type=tcp_port, default=12800, help="collector HTTP/page port (default 12800; 0 = free)"
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="after the demo, keep the collector running (until Ctrl-C) so the trace page stays up",
    )


def run(args: argparse.Namespace) -> int:
    from swmp.demo.runner import Demo  # noqa: PLC0415 (loaded only when the demo runs)

    return Demo(args).run()
