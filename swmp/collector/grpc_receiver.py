"""The gRPC receiver: the SkyWalking v3 services an agent calls, on a plain ``grpc.server``.

Handlers are registered generically (not through the generated servicer classes) so the
collector decodes request bytes itself: a message that is not valid protobuf becomes a
counted refusal and an INVALID_ARGUMENT answer, where the default deserializer would only
log a traceback. Profiling is answered with no task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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

MAX_MESSAGE_BYTES = 16 * 1024 * 1024


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


class _Handlers:
    def __init__(self, intake: Intake) -> None:
        self.intake = intake

    def _check(self, msg: Any, context: grpc.ServicerContext) -> Message:
        if isinstance(msg, _Bad):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(msg.error))
        return msg  # type: ignore[no-any-return]

    def unary(self, method: str, kind: str) -> Callable[[Any, grpc.ServicerContext], common_pb2.Commands]:
        def handle(request: Any, context: grpc.ServicerContext) -> common_pb2.Commands:
            self.intake.call("grpc", method)
            msg = self._check(request, context)
            if kind == "segments":  # SegmentCollection
                self.intake.accept("segment", msg.segments, "grpc")  # type: ignore[attr-defined]
            else:
                self.intake.accept(kind, [msg], "grpc")
            return _empty()

        return handle

    def stream(
        self, method: str, kind: str
    ) -> Callable[[Iterator[Any], grpc.ServicerContext], common_pb2.Commands]:
        def handle(requests: Iterator[Any], context: grpc.ServicerContext) -> common_pb2.Commands:
            self.intake.call("grpc", method)
            batch: list[Message] = []
            for request in requests:
                msg = self._check(request, context)
                if kind == "meter_batch":
                    batch.extend(msg.meterData)  # type: ignore[attr-defined]
                else:
                    batch.append(msg)
                if len(batch) >= 64:  # a long-lived stream: store as it comes
                    self.intake.accept(_kind(kind), batch, "grpc")
                    batch = []
            self.intake.accept(_kind(kind), batch, "grpc")
            return _empty()

        return handle

    def profile_query(self, request: Any, context: grpc.ServicerContext) -> common_pb2.Commands:
        self.intake.call("grpc", "getProfileTaskCommands")
        self._check(request, context)
        return _empty()  # no profiling tasks: this collector has no way to create one


def _kind(kind: str) -> str:
    return "meter" if kind == "meter_batch" else kind


def build_server(intake: Intake, host: str, port: int, workers: int = 8) -> tuple[grpc.Server, int]:
    """A started-able gRPC server with every receiver registered; (server, bound port)."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="collector-grpc"),
        # gRPC sets SO_REUSEPORT by default: a second collector would then share a port that
        # is in use (each taking part of the agents' data) instead of failing to listen.
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.so_reuseport", 0)],
    )
    h = _Handlers(intake)
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
