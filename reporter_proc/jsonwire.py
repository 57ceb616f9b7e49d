"""Records -> proto3-JSON objects for the OAP's HTTP receiver.

The HTTP receiver (``/v3/segments``, ``/v3/logs``, ``/v3/management/*``) takes the proto3
JSON mapping of the same messages the gRPC path sends: lowerCamelCase field names, enums by
name, int64 as JSON numbers. Fields at their default value are left out, as the protobuf
library's own ``MessageToDict`` does. The mapping choices for LOG records are the ones of
``reporter_proc.encode`` (tests parse both back into the generated classes and compare).

Values are type-checked on the way (the JSON would otherwise carry garbage to the backend);
an invalid record raises :class:`reporter_proc.encode.EncodeError` and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from reporter_proc.encode import EncodeError

__all__ = ["dumps", "instance_ping", "instance_properties", "log", "segment"]

Record = Sequence[Any]
Json = dict[str, Any]

_SPAN_TYPES = ("Entry", "Exit", "Local")
_SPAN_LAYERS = ("Unknown", "Database", "RPCFramework", "Http", "MQ", "Cache", "FAAS")
_REF_TYPES = ("CrossProcess", "CrossThread")
_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _str(v: object) -> str:
    if v.__class__ is not str and not isinstance(v, str):
        raise EncodeError(f"not a string: {v!r}")
    return v


def _int(v: object, bounds: tuple[int, int]) -> int:
    if (v.__class__ is not int and not isinstance(v, int)) or not bounds[0] <= v <= bounds[1]:
        raise EncodeError(f"not an integer in range: {v!r}")
    return int(v)


def _bool(v: object) -> bool:
    if v is True:
        return True
    if v is False or v is None:
        return False
    raise EncodeError(f"not a bool: {v!r}")


def _enum(v: object, names: tuple[str, ...]) -> str | int:
    n = _int(v, _INT32)
    # proto3 enums are open: a value without a name travels as its number
    return names[n] if 0 <= n < len(names) else n


def _put_str(d: Json, name: str, v: object) -> None:
    if v:
        d[name] = _str(v)
    elif v.__class__ is not str and v is not None:
        raise EncodeError(f"not a string: {v!r}")


def _put_int(d: Json, name: str, v: object, bounds: tuple[int, int]) -> None:
    n = _int(v, bounds)
    if n:
        d[name] = n


def _pairs(flat: object) -> list[Json]:
    if not isinstance(flat, (list, tuple)) or len(flat) % 2:
        raise EncodeError(f"not a flat key/value list: {flat!r}")
    out = []
    for i in range(0, len(flat), 2):
        kv: Json = {}
        _put_str(kv, "key", flat[i])
        _put_str(kv, "value", flat[i + 1])
        out.append(kv)
    return out


def _ref(ref: Record) -> Json:
    ref_type, trace_id, parent_segment, parent_span, service, instance, endpoint, address = ref
    d: Json = {}
    if _int(ref_type, _INT32):
        d["refType"] = _enum(ref_type, _REF_TYPES)
    _put_str(d, "traceId", trace_id)
    _put_str(d, "parentTraceSegmentId", parent_segment)
    _put_int(d, "parentSpanId", parent_span, _INT32)
    _put_str(d, "parentService", service)
    _put_str(d, "parentServiceInstance", instance)
    _put_str(d, "parentEndpoint", endpoint)
    _put_str(d, "networkAddressUsedAtPeer", address)
    return d


def _span(span: Record) -> Json:
    (
        span_id,
        parent_id,
        start,
        end,
        operation,
        peer,
        span_type,
        layer,
        component,
        is_error,
        skip_analysis,
        tags,
        logs,
        refs,
    ) = span
    d: Json = {}
    _put_int(d, "spanId", span_id, _INT32)
    _put_int(d, "parentSpanId", parent_id, _INT32)
    _put_int(d, "startTime", start, _INT64)
    _put_int(d, "endTime", end, _INT64)
    if refs:
        d["refs"] = [_ref(r) for r in refs]
    _put_str(d, "operationName", operation)
    _put_str(d, "peer", peer)
    if _int(span_type, _INT32):
        d["spanType"] = _enum(span_type, _SPAN_TYPES)
    if _int(layer, _INT32):
        d["spanLayer"] = _enum(layer, _SPAN_LAYERS)
    _put_int(d, "componentId", component, _INT32)
    if _bool(is_error):
        d["isError"] = True
    if tags:
        d["tags"] = _pairs(tags)
    if logs:
        entries = []
        for time_ms, data in logs:
            entry: Json = {}
            _put_int(entry, "time", time_ms, _INT64)
            if data:
                entry["data"] = _pairs(data)
            entries.append(entry)
        d["logs"] = entries
    if _bool(skip_analysis):
        d["skipAnalysis"] = True
    return d


def _segment(rec: Record) -> Json:
    trace_id, segment_id, service, instance, size_limited, spans = rec
    d: Json = {}
    _put_str(d, "traceId", trace_id)
    _put_str(d, "traceSegmentId", segment_id)
    if spans:
        d["spans"] = [_span(s) for s in spans]
    _put_str(d, "service", service)
    _put_str(d, "serviceInstance", instance)
    if _bool(size_limited):
        d["isSizeLimited"] = True
    return d


def _log(rec: Record) -> Json:
    (timestamp, service, instance, endpoint, body_kind, body, trace_id, segment_id, span_id, tags, layer) = (
        rec
    )
    if body_kind not in ("text", "json", "yaml"):
        raise EncodeError(f"unknown log body kind {body_kind!r}")
    d: Json = {}
    _put_int(d, "timestamp", timestamp, _INT64)
    _put_str(d, "service", service)
    _put_str(d, "serviceInstance", instance)
    _put_str(d, "endpoint", endpoint)
    content: Json = {}
    _put_str(content, body_kind, body)
    d["body"] = {"type": body_kind, body_kind: content}
    span_id = _int(span_id, _INT32)
    if trace_id or segment_id:
        ctx: Json = {}
        _put_str(ctx, "traceId", trace_id)
        _put_str(ctx, "traceSegmentId", segment_id)
        if span_id > 0:
            ctx["spanId"] = span_id
        d["traceContext"] = ctx
    else:
        _str(trace_id)
        _str(segment_id)
    if tags:
        d["tags"] = {"data": _pairs(tags)}
    _put_str(d, "layer", layer)
    return d


def _guard(what: str, fn: Any, *args: Any) -> Json:
    try:
        result: Json = fn(*args)
        return result
    except EncodeError:
        raise
    except Exception as exc:
        raise EncodeError(f"invalid {what}: {type(exc).__name__}: {exc}") from exc


def segment(rec: Record) -> Json:
    """SEGMENT record -> SegmentObject JSON object."""
    return _guard("SEGMENT record", _segment, rec)


def log(rec: Record) -> Json:
    """LOG record -> LogData JSON object."""
    return _guard("LOG record", _log, rec)


def _properties(service: str, instance: str, properties: Sequence[tuple[str, str]], layer: str) -> Json:
    d: Json = {}
    _put_str(d, "service", service)
    _put_str(d, "serviceInstance", instance)
    if properties:
        d["properties"] = _pairs([x for key, value in properties for x in (key, value)])
    _put_str(d, "layer", layer)
    return d


def instance_properties(
    service: str, instance: str, properties: Sequence[tuple[str, str]], layer: str = ""
) -> Json:
    """InstanceProperties JSON object."""
    return _guard("InstanceProperties", _properties, service, instance, properties, layer)


def _ping(service: str, instance: str, layer: str) -> Json:
    d: Json = {}
    _put_str(d, "service", service)
    _put_str(d, "serviceInstance", instance)
    _put_str(d, "layer", layer)
    return d


def instance_ping(service: str, instance: str, layer: str = "") -> Json:
    """InstancePingPkg JSON object."""
    return _guard("InstancePingPkg", _ping, service, instance, layer)


def dumps(value: Json | list[Json]) -> bytes:
    """JSON body bytes (orjson: what the checks above let through always serializes)."""
    try:
        return orjson.dumps(value)
    except Exception as exc:
        raise EncodeError(f"cannot serialize: {exc}") from exc
