"""The gRPC receiver: the SkyWalking v3 services an agent calls, on a plain ``grpc.server``.

Handlers are registered generically (not through the generated servicer classes) so the
collector decodes request bytes itself: a message that is not valid protobuf becomes a
counted refusal and an INVALID_ARGUMENT answer, where the default deserializer would only
log a traceback. Profiling is answered with no task.

The server has ``WORKERS`` threads, and a client stream (``collect``, ``collectBatch``,
``collectSnapshot``) holds one for as long as the client keeps it open. So at most
``MAX_STREAMS`` streams are open at once: unary calls (``collectInSync``, ``keepAlive``, ...)
always find a thread. A stream that sends no message for ``STREAM_IDLE_S`` is ended with
DEADLINE_EXCEEDED (counted ``stream_idle``; what it sent before is kept). When all are open,
a new stream ends the one idle longest, if that one sent nothing for ``STREAM_EVICT_IDLE_S``
(the same status and count): streams held open by clients that send nothing cannot keep an
agent's stream out. Otherwise the new one is refused at once with RESOURCE_EXHAUSTED
(``too_many_streams``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from typing import Any

import grpc
from google.protobuf.message import Message

from reporter_proc.protocol.generated import (
    common_pb2,
    logging_pb2,
    management_pb2,
    meter_pb2,
    profile_pb2,
    tracing_pb2,
)
from swmp.collector.decode import BadInput, parse_protobuf
from swmp.collector.intake import Intake
from swmp.collector.store import StoreWriteError

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
WORKERS = 16  # threads answering calls
MAX_STREAMS = WORKERS - 4  # client streams open at once: the other threads stay for unary calls
STREAM_IDLE_S = 10.0  # a client stream that sends nothing for this long is ended
STREAM_EVICT_IDLE_S = 1.0  # when all are open, one silent this long makes room for a new one
_WATCH_EVERY_S = 0.25


class _Bad:
    """Stands in for a request message that could not be decoded."""

    def __init__(self, error: BadInput) -> None:
        self.error = error


def _deserializer(intake: Intake, method: str, cls: type[Message]) -> Callable[[bytes], Any]:
    def load(data: bytes) -> Any:
        try:
            return parse_protobuf(cls, data)
        except BadInput as exc:
            intake.refuse(f"grpc {method}", exc.reason, exc.detail)
            return _Bad(exc)

    return load


def _empty(_request: Any = None) -> common_pb2.Commands:
    return common_pb2.Commands()


def _end_call(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    """End a call from another thread than its handler's, with this status. The handler
    is blocked waiting for the next request: only a cancellation wakes it. The public
    ``context.cancel()`` tells the client CANCELLED and nothing more; grpcio's own call
    object cancels with a status (its handler's iterator then simply ends)."""
    call = getattr(getattr(context, "_rpc_event", None), "call", None)
    try:
        call.cancel(code.value[0], details)  # type: ignore[union-attr]
    except Exception:  # another grpcio: the client sees CANCELLED
        context.cancel()


class _Stream:
    def __init__(self, method: str, context: grpc.ServicerContext) -> None:
        self.method = method
        self.context = context
        self.last = time.monotonic()  # when the last message came (or the stream opened)
        self.ended = False  # by the watchdog


class _Streams:
    """The open client streams: at most ``limit``. One idle past ``idle_s`` is ended by a
    watchdog thread, which runs while streams are open; when all are open, a new one takes
    the place of the one idle longest if that one is idle past ``evict_idle_s``."""

    def __init__(
        self,
        intake: Intake,
        limit: int = MAX_STREAMS,
        idle_s: float = STREAM_IDLE_S,
        evict_idle_s: float = STREAM_EVICT_IDLE_S,
    ) -> None:
        self.intake = intake
        self.limit = limit
        self.idle_s = idle_s
        self.evict_idle_s = evict_idle_s
        self._lock = threading.Lock()
        self._open: set[_Stream] = set()
        self._watching = False

    def open(self, method: str, context: grpc.ServicerContext) -> _Stream | None:
        """The new stream, or None when ``limit`` are open and none is idle enough to go."""
        evicted = None
        with self._lock:
            now = time.monotonic()
            if len(self._open) >= self.limit:
                evicted = min(self._open, key=lambda s: s.last)
                if now - evicted.last <= self.evict_idle_s:
                    return None
                evicted.ended = True
                self._open.discard(evicted)  # its place is the new one's now
            stream = _Stream(method, context)
            self._open.add(stream)
            if not self._watching:
                self._watching = True
                threading.Thread(target=self._watch, name="collector-grpc-streams", daemon=True).start()
        if evicted is not None:
            self._end(evicted, f"no message for {now - evicted.last:.1f} s, {self.limit} streams open: ended")
        return stream

    def close(self, stream: _Stream) -> None:
        with self._lock:
            self._open.discard(stream)

    def _end(self, stream: _Stream, detail: str) -> None:
        self.intake.refuse(f"grpc {stream.method}", "stream_idle", detail)
        _end_call(stream.context, grpc.StatusCode.DEADLINE_EXCEEDED, f"swmp collector: {detail}")

    def _watch(self) -> None:
        while True:
            time.sleep(_WATCH_EVERY_S)
            now = time.monotonic()
            with self._lock:
                if not self._open:
                    self._watching = False
                    return
                idle = [s for s in self._open if not s.ended and now - s.last > self.idle_s]
                for s in idle:
                    s.ended = True
                    self._open.discard(s)
            for s in idle:
                self._end(s, f"no message for {self.idle_s:g} s: stream ended")


class _Handlers:
    def __init__(self, intake: Intake, max_streams: int = MAX_STREAMS) -> None:
        self.intake = intake
        self.streams = _Streams(intake, max_streams)

    def _check(self, msg: Any, context: grpc.ServicerContext) -> Message:
        if isinstance(msg, _Bad):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(msg.error))
        return msg  # type: ignore[no-any-return]

    def _accept(self, method: str, kind: str, msgs: Iterable[Message], context: grpc.ServicerContext) -> None:
        try:
            self.intake.accept(kind, msgs, "grpc")
        except StoreWriteError as exc:
            self.intake.refuse(f"grpc {method}", "store_failed", str(exc))
            # UNAVAILABLE: an agent keeps the data and sends it again later
            context.abort(grpc.StatusCode.UNAVAILABLE, f"swmp collector: {exc}")

    def unary(self, method: str, kind: str) -> Callable[[Any, grpc.ServicerContext], common_pb2.Commands]:
        def handle(request: Any, context: grpc.ServicerContext) -> common_pb2.Commands:
            self.intake.call("grpc", method)
            msg = self._check(request, context)
            if kind == "segments":  # SegmentCollection
                self._accept(method, "segment", msg.segments, context)  # type: ignore[attr-defined]
            else:
                self._accept(method, kind, [msg], context)
            return _empty()

        return handle

    def stream(
        self, method: str, kind: str
    ) -> Callable[[Iterator[Any], grpc.ServicerContext], common_pb2.Commands]:
        def handle(requests: Iterator[Any], context: grpc.ServicerContext) -> common_pb2.Commands:
            self.intake.call("grpc", method)
            stream = self.streams.open(method, context)
            if stream is None:
                limit = self.streams.limit
                self.intake.refuse(f"grpc {method}", "too_many_streams", f"{limit} streams open")
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"swmp collector: {limit} streams open, the most it takes at once; try again later",
                )
                return _empty()  # (abort raised)
            batch: list[Message] = []
            try:
                for request in requests:
                    stream.last = time.monotonic()
                    msg = self._check(request, context)
                    if kind == "meter_batch":
                        batch.extend(msg.meterData)  # type: ignore[attr-defined]
                    else:
                        batch.append(msg)
                    if len(batch) >= 64:  # a long-lived stream: store as it comes
                        self._accept(method, _kind(kind), batch, context)
                        batch = []
            except grpc.RpcError:  # the call was cancelled (by the client, or ended idle)
                if not stream.ended:
                    raise
            finally:
                self.streams.close(stream)
            self._accept(method, _kind(kind), batch, context)  # what came before an idle end too
            return _empty()

        return handle

    def profile_query(self, request: Any, context: grpc.ServicerContext) -> common_pb2.Commands:
        self.intake.call("grpc", "getProfileTaskCommands")
        self._check(request, context)
        return _empty()  # no profiling tasks: this collector has no way to create one


