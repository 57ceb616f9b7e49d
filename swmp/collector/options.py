"""Command-line options of ``swmp collector`` (kept apart so ``swmp --help`` stays light)."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_GRPC_PORT = 11800
DEFAULT_HTTP_PORT = 12800
DEFAULT_MAX_BODY = 8 * 1024 * 1024
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_RETENTION_S = 3 * 24 * 3600.0


def default_path() -> Path:
    """``$XDG_DATA_HOME/swmp/collector.db`` (``~/.local/share/swmp/collector.db`` by default)."""
    base = os.environ.get("XDG_DATA_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative path is invalid, to be ignored
        base = os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "swmp" / "collector.db"


def _positive(text: str) -> float:
    value = float(text)
    # (inf passed "> 0" and then failed int() with an OverflowError traceback)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def tcp_port(text: str) -> int:
    """A TCP port. gRPC took one out of range modulo 65536 (99999 listened on 34463, -1 on
    65535) and the HTTP server failed with an OverflowError traceback."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be between 0 and 65535, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host", default=DEFAULT_HOST, help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument(
        "--grpc-port", type=tcp_port, default=DEFAULT_GRPC_PORT, help="gRPC port (default 11800; 0 = free)"
    )
    p.add_argument(
        "--http-port",
        type=tcp_port,
        default=DEFAULT_HTTP_PORT,
        help="HTTP receiver + web page port (default 12800)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--db", metavar="PATH", help=f"SQLite file (default {default_path()})")
    where.add_argument("--memory", action="store_true", help="keep nothing on disk")
    p.add_argument(
        "--max-mb",
        type=_positive,
        default=DEFAULT_MAX_BYTES / 2**20,
        help="stored data cap in MiB; the oldest goes first (default %(default)g)",
    )
    p.add_argument(
        "--retention-hours",
        type=_positive,
        default=DEFAULT_RETENTION_S / 3600,
        help="drop data older than this (default %(default)g)",
    )
    p.add_argument(
        "--max-body-mb",
        type=_positive,
        default=DEFAULT_MAX_BODY / 2**20,
        help="largest HTTP body accepted, MiB (default %(default)g)",
    )
    p.add_argument(
        "--allow-host",
        metavar="NAME",
        action="append",
        default=[],
        help="a host name the page and API answer to besides IP addresses and localhost (repeatable)",
    )
    p.add_argument("--ready-file", metavar="PATH", help="write the bound ports as JSON here once listening")
