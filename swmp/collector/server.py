"""``swmp collector``: the local SkyWalking backend for development machines and CI.

Runs the gRPC receiver (default 127.0.0.1:11800, the agent's default backend address) and
the HTTP receiver + web page + JSON API (default 127.0.0.1:12800) over one SQLite store.
A development tool: one process, one machine, no metrics aggregation, no alarms, no cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

from swmp.collector import grpc_receiver, http_server
from swmp.collector.intake import Intake
from swmp.collector.options import (
    DEFAULT_GRPC_PORT,
    DEFAULT_HOST,
    DEFAULT_HTTP_PORT,
    DEFAULT_MAX_BODY,
    add_arguments,
    default_path,
)
from swmp.collector.store import MEMORY, Store


class Collector:
    """Both receivers over one store. ``start()`` binds (port 0 = a free one), ``stop()`` ends."""

    def __init__(
        self,
        store: Store,
        *,
        host: str = DEFAULT_HOST,
        grpc_port: int = DEFAULT_GRPC_PORT,
        http_port: int = DEFAULT_HTTP_PORT,
        max_body: int = DEFAULT_MAX_BODY,
        allow_hosts: tuple[str, ...] = (),
    ) -> None:
        self.store = store
        self.intake = Intake(store)
        self.host = host
        self._want = (grpc_port, http_port)
        self.max_body = max_body
        self.allow_hosts = allow_hosts
        self.grpc_port = 0
        self.http_port = 0
        self._grpc: Any = None
        self._http: Any = None

    def start(self) -> Collector:
        try:
            self._grpc, self.grpc_port = grpc_receiver.build_server(self.intake, self.host, self._want[0])
            self._grpc.start()
            self._http = http_server.build_server(
                self.intake, self.host, self._want[1], self.max_body, self.allow_hosts
            )
            self.http_port = self._http.server_address[1]
            http_server.serve_in_thread(self._http)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace=1.0).wait(5)
            self._grpc = None
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_address(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"


def write_ready_file(path: str, doc: dict[str, Any]) -> None:
    """``doc`` as JSON at ``path``, atomically (readers never see half of it). The temporary
    file is created new (``O_EXCL | O_NOFOLLOW``): a link planted at ``PATH.tmp`` is removed,
    never written through."""
    tmp = f"{path}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a stale one, or a planted link (the link goes, not its target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc))
    os.replace(tmp, path)


def run(args: argparse.Namespace) -> int:
    """The ``swmp collector`` command: serve until SIGTERM / Ctrl-C."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    path = MEMORY if args.memory else str(Path(args.db).expanduser() if args.db else default_path())
    try:
        store = Store(path, max_bytes=int(args.max_mb * 2**20), retention_s=args.retention_hours * 3600)
    except (OSError, sqlite3.Error) as exc:
        print(f"swmp collector: cannot use the database: {exc}", file=sys.stderr)
        return 1
    collector = Collector(
        store,
        host=args.host,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        max_body=int(args.max_body_mb * 2**20),
        allow_hosts=tuple(args.allow_host),
    )
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            collector.start()
        except OSError as exc:
            print(f"swmp collector: cannot listen: {exc}", file=sys.stderr)
            return 1
        print(
            f"swmp collector: gRPC {collector.grpc_address}, HTTP {collector.http_address}, "
            f"traces at {collector.url}/ ; data: {'memory' if path == MEMORY else path}",
            flush=True,
        )
        if args.ready_file:
            doc = {"grpc_port": collector.grpc_port, "http_port": collector.http_port, "pid": os.getpid()}
            try:
                write_ready_file(args.ready_file, doc)
            except OSError as exc:
                print(f"swmp collector: cannot write the ready file: {exc}", file=sys.stderr)
                return 1
        while not stop.wait(1.0):
            pass
    finally:
        collector.stop()
        store.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swmp.collector", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
