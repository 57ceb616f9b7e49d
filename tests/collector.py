"""A small SkyWalking collector for tests: gRPC + HTTP, decoding with the generated modules.

In-process::

    with Collector() as c:                      # free ports on 127.0.0.1
        ... send to c.grpc_address / c.http_address ...
        assert c.wait_for(lambda: len(c.segments) >= 3)
        c.fail_next(2, grpc_code=grpc.StatusCode.UNAVAILABLE, http_status=503)
        c.delay_s = 2.0                          # every call sleeps first (timeouts)

As a separate process (for tests that run Gunicorn/uWSGI with the real agent)::

    python -m tests.collector --grpc-port 0 --http-port 0 --ready-file F --dump-file D

writes ``{"grpc_port": .., "http_port": .., "pid": ..}`` to F once both servers listen and
appends one JSON line per received message to D
(``{"transport", "kind", "message", "auth"}``, message in the proto3 JSON mapping).
:class:`CollectorProcess` wraps that for pytest (start, wait for the ready file, kill).

Everything received is decoded with the generated protobuf classes; HTTP bodies go through
the product collector's decoding (``swmp.collector.decode``: ``json_format`` into the same
classes), so a malformed body is a 400 and a test failure. This collector stays separate from
``swmp collector`` because tests need what a product must not have: injected failures and
delays, queued profiling tasks, and every message kept in memory in arrival order.
Kinds: segment, log, meter (each MeterData), properties, ping, snapshot, finish,
profile_query.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from reporter_proc.protocol.generated import (
    common_pb2,
    logging_pb2,
    logging_pb2_grpc,
    management_pb2,
    management_pb2_grpc,
    meter_pb2,
    meter_pb2_grpc,
    profile_pb2,
    profile_pb2_grpc,
    tracing_pb2,
    tracing_pb2_grpc,
)
from swmp.collector.decode import HTTP_ROUTES, BadInput, parse_json_body

REPO_ROOT = Path(__file__).resolve().parent.parent


# Ports this process has handed out. Callers pick several before any server binds one
# (tests/test_instrument_fastapi.py: one port per server, then the servers): the kernel
# can give the same free port twice in a row, and the second server then fails to bind
# while the first one answers on its port. Seen once in a whole-suite run.
_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that this process has
    not handed out before."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


class _Fault:
    def __init__(self, n: int, grpc_code: grpc.StatusCode, http_status: int, methods: frozenset[str] | None):
        self.n = n
        self.grpc_code = grpc_code
        self.http_status = http_status
        self.methods = methods


class Collector:
    """Records what agents send; can refuse (stop), delay and fail calls on demand."""

    def __init__(
        self,
        grpc_port: int = 0,
        http_port: int = 0,
        *,
        dump_file: str | None = None,
        enable_grpc: bool = True,
        enable_http: bool = True,
        grpc_credentials: grpc.ServerCredentials | None = None,
        http_ssl: ssl.SSLContext | None = None,
        keep: bool = True,
    ) -> None:
        # TLS tests: a secure gRPC port with these credentials, HTTPS with this context.
        self._grpc_credentials = grpc_credentials
        self._http_ssl = http_ssl
        self._want_grpc_port = grpc_port
        self._want_http_port = http_port
        self._enable_grpc = enable_grpc
        self._enable_http = enable_http
        self.grpc_port = 0
        self.http_port = 0
        self.dump_file = dump_file
        self._dump: Any = None
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._grpc_server: grpc.Server | None = None
        self._http_server: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        # what arrived
        self.segments: list[tracing_pb2.SegmentObject] = []
        self.logs: list[logging_pb2.LogData] = []
        self.meters: list[meter_pb2.MeterData] = []
        self.meter_collections = 0
        self.properties: list[management_pb2.InstanceProperties] = []
        self.pings: list[management_pb2.InstancePingPkg] = []
        self.snapshots: list[profile_pb2.ThreadSnapshot] = []
        self.finishes: list[profile_pb2.ProfileTaskFinishReport] = []
        self.profile_queries: list[profile_pb2.ProfileTaskCommandQuery] = []
        self.calls: Counter[str] = Counter()  # "grpc:collectInSync", "http:/v3/segments", ...
        self.failed_calls: Counter[str] = Counter()
        # keep=False counts what arrives, keeping and dumping none of it (benchmarks): a
        # collector holding every message of a long run grows to hundreds of MiB and works
        # per message, on the same cores as the application being measured.
        self.keeps = keep
        self.counted: Counter[str] = Counter()  # messages counted, not kept, per kind
        self.auth: list[str] = []  # authentication metadata/header of every call ("" when absent)
        # behaviour
        self.delay_s = 0.0
        self.profile_commands: list[common_pb2.Command] = []
        self._faults: list[_Fault] = []

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> Collector:
        if self.dump_file and self.keeps:
            self._dump = open(self.dump_file, "a", encoding="utf-8")  # noqa: SIM115 (closed in stop)
        if self._enable_grpc:
            self._start_grpc()
        if self._enable_http:
            self._start_http()
        return self

    def _start_grpc(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="collector-grpc"))
        tracing_pb2_grpc.add_TraceSegmentReportServiceServicer_to_server(_Tracing(self), server)  # type: ignore[no-untyped-call]
        logging_pb2_grpc.add_LogReportServiceServicer_to_server(_Logging(self), server)  # type: ignore[no-untyped-call]
        meter_pb2_grpc.add_MeterReportServiceServicer_to_server(_Meter(self), server)  # type: ignore[no-untyped-call]
        management_pb2_grpc.add_ManagementServiceServicer_to_server(_Management(self), server)  # type: ignore[no-untyped-call]
        profile_pb2_grpc.add_ProfileTaskServicer_to_server(_Profile(self), server)  # type: ignore[no-untyped-call]
        where = f"127.0.0.1:{self._want_grpc_port}"
        if self._grpc_credentials is not None:
            self.grpc_port = server.add_secure_port(where, self._grpc_credentials)
        else:
            self.grpc_port = server.add_insecure_port(where)
        if not self.grpc_port:
            raise OSError(f"cannot bind gRPC port {self._want_grpc_port}")
        server.start()
        self._grpc_server = server

    def _start_http(self) -> None:
        handler = type("Handler", (_HttpHandler,), {"collector": self})
        server = ThreadingHTTPServer(("127.0.0.1", self._want_http_port), handler)
        server.daemon_threads = True
        if self._http_ssl is not None:
            server.socket = self._http_ssl.wrap_socket(server.socket, server_side=True)
        self.http_port = server.server_address[1]
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="collector-http", daemon=True
        )
        thread.start()
        self._http_server, self._http_thread = server, thread

    def stop(self) -> None:
        """Stop listening (clients then see connection refused). Safe to call twice."""
        self._stopping.set()  # wakes delayed handlers
        if self._grpc_server is not None:
            self._grpc_server.stop(grace=None).wait(5)
            self._grpc_server = None
        if self._http_server is not None:
            self._http_server.shutdown()
            self._http_server.server_close()
            self._http_server = None
        with self._lock:
            if self._dump is not None:
                self._dump.close()
                self._dump = None

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    # -- test controls ---------------------------------------------------------------------
    def fail_next(
        self,
        n: int,
        *,
        grpc_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
        http_status: int = 503,
        methods: Iterable[str] | None = None,
    ) -> None:
        """Answer the next ``n`` calls (of ``methods``, e.g. "collectInSync" or "/v3/logs")
        with an error status instead of taking their data."""
        with self._lock:
            self._faults.append(_Fault(n, grpc_code, http_status, frozenset(methods) if methods else None))

    def add_profile_task(
        self,
        task_id: str,
        endpoint: str,
        *,
        serial: str = "",
        duration_min: int = 1,
        min_duration_ms: int = 0,
        dump_period_ms: int = 10,
        max_samples: int = 5,
        start_time: int = 0,
        create_time: int = 0,
    ) -> None:
        """Queue a ProfileTaskQuery command for getProfileTaskCommands to hand out."""
        args = {
            "SerialNumber": serial or f"serial-{task_id}",
            "TaskId": task_id,
            "EndpointName": endpoint,
            "Duration": str(duration_min),
            "MinDurationThreshold": str(min_duration_ms),
            "DumpPeriod": str(dump_period_ms),
            "MaxSamplingCount": str(max_samples),
            "StartTime": str(start_time or int(time.time() * 1000)),
            "CreateTime": str(create_time or int(time.time() * 1000)),
        }
        with self._lock:
            self.profile_commands.append(
                common_pb2.Command(
                    command="ProfileTaskQuery",
                    args=[common_pb2.KeyStringValuePair(key=k, value=v) for k, v in args.items()],
                )
            )

    def summary(self) -> dict[str, Any]:
        """Counts of what arrived, per kind and per call."""
        with self._lock:
            kept = {
                "segment": len(self.segments),
                "log": len(self.logs),
                "meter": len(self.meters),
                "properties": len(self.properties),
                "ping": len(self.pings),
                "snapshot": len(self.snapshots),
                "finish": len(self.finishes),
                "profile_query": len(self.profile_queries),
            }
            return {
                **{kind: n + self.counted[kind] for kind, n in kept.items()},
                "calls": dict(self.calls),
                "failed_calls": dict(self.failed_calls),
            }

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Block until ``predicate()`` holds or the timeout. Re-checked on every arrival and
        every 50 ms: a predicate may watch more than the arrivals (arena files removed,
        processes gone), and waking on arrivals alone sat out the whole timeout for those."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.05))
            return True

    # -- handler side ----------------------------------------------------------------------
    def _enter(self, transport: str, method: str, auth: str) -> _Fault | None:
        """Count the call, apply the delay; the fault to answer with, if any."""
        with self._lock:
            self.calls[f"{transport}:{method}"] += 1
            self.auth.append(auth)
            delay = self.delay_s
            fault = None
            for f in self._faults:
                if f.n > 0 and (f.methods is None or method in f.methods):
                    f.n -= 1
                    fault = f
                    self.failed_calls[f"{transport}:{method}"] += 1
                    break
            self._lock.notify_all()
        if delay > 0:
            self._stopping.wait(delay)
        return fault

    def _record(
        self, transport: str, kind: str, target: list[Any], messages: Iterable[Message], auth: str
    ) -> None:
        if not self.keeps:
            n = sum(1 for _ in messages)
            with self._lock:
                self.counted[kind] += n
                self._lock.notify_all()
            return
        with self._lock:
            for msg in messages:
                target.append(msg)
                if self._dump is not None:
                    line = {
                        "transport": transport,
                        "kind": kind,
                        "message": json_format.MessageToDict(msg),
                        "auth": auth,
                    }
                    self._dump.write(json.dumps(line) + "\n")
            if self._dump is not None:
                self._dump.flush()
            self._lock.notify_all()

    def _commands_for_query(self) -> common_pb2.Commands:
        with self._lock:
            commands, self.profile_commands = self.profile_commands, []
        return common_pb2.Commands(commands=commands)


# --------------------------------------------------------------------------- gRPC services
def _auth(context: grpc.ServicerContext) -> str:
    for key, value in context.invocation_metadata():
        if key == "authentication":
            return str(value)
    return ""


class _Base:
    def __init__(self, collector: Collector) -> None:
        self.c = collector

    def _handle(
        self,
        context: grpc.ServicerContext,
        method: str,
        kind: str,
        target: list[Any],
        messages: Callable[[], Iterable[Message]],
    ) -> common_pb2.Commands:
        auth = _auth(context)
        fault = self.c._enter("grpc", method, auth)
        if fault is not None:
            context.abort(fault.grpc_code, f"collector: injected failure of {method}")
        if not self.c.keeps:  # counted once per call: no lock and wake-up per message
            self.c._record("grpc", kind, target, messages(), auth)
            return common_pb2.Commands()
        for msg in messages():  # one by one: a long-lived stream shows its messages as they come
            self.c._record("grpc", kind, target, [msg], auth)
        return common_pb2.Commands()


class _Tracing(_Base, tracing_pb2_grpc.TraceSegmentReportServiceServicer):
    def collect(
        self, request_iterator: Iterator[tracing_pb2.SegmentObject], context: grpc.ServicerContext
    ) -> common_pb2.Commands:
        return self._handle(context, "collect", "segment", self.c.segments, lambda: request_iterator)

    def collectInSync(
        self, request: tracing_pb2.SegmentCollection, context: grpc.ServicerContext
    ) -> common_pb2.Commands:
        return self._handle(context, "collectInSync", "segment", self.c.segments, lambda: request.segments)


class _Logging(_Base, logging_pb2_grpc.LogReportServiceServicer):
    def collect(
        self, request_iterator: Iterator[logging_pb2.LogData], context: grpc.ServicerContext
    ) -> common_pb2.Commands:
        return self._handle(context, "log.collect", "log", self.c.logs, lambda: request_iterator)


class _Meter(_Base, meter_pb2_grpc.MeterReportServiceServicer):
    def collect(
        self, request_iterator: Iterator[meter_pb2.MeterData], context: grpc.ServicerContext
    ) -> common_pb2.Commands:
        return self._handle(context, "meter.collect", "meter", self.c.meters, lambda: request_iterator)

    def collectBatch(
        self, request_iterator: Iterator[meter_pb2.MeterDataCollection], context: grpc.ServicerContext
    ) -> common_pb2.Commands:
        def flatten() -> Iterator[meter_pb2.MeterData]:
            for coll in request_iterator:
                with self.c._lock:
                    self.c.meter_collections += 1
                yield from coll.meterData

        return self._handle(context, "collectBatch", "meter", self.c.meters, flatten)


class _Management(_Base, management_pb2_grpc.ManagementServiceServicer):
    def reportInstanceProperties(
        self, request: management_pb2.InstanceProperties, context: grpc.ServicerContext
    ) -> common_pb2.Commands:
        return self._handle(
            context, "reportInstanceProperties", "properties", self.c.properties, lambda: [request]
        )

    def keepAlive(
        self, request: management_pb2.InstancePingPkg, context: grpc.ServicerContext
    ) -> common_pb2.Commands:
        return self._handle(context, "keepAlive", "ping", self.c.pings, lambda: [request])


class _Profile(_Base, profile_pb2_grpc.ProfileTaskServicer):
    def getProfileTaskCommands(
        self, request: profile_pb2.ProfileTaskCommandQuery, context: grpc.ServicerContext
    ) -> common_pb2.Commands:
        self._handle(
            context, "getProfileTaskCommands", "profile_query", self.c.profile_queries, lambda: [request]
        )
        return self.c._commands_for_query()

    def collectSnapshot(
        self, request_iterator: Iterator[profile_pb2.ThreadSnapshot], context: grpc.ServicerContext
    ) -> common_pb2.Commands:
        return self._handle(
            context, "collectSnapshot", "snapshot", self.c.snapshots, lambda: request_iterator
        )

    def reportTaskFinish(
        self, request: profile_pb2.ProfileTaskFinishReport, context: grpc.ServicerContext
    ) -> common_pb2.Commands:
        return self._handle(context, "reportTaskFinish", "finish", self.c.finishes, lambda: [request])


# --------------------------------------------------------------------------- HTTP
# The routes and the body decoding are the product collector's (swmp.collector.decode): one
# definition of what the OAP's HTTP receivers accept. kind -> the list it is recorded in:
_HTTP_TARGETS = {"segment": "segments", "log": "logs", "properties": "properties", "ping": "pings"}


class _HttpHandler(BaseHTTPRequestHandler):
    collector: Collector
    protocol_version = "HTTP/1.1"  # keep-alive, as aiohttp's pooled connections expect

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def _reply(self, status: int, body: bytes = b"{}") -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        route = HTTP_ROUTES.get(self.path)
        if route is None:
            self._reply(404, b'{"error": "no such receiver"}')
            return
        auth = self.headers.get("Authentication") or ""
        fault = self.collector._enter("http", self.path, auth)
        if fault is not None:
            self._reply(fault.http_status, b'{"error": "injected"}')
            return
        try:
            messages = parse_json_body(body, route)
        except BadInput as exc:
            self._reply(400, json.dumps({"error": str(exc)}).encode())
            return
        kind, target = route.kind, _HTTP_TARGETS[route.kind]
        self.collector._record("http", kind, getattr(self.collector, target), messages, auth)
        self._reply(200)


# --------------------------------------------------------------------------- separate process
class CollectorProcess:
    """``python -m tests.collector`` in a child process; ports from its ready file.

    Use as a context manager; the child is killed by pid on exit, also on test failure.
    """

    def __init__(
        self, workdir: str | None = None, extra_args: Iterable[str] = (), *, dump: bool = True
    ) -> None:
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="swmp-collector-")
        base = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.ready_file = base / "collector.ready"
        self.dump_file = base / "collector.jsonl"
        self._extra = list(extra_args)
        self._dump = dump
        self.proc: subprocess.Popen[bytes] | None = None
        self.grpc_port = 0
        self.http_port = 0

    def start(self, timeout: float = 30.0) -> CollectorProcess:
        self.ready_file.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "tests.collector",
            "--grpc-port",
            "0",
            "--http-port",
            "0",
            "--ready-file",
            str(self.ready_file),
            *self._extra,
        ]
        if self._dump:
            cmd += ["--dump-file", str(self.dump_file)]
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT)
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"collector exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError("collector did not become ready")
            time.sleep(0.02)
        info = json.loads(self.ready_file.read_text())
        self.grpc_port, self.http_port = info["grpc_port"], info["http_port"]
        return self

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def received(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Lines of the dump file so far, optionally only one kind."""
        return [line for line in read_dump(self.dump_file) if kind is None or line["kind"] == kind]

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate(self.received()):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> CollectorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_dump(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Complete JSON lines of a dump file (a line being written is skipped)."""
    try:
        data = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for line in data.splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.collector",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--grpc-port", type=int, default=0, help="0 = a free port; -1 = no gRPC")
    ap.add_argument("--http-port", type=int, default=0, help="0 = a free port; -1 = no HTTP")
    ap.add_argument("--ready-file", help="JSON with the ports, written once listening")
    ap.add_argument("--dump-file", help="append one JSON line per received message")
    ap.add_argument("--fail-first", type=int, default=0, help="answer the first N calls with an error")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds every call waits first")
    ap.add_argument("--summary-file", help="on exit, write counts per kind and per call as JSON")
    ap.add_argument(
        "--count-only", action="store_true", help="count the messages; keep and dump none (benchmarks)"
    )
    args = ap.parse_args(argv)

    collector = Collector(
        max(args.grpc_port, 0),
        max(args.http_port, 0),
        dump_file=args.dump_file,
        enable_grpc=args.grpc_port >= 0,
        enable_http=args.http_port >= 0,
        keep=not args.count_only,
    )
    collector.delay_s = args.delay
    if args.fail_first:
        collector.fail_next(args.fail_first)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    collector.start()
    try:
        if args.ready_file:
            tmp = f"{args.ready_file}.tmp"
            Path(tmp).write_text(
                json.dumps(
                    {"grpc_port": collector.grpc_port, "http_port": collector.http_port, "pid": os.getpid()}
                )
            )
            os.replace(tmp, args.ready_file)  # readers never see a half-written file
        while not stop.wait(0.5):
            pass
    finally:
        collector.stop()
        if args.summary_file:
            Path(args.summary_file).write_text(json.dumps(collector.summary()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
