"""The backend the fault suite faults: the in-test gRPC collector behind a :class:`FaultProxy`.

    with fault_backend() as fb:
        fb.address                         # give this to the agent (the proxy's port)
        fb.outage() / fb.blackhole()       # port closed / accepts, never answers
        fb.answer_errors(grpc.StatusCode.UNAVAILABLE)
        fb.oversize_limit(True)            # messages over STRICT_LIMIT: RESOURCE_EXHAUSTED
        fb.heal()                          # everything back to normal
        fb.received("svc")                 # Counter {trace id: segments received}

Oversize is the gRPC server's own receive limit (what the OAP does): a second collector
with a small ``grpc.max_receive_message_length`` that the proxy is pointed at.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent import futures
from typing import Any

import grpc
from google.protobuf.message import Message

from reporter_proc.protocol.generated import (
    logging_pb2_grpc,
    management_pb2_grpc,
    meter_pb2_grpc,
    profile_pb2_grpc,
    tracing_pb2_grpc,
)
from tests.collector import (
    Collector,
    _Fault,
    _Logging,
    _Management,
    _Meter,
    _Profile,
    _Tracing,
)
from tests.faults.proxy import FaultProxy, Mode

STRICT_LIMIT = 16 * 1024  # bytes: a batch of a few dozen segments is over it, one segment is not


class IdCollector(Collector):
    """A collector that keeps, of segments, only ``(service, trace id)`` counts.

    A ten-minute run at 1,000 segments/s would otherwise hold 600,000 decoded messages.
    """

    def __init__(self, max_message_bytes: int = 0) -> None:
        super().__init__(enable_http=False)
        self.max_message_bytes = max_message_bytes
        self.trace_ids: Counter[tuple[str, str]] = Counter()
        self.segment_count = 0
        self._always: _Fault | None = None

    def _start_grpc(self) -> None:
        options = []
        if self.max_message_bytes:
            options.append(("grpc.max_receive_message_length", self.max_message_bytes))
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=options)
        tracing_pb2_grpc.add_TraceSegmentReportServiceServicer_to_server(_Tracing(self), server)  # type: ignore[no-untyped-call]
        logging_pb2_grpc.add_LogReportServiceServicer_to_server(_Logging(self), server)  # type: ignore[no-untyped-call]
        meter_pb2_grpc.add_MeterReportServiceServicer_to_server(_Meter(self), server)  # type: ignore[no-untyped-call]
        management_pb2_grpc.add_ManagementServiceServicer_to_server(_Management(self), server)  # type: ignore[no-untyped-call]
        profile_pb2_grpc.add_ProfileTaskServicer_to_server(_Profile(self), server)  # type: ignore[no-untyped-call]
        self.grpc_port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._grpc_server = server

    def _record(
        self, transport: str, kind: str, target: list[Any], messages: Iterable[Message], auth: str
    ) -> None:
        if kind != "segment":
            super()._record(transport, kind, target, messages, auth)
            return
        with self._lock:
            for msg in messages:
                self.trace_ids[(msg.service, msg.traceId)] += 1  # type: ignore[attr-defined]
                self.segment_count += 1
            self._lock.notify_all()

    def fail_always(self, code: grpc.StatusCode) -> None:
        """Answer every call with ``code`` until :meth:`heal`."""
        self.heal()
        with self._lock:
            self._always = _Fault(2**62, code, 503, None)
            self._faults.append(self._always)

    def heal(self) -> None:
        with self._lock:
            if self._always is not None:
                self._always.n = 0
                self._faults.remove(self._always)
                self._always = None

    def received(self, service: str) -> Counter[str]:
        with self._lock:
            return Counter({tid: n for (svc, tid), n in self.trace_ids.items() if svc == service})

    def properties_of(self, service: str) -> int:
        """Instance-properties reports received for ``service`` (called under the lock too)."""
        with self._lock:
            return sum(1 for p in self.properties if p.service == service)


class FaultBackend:
    def __init__(self) -> None:
        self.collector = IdCollector()
        self.strict = IdCollector(max_message_bytes=STRICT_LIMIT)
        self.proxy: FaultProxy | None = None

    def start(self) -> FaultBackend:
        self.collector.start()
        self.strict.start()
        self.proxy = FaultProxy(("127.0.0.1", self.collector.grpc_port)).start()
        return self

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        self.collector.stop()
        self.strict.stop()

    @property
    def address(self) -> str:
        assert self.proxy is not None
        return self.proxy.address

    def _mode(self, mode: Mode) -> None:
        assert self.proxy is not None
        self.proxy.set_mode(mode)

    def outage(self) -> None:
        self._mode("closed")

    def blackhole(self) -> None:
        self._mode("blackhole")

    def answer_errors(self, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        self.collector.fail_always(code)

    def oversize_limit(self, on: bool) -> None:
        """Route to the collector that rejects messages over :data:`STRICT_LIMIT` (or back)."""
        assert self.proxy is not None
        target = self.strict if on else self.collector
        self.proxy.set_upstream(("127.0.0.1", target.grpc_port))

    def heal(self) -> None:
        """Backend healthy again: port open, forwarding, no injected errors, normal limit."""
        self.collector.heal()
        self._mode("pass")
        self.oversize_limit(False)

    def received(self, service: str) -> Counter[str]:
        """Trace id -> segments received for ``service``, from both collectors."""
        return self.collector.received(service) + self.strict.received(service)


@contextlib.contextmanager
def fault_backend() -> Iterator[FaultBackend]:
    backend = FaultBackend()
    try:
        yield backend.start()
    finally:
        backend.stop()
