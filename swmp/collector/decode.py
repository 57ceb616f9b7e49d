"""What agents send -> plain documents the store and the web page use.

One decoding path for both transports: a gRPC request arrives as a generated protobuf
message; an HTTP body is parsed with ``json_format`` into the same message class first (so
both transports accept exactly what the OAP's receivers accept, field names and enums
included), then both go through the ``*_doc`` functions below.

Anything that cannot be decoded raises :class:`BadInput` with a short ``reason`` (the key the
collector counts refusals under) and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from reporter_proc.protocol.generated import (
    common_pb2,
    logging_pb2,
    management_pb2,
    meter_pb2,
    tracing_pb2,
)

Doc = dict[str, Any]

SPAN_TYPES = ("Entry", "Exit", "Local")
SPAN_LAYERS = ("Unknown", "Database", "RPCFramework", "Http", "MQ", "Cache", "FAAS")
REF_TYPES = ("CrossProcess", "CrossThread")


class BadInput(ValueError):
    """Input refused; ``reason`` is a short stable key (``bad_protobuf``, ``bad_json``, ...)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class HttpRoute:
    kind: str  # segment | log | properties | ping
    message: type[Message]
    is_array: bool  # the body is a JSON array of messages


# The OAP's HTTP receiver paths (``/v3/segments`` takes a batch, ``/v3/segment`` one).
HTTP_ROUTES: dict[str, HttpRoute] = {
    "/v3/segments": HttpRoute("segment", tracing_pb2.SegmentObject, True),
    "/v3/segment": HttpRoute("segment", tracing_pb2.SegmentObject, False),
    "/v3/logs": HttpRoute("log", logging_pb2.LogData, True),
    "/v3/management/reportProperties": HttpRoute("properties", management_pb2.InstanceProperties, False),
    "/v3/management/keepAlive": HttpRoute("ping", management_pb2.InstancePingPkg, False),
}


def parse_json_body(body: bytes, route: HttpRoute) -> list[Message]:
    """An HTTP receiver's body -> the messages it carries (BadInput when it is not valid)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInput("bad_json", str(exc)[:200]) from None
    except RecursionError:  # ``[[[[...`` deeper than the interpreter's stack: no message is
        raise BadInput("bad_json", "nested too deeply") from None
    docs = doc if route.is_array else [doc]
    if not isinstance(docs, list):
        raise BadInput("bad_json", "expected a JSON array")
    try:
        return [json_format.ParseDict(d, route.message()) for d in docs]
    except (json_format.ParseError, TypeError, ValueError, AttributeError) as exc:
        raise BadInput("bad_message", str(exc)[:200]) from None
    except RecursionError:
        raise BadInput("bad_message", "nested too deeply") from None


def parse_protobuf(cls: type[Message], data: bytes) -> Message:
    """A gRPC request body -> message (BadInput on bytes that are not one)."""
    try:
        msg = cls()
        msg.ParseFromString(data)
        return msg
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise BadInput("bad_protobuf", f"{cls.__name__}: {exc}"[:200]) from None


def _pairs(items: Iterable[common_pb2.KeyStringValuePair]) -> list[list[str]]:
    return [[kv.key, kv.value] for kv in items]


def _name(names: tuple[str, ...], value: int) -> str:
    return names[value] if 0 <= value < len(names) else str(value)


def segment_doc(seg: tracing_pb2.SegmentObject) -> Doc:
    """SegmentObject -> the stored segment document (every field the agent set)."""
    spans = []
    for s in seg.spans:
        spans.append(
            {
                "span_id": s.spanId,
                "parent_span_id": s.parentSpanId,
                "start": s.startTime,
                "end": s.endTime,
                "operation": s.operationName,
                "peer": s.peer,
                "type": _name(SPAN_TYPES, s.spanType),
                "layer": _name(SPAN_LAYERS, s.spanLayer),
                "component_id": s.componentId,
                "is_error": s.isError,
                "skip_analysis": s.skipAnalysis,
                "tags": _pairs(s.tags),
                "logs": [{"time": lg.time, "data": _pairs(lg.data)} for lg in s.logs],
                "refs": [
                    {
                        "type": _name(REF_TYPES, r.refType),
                        "trace_id": r.traceId,
                        "parent_segment_id": r.parentTraceSegmentId,
                        "parent_span_id": r.parentSpanId,
                        "parent_service": r.parentService,
                        "parent_instance": r.parentServiceInstance,
                        "parent_endpoint": r.parentEndpoint,
                        "address": r.networkAddressUsedAtPeer,
                    }
                    for r in s.refs
                ],
            }
        )
    return {
        "trace_id": seg.traceId,
        "segment_id": seg.traceSegmentId,
        "service": seg.service,
        "instance": seg.serviceInstance,
        "size_limited": seg.isSizeLimited,
        "spans": spans,
    }


def log_doc(log: logging_pb2.LogData) -> Doc:
    body_type = log.body.WhichOneof("content") or ""
    if body_type == "text":
        content = log.body.text.text
    elif body_type == "json":
        content = log.body.json.json
    elif body_type == "yaml":
        content = log.body.yaml.yaml
    else:
        content = ""
    return {
        "timestamp": log.timestamp,
        "service": log.service,
        "instance": log.serviceInstance,
        "endpoint": log.endpoint,
        "content_type": body_type or log.body.type,
        "content": content,
        "trace_id": log.traceContext.traceId,
        "segment_id": log.traceContext.traceSegmentId,
        "span_id": log.traceContext.spanId,
        "tags": _pairs(log.tags.data),
        "layer": log.layer,
    }


def meter_doc(meter: meter_pb2.MeterData) -> Doc:
    kind = meter.WhichOneof("metric") or ""
    doc: Doc = {
        "service": meter.service,
        "instance": meter.serviceInstance,
        "timestamp": meter.timestamp,
        "kind": kind,
    }
    if kind == "singleValue":
        v = meter.singleValue
        doc.update(name=v.name, labels=[[lb.name, lb.value] for lb in v.labels], value=v.value)
    elif kind == "histogram":
        h = meter.histogram
        doc.update(
            name=h.name,
            labels=[[lb.name, lb.value] for lb in h.labels],
            value=[[b.bucket, b.count] for b in h.values],
        )
    else:
        doc.update(name="", labels=[], value=None)
    return doc


def properties_doc(props: management_pb2.InstanceProperties) -> Doc:
    return {
        "service": props.service,
        "instance": props.serviceInstance,
        "properties": _pairs(props.properties),
        "layer": props.layer,
    }


def ping_doc(ping: management_pb2.InstancePingPkg) -> Doc:
    return {"service": ping.service, "instance": ping.serviceInstance, "layer": ping.layer}
