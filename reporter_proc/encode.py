"""Records -> SkyWalking v3 protobuf bytes, without building protobuf objects.

The reporter turns every decoded record (the positional lists of ``reporter_proc.records``)
into wire bytes. Building ``SegmentObject`` messages field by field costs about twice what
writing the protobuf wire format directly costs (design notes: ~11 us against ~5.5 us per
span), so this module is a small hand-written encoder: a straight walk over the list in
protobuf field-number order, producing exactly the bytes ``SerializeToString()`` would (the
tests check byte identity against the generated classes).

The wire rules and the caches of encoded fields are in ``_wire.py``.

Mapping choices where the record format leaves room (the tests pin them):

- LOG: ``body`` becomes ``LogDataBody{type=<kind>, <kind>={...}}``; ``traceContext`` is set
  only when the record has a trace id or a segment id, and its ``spanId`` only when > 0;
  ``tags`` (``LogTags``) only when the record has tags.
- METER: every ``MeterData`` carries service, instance and timestamp.
- PROFILE_SNAPSHOT: ``stack`` is always set.

Native accelerator: when ``reporter_proc._encode_native`` (C, built by ``pip install`` from
``_native/*.c``, optional) is importable, ``segment``, ``log`` and ``segment_collection``
are its functions, which produce the same bytes and raise the same ``EncodeError``; the
pure-Python versions stay available as ``segment_py``, ``log_py`` and
``segment_collection_py``. ``SWMP_ENCODE_PURE=1`` in the reporter's environment forces pure
Python (tests, benchmarks).

Anything that is not a valid record raises :class:`EncodeError` and nothing else: the
reporter counts and drops such records instead of crashing on them.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Final, TypeVar

import orjson

from reporter_proc._wire import (
    _F1,
    _F2,
    _F3,
    _F4,
    _KV_F1,
    _KV_F2,
    _KV_KEY,
    _LO14,
    _SEG_INSTANCE,
    _SEG_SERVICE,
    _SPAN_IDS,
    _SPAN_STATIC,
    _SPAN_TAGS,
    _V14,
    CACHE_MAX,
    SHORT_VALUE,
    EncodeError,
    Record,
    _bool,
    _cache,
    _double,
    _int32,
    _int64,
    _kv_pairs,
    _labels,
    _msg,
    _str,
    _uvarint,
    clear_caches,
)
from reporter_proc.records import METER_HISTOGRAM, METER_SINGLE

__all__ = [
    "CACHE_MAX",
    "NATIVE",
    "EncodeError",
    "clear_caches",
    "instance_ping",
    "instance_properties",
    "log",
    "meter_collection",
    "meter_datas",
    "profile_finish",
    "profile_task_query",
    "segment",
    "segment_collection",
    "segment_payload",
    "thread_snapshot",
]


# --------------------------------------------------------------------------- segments
def _ref_static(key: tuple[str, str, str, str]) -> bytes:
    # parentService(5) .. networkAddressUsedAtPeer(8): the same for every call from one caller
    service, instance, endpoint, address = key
    return (
        (_str(b"\x2a", service) if service else b"")
        + (_str(b"\x32", instance) if instance else b"")
        + (_str(b"\x3a", endpoint) if endpoint else b"")
        + (_str(b"\x42", address) if address else b"")
    )


_REF_STATIC = _cache(_ref_static)


def _ref(ref: Record) -> bytes:
    ref_type, trace_id, parent_segment, parent_span, service, instance, endpoint, address = ref
    body = (
        (b"\x08" + _int32(ref_type) if ref_type else b"")
        + (_str(b"\x12", trace_id) if trace_id else b"")
        + (_str(b"\x1a", parent_segment) if parent_segment else b"")
        + (b"\x20" + _int32(parent_span) if parent_span else b"")
        + _REF_STATIC[(service, instance, endpoint, address)]
    )
    return b"\x2a" + _uvarint(len(body)) + body  # SpanObject.refs = 5


def _span_log(entry: Record) -> bytes:
    time_ms, data = entry
    body = b"\x08" + _int64(time_ms) if time_ms else b""
    if data:
        body += _kv_pairs(_KV_F2, data)
    return _msg(b"\x6a", body)  # SpanObject.logs = 13


def _times(start: int, end: int) -> bytes:
    """startTime(3) and endTime(4) in one go: every span has both, both near "now"."""
    if (
        start.__class__ is int
        and end.__class__ is int
        and 0x10000000 <= start < 0x40000000000
        and 0x10000000 <= end < 0x40000000000
    ):
        return (
            b"\x18"
            + _LO14[start & 0x3FFF]
            + _LO14[start >> 14 & 0x3FFF]
            + _V14[start >> 28]
            + b"\x20"
            + _LO14[end & 0x3FFF]
            + _LO14[end >> 14 & 0x3FFF]
            + _V14[end >> 28]
        )
    return (b"\x18" + _int64(start) if start else b"") + (b"\x20" + _int64(end) if end else b"")


def _span(span: Record) -> bytes:
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
    # Written in field-number order, which is also the order upb serializes in.
    parts = [_SPAN_IDS[(span_id, parent_id)], _times(start, end)]
    if refs:
        for ref in refs:
            parts.append(_ref(ref))
    parts.append(_SPAN_STATIC[(operation, peer, span_type, layer, component)])
    if is_error is not False:
        parts.append(_bool(b"\x58", is_error))
    if tags:  # _kv_pairs inlined: the hottest loop of the encoder
        if (tags.__class__ is not list and not isinstance(tags, (list, tuple))) or len(tags) & 1:
            raise EncodeError(f"not a flat key/value list: {tags!r}")
        it = iter(tags)
        for k, v in zip(it, it):  # noqa: B905 (even length checked above)
            if len(v) <= SHORT_VALUE:
                parts.append(_SPAN_TAGS[(k, v)])
            else:
                raw = v.encode()
                pair = (_KV_KEY[k] if k else b"") + b"\x12" + _uvarint(len(raw)) + raw
                parts.append(b"\x62" + _uvarint(len(pair)) + pair)
    if logs:
        for entry in logs:
            parts.append(_span_log(entry))
    if skip_analysis is not False:
        parts.append(_bool(b"\x70", skip_analysis))
    body = b"".join(parts)
    n = len(body)
    return (b"\x1a" + _V14[n] if n < 0x4000 else b"\x1a" + _uvarint(n)) + body  # SegmentObject.spans = 3


def _segment(rec: Record) -> bytes:
    trace_id, segment_id, service, instance, size_limited, spans = rec
    b = bytearray()
    if trace_id:
        b += _str(b"\x0a", trace_id)
    if segment_id:
        b += _str(b"\x12", segment_id)
    for span in spans:
        b += _span(span)
    if service:
        b += _SEG_SERVICE[service]
    if instance:
        b += _SEG_INSTANCE[instance]
    if size_limited is not False:
        b += _bool(b"\x30", size_limited)
    return bytes(b)


def segment_collection_py(encoded_segments: Sequence[bytes]) -> bytes:
    """SegmentCollection of already encoded SegmentObjects (field 1, repeated)."""
    return b"".join([b"\x0a" + _uvarint(len(s)) + s for s in encoded_segments])


# --------------------------------------------------------------------------- logs
_BODY_TAGS: Final = {
    "text": (b"\x12", b"\x0a\x04text"),
    "json": (b"\x1a", b"\x0a\x04json"),
    "yaml": (b"\x22", b"\x0a\x04yaml"),
}


def _log(rec: Record) -> bytes:
    (timestamp, service, instance, endpoint, body_kind, body, trace_id, segment_id, span_id, tags, layer) = (
        rec
    )
    b = bytearray()
    if timestamp:
        b += b"\x08"
        b += _int64(timestamp)
    if service:
        b += _F2[service]
    if instance:
        b += _F3[instance]
    if endpoint:
        b += _F4[endpoint]
    try:
        content_tag, type_field = _BODY_TAGS[body_kind]
    except (KeyError, TypeError):
        raise EncodeError(f"unknown log body kind {body_kind!r}") from None
    content = _str(b"\x0a", body) if body else b""
    b += _msg(b"\x2a", type_field + _msg(content_tag, content))  # LogData.body = 5
    if trace_id or segment_id:
        ctx = _str(b"\x0a", trace_id) if trace_id else b""
        if segment_id:
            ctx += _str(b"\x12", segment_id)
        if span_id > 0:
            ctx += b"\x18" + _int32(span_id)
        b += _msg(b"\x32", ctx)  # LogData.traceContext = 6
    elif span_id.__class__ is not int:
        raise EncodeError(f"span id is not an int: {span_id!r}")
    if tags:
        b += _msg(b"\x3a", _kv_pairs(_KV_F1, tags))  # LogData.tags = 7 (LogTags.data = 1)
    if layer:
        b += _str(b"\x42", layer)
    return bytes(b)


# --------------------------------------------------------------------------- meters
def _bucket(value: Record) -> bytes:
    bucket, count, negative_infinity = value
    body = _double(b"\x09", bucket)
    if count:
        body += b"\x10" + _int64(count)
    body += _bool(b"\x18", negative_infinity)
    return _msg(b"\x1a", body)  # MeterHistogram.values = 3


def _meter_metric(meter: Record) -> bytes:
    kind, name, labels, value = meter
    body = _F1[name] if name else b""
    if labels:
        body += _labels(labels)
    if kind == METER_SINGLE and kind.__class__ is int:
        body += _double(b"\x19", value)
        return _msg(b"\x0a", body)  # MeterData.singleValue = 1
    if kind == METER_HISTOGRAM and kind.__class__ is int:
        body += b"".join([_bucket(v) for v in value])
        return _msg(b"\x12", body)  # MeterData.histogram = 2
    raise EncodeError(f"unknown meter kind {kind!r}")


def _meter_datas(rec: Record) -> list[bytes]:
    timestamp, service, instance, meters = rec
    # service, instance and timestamp are the same for every MeterData of one record
    suffix = (_F3[service] if service else b"") + (_F4[instance] if instance else b"")
    if timestamp:
        suffix += b"\x28" + _int64(timestamp)
    return [_meter_metric(m) + suffix for m in meters]


# --------------------------------------------------------------------------- profiling
def _thread_snapshot(rec: Record) -> bytes:
    task_id, segment_id, time_ms, sequence, signatures = rec
    b = _F1[task_id] if task_id else b""
    if segment_id:
        b += _str(b"\x12", segment_id)
    if time_ms:
        b += b"\x18" + _int64(time_ms)
    if sequence:
        b += b"\x20" + _int32(sequence)
    stack = b"".join([_str(b"\x0a", s) for s in signatures])
    return b + _msg(b"\x2a", stack)  # ThreadSnapshot.stack = 5 (ThreadStack.codeSignatures = 1)


def _profile_finish(rec: Record) -> bytes:
    service, instance, task_id = rec
    return (
        (_F1[service] if service else b"")
        + (_F2[instance] if instance else b"")
        + (_F3[task_id] if task_id else b"")
    )


# --------------------------------------------------------------------------- management
def _instance_properties(
    service: str, instance: str, properties: Sequence[tuple[str, str]], layer: str = ""
) -> bytes:
    b = (_F1[service] if service else b"") + (_F2[instance] if instance else b"")
    for key, value in properties:
        body = (_str(b"\x0a", key) if key else b"") + (_str(b"\x12", value) if value else b"")
        b += _msg(b"\x1a", body)
    return b + (_F4[layer] if layer else b"")


def _instance_ping(service: str, instance: str, layer: str = "") -> bytes:
    return (
        (_F1[service] if service else b"")
        + (_F2[instance] if instance else b"")
        + (_F3[layer] if layer else b"")
    )


def _profile_task_query(service: str, instance: str, last_command_time: int) -> bytes:
    b = (_F1[service] if service else b"") + (_F2[instance] if instance else b"")
    return b + (b"\x18" + _int64(last_command_time) if last_command_time else b"")


# --------------------------------------------------------------------------- public API
_R = TypeVar("_R")


def _guarded(fn: Callable[..., _R], what: str) -> Callable[..., _R]:
    """Wrap an encoder so that any failure on bad input surfaces as EncodeError only."""

    def encode(*args: Any, **kwargs: Any) -> _R:
        try:
            return fn(*args, **kwargs)
        except EncodeError:
            raise
        except Exception as exc:  # wrong types/lengths show up as Type/Value/Index errors
            raise EncodeError(f"invalid {what}: {type(exc).__name__}: {exc}") from exc

    encode.__name__ = fn.__name__.lstrip("_")
    encode.__qualname__ = encode.__name__
    encode.__doc__ = f"Encode {what}; raises EncodeError for anything invalid."
    return encode


segment_py: Callable[[Record], bytes] = _guarded(_segment, "SEGMENT record -> SegmentObject")
log_py: Callable[[Record], bytes] = _guarded(_log, "LOG record -> LogData")
meter_datas: Callable[[Record], list[bytes]] = _guarded(
    _meter_datas, "METER record -> one MeterData per meter"
)
thread_snapshot: Callable[[Record], bytes] = _guarded(
    _thread_snapshot, "PROFILE_SNAPSHOT record -> ThreadSnapshot"
)
profile_finish: Callable[[Record], bytes] = _guarded(
    _profile_finish, "PROFILE_FINISH record -> ProfileTaskFinishReport"
)
instance_properties: Callable[..., bytes] = _guarded(
    _instance_properties, "InstanceProperties(service, instance, properties, layer)"
)
instance_ping: Callable[..., bytes] = _guarded(_instance_ping, "InstancePingPkg(service, instance, layer)")
profile_task_query: Callable[[str, str, int], bytes] = _guarded(
    _profile_task_query, "ProfileTaskCommandQuery(service, instance, last_command_time)"
)


def meter_collection(rec: Record) -> bytes:
    """METER record -> MeterDataCollection of its meters; raises EncodeError for anything invalid."""
    return b"".join([b"\x0a" + _uvarint(len(d)) + d for d in meter_datas(rec)])


# --------------------------------------------------------------------------- native or pure
PURE_ENV: Final = "SWMP_ENCODE_PURE"
"""Set to 1 to make the reporter encode in pure Python although the native module is built."""


def _load_native() -> ModuleType | None:
    if os.environ.get(PURE_ENV, "").strip() not in ("", "0"):
        return None
    try:
        return importlib.import_module("reporter_proc._encode_native")
    except ImportError:  # not built (no compiler at install time): pure Python, same bytes
        return None


NATIVE: Final = _load_native()
"""The native encoder module in use, or None when encoding is pure Python."""

segment: Callable[[Record], bytes] = NATIVE.segment if NATIVE else segment_py
log: Callable[[Record], bytes] = NATIVE.log if NATIVE else log_py
segment_collection: Callable[[Sequence[bytes]], bytes] = (
    NATIVE.segment_collection if NATIVE else segment_collection_py
)


def segment_from_json_py(payload: bytes) -> bytes:
    """SEGMENT record as the worker wrote it (JSON) -> SegmentObject, by decoding it first."""
    try:
        rec = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise EncodeError(f"SEGMENT record is not JSON: {exc}") from None
    if rec.__class__ is not list:  # what delivery's decode would have refused
        raise EncodeError(f"SEGMENT record is not a list: {type(rec).__name__}")
    return segment(rec)


_segment_json: Callable[[bytes], bytes | None] | None = NATIVE.segment_json if NATIVE else None


def segment_payload(rec: bytes | Record) -> bytes:
    """A SEGMENT record, still the JSON bytes read from the ring or already decoded.

    Raw bytes take the native fast path (no Python objects built) when it is built and the
    payload is on it; otherwise they are decoded and encoded, which gives the same bytes or
    the EncodeError. Senders that list "segment" in ``raw_kinds`` get raw bytes from
    delivery; the spool replay still hands them decoded records.
    """
    if rec.__class__ is bytes:
        if _segment_json is not None:
            out = _segment_json(rec)
            if out is not None:
                return out
        return segment_from_json_py(rec)
    return segment(rec)