def _kind(kind: str) -> str:
    return "meter" if kind == "meter_batch" else kind


def build_server(intake: Intake, host: str, port: int, workers: int = WORKERS) -> tuple[grpc.Server, int]:
    """A started-able gRPC server with every receiver registered; (server, bound port)."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="collector-grpc"),
        # gRPC sets SO_REUSEPORT by default: a second collector would then share a port that
        # is in use (each taking part of the agents' data) instead of failing to listen.
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.so_reuseport", 0)],
    )
    h = _Handlers(intake, max_streams=max(1, workers - (WORKERS - MAX_STREAMS)))
    out = common_pb2.Commands.SerializeToString

    def unary(method: str, cls: type[Message], fn: Any) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=_deserializer(intake, method, cls), response_serializer=out
        )

    def stream(method: str, cls: type[Message], kind: str) -> grpc.RpcMethodHandler:
        return grpc.stream_unary_rpc_method_handler(
            h.stream(method, kind),
            request_deserializer=_deserializer(intake, method, cls),
            response_serializer=out,
        )

    services: dict[str, dict[str, grpc.RpcMethodHandler]] = {
        "skywalking.v3.TraceSegmentReportService": {
            "collect": stream("collect", tracing_pb2.SegmentObject, "segment"),
            "collectInSync": unary(
                "collectInSync", tracing_pb2.SegmentCollection, h.unary("collectInSync", "segments")
            ),
        },
        "skywalking.v3.LogReportService": {"collect": stream("log.collect", logging_pb2.LogData, "log")},
        "skywalking.v3.MeterReportService": {
            "collect": stream("meter.collect", meter_pb2.MeterData, "meter"),
            "collectBatch": stream("collectBatch", meter_pb2.MeterDataCollection, "meter_batch"),
        },
        "skywalking.v3.ManagementService": {
            "reportInstanceProperties": unary(
                "reportInstanceProperties",
                management_pb2.InstanceProperties,
                h.unary("reportInstanceProperties", "properties"),
            ),
            "keepAlive": unary("keepAlive", management_pb2.InstancePingPkg, h.unary("keepAlive", "ping")),
        },
        "skywalking.v3.ProfileTask": {
            "getProfileTaskCommands": unary(
                "getProfileTaskCommands", profile_pb2.ProfileTaskCommandQuery, h.profile_query
            ),
            "collectSnapshot": stream("collectSnapshot", profile_pb2.ThreadSnapshot, "snapshot"),
            "reportTaskFinish": unary(
                "reportTaskFinish", profile_pb2.ProfileTaskFinishReport, h.unary("reportTaskFinish", "finish")
            ),
        },
    }
    server.add_generic_rpc_handlers(
        tuple(grpc.method_handlers_generic_handler(name, methods) for name, methods in services.items())
    )
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:  # grpcio >= 1.5x raises where older versions returned 0
        bound = 0
    if not bound:
        raise OSError(f"cannot listen for gRPC on {host}:{port}")
    return server, bound
