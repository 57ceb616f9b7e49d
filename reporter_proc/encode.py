"""Records -> SkyWalking v3 protobuf bytes, without building protobuf objects.

The reporter turns every decoded record (the positional lists of ``reporter_proc.records``)
into wire bytes. Building ``SegmentObject`` messages field by field costs about twice what
writing the protobuf wire format directly costs (design notes: ~11 us against ~5.5 us per
span), so this module is a small hand-written encoder: a straight walk over the list in
protobuf field-number order, producing exactly the bytes ``SerializeToString()`` would (the
tests check byte identity against the generated classes).

Wire rules used (proto3):

- scalars equal to their default (0, "", False, +0.0) are left out; repeated elements and
  set sub-messages are always written, even when empty;
- int32/int64/enums are plain varints; negatives are 10-byte two's complement (no zig-zag);
  values outside the field's range are an error, not silently truncated;
- bool is a varint 1; double is 8 little-endian bytes, written unless all bits are zero (so
  -0.0 is kept, as upb does);
- strings are UTF-8, length-delimited.

Strings that repeat (service, instance, operation names, peers, tag keys, short tag values)
are cached already encoded with their field tag, in small dicts that are cleared when they
fill up, so a runaway cardinality costs memory only up to the bound.

Mapping choices where the record format leaves room (the tests pin them):

- LOG: ``body`` becomes ``LogDataBody{type=<kind>, <kind>={...}}``; ``traceContext`` is set
  only when the record has a trace id or a segment id, and its ``spanId`` only when > 0;
  ``tags`` (``LogTags``) only when the record has tags.
- METER: every ``MeterData`` carries service, instance and timestamp.
- PROFILE_SNAPSHOT: ``stack`` is always set.

Anything that is not a valid record raises :class:`EncodeError` and nothing else: the
reporter counts and drops such records instead of crashing on them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from reporter_proc.records import METER_HISTOGRAM, METER_SINGLE

__all__ = [
    "EncodeError",
    "instance_ping",
    "instance_properties",
    "log",
    "meter_collection",
    "meter_datas",
    "profile_finish",
    "profile_task_query",
    "segment",
    "segment_collection",
    "thread_snapshot",
]

Record = Sequence[Any]


class EncodeError(Exception):
    """The record is not a valid positional record of its type; drop and count it."""


# --------------------------------------------------------------------------- primitives
_INT32_MIN: Final = -(1 << 31)
_INT32_MAX: Final = (1 << 31) - 1
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_TWO64: Final = 1 << 64

# Varints come from two 16384-entry tables (~1 MB, built once at import in the reporter):
# _V14[n] is the whole varint of n < 2**14, _LO14[n] the two continuation bytes of the low 14
# bits of a larger number. A millisecond timestamp (< 2**42) is then three lookups instead of a
# six-round loop; that alone is a fifth of a span's encoding time.
_V14: Final = [bytes((i,)) if i < 0x80 else bytes((i & 0x7F | 0x80, i >> 7)) for i in range(0x4000)]
_LO14: Final = [bytes((i & 0x7F | 0x80, i >> 7 | 0x80)) for i in range(0x4000)]
_SMALL: Final = _V14
_MINUS_ONE: Final = b"\xff" * 9 + b"\x01"  # parentSpanId -1 of every root span
_ZERO8: Final = b"\x00" * 8
_pack_double = struct.Struct("<d").pack


def _uvarint(n: int) -> bytes:
    """Varint of a non-negative int (lengths, already range-checked values)."""
    if n < 0x4000:
        return _V14[n]
    if n < 0x10000000:
        return _LO14[n & 0x3FFF] + _V14[n >> 14]
    if n < 0x40000000000:
        return _LO14[n & 0x3FFF] + _LO14[n >> 14 & 0x3FFF] + _V14[n >> 28]
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _int32(n: int) -> bytes:
    if 0 <= n < 0x4000:
        return _V14[n]
    if n == -1:
        return _MINUS_ONE
    if not _INT32_MIN <= n <= _INT32_MAX or (n.__class__ is not int and not isinstance(n, int)):
        raise EncodeError(f"not an int32: {n!r}")
    return _uvarint(n + _TWO64 if n < 0 else n)


def _int64(n: int) -> bytes:
    if 0 <= n < 0x40000000000 and n.__class__ is int:  # every plausible timestamp or count
        if n < 0x4000:
            return _V14[n]
        if n < 0x10000000:
            return _LO14[n & 0x3FFF] + _V14[n >> 14]
        return _LO14[n & 0x3FFF] + _LO14[n >> 14 & 0x3FFF] + _V14[n >> 28]
    if not _INT64_MIN <= n <= _INT64_MAX or (n.__class__ is not int and not isinstance(n, int)):
        raise EncodeError(f"not an int64: {n!r}")
    return _uvarint(n + _TWO64 if n < 0 else n)


def _str(tag: bytes, s: str) -> bytes:
    """tag + length + UTF-8 of ``s`` (caller skips empty strings)."""
    if s.__class__ is not str and not isinstance(s, str):
        raise EncodeError(f"not a string: {s!r}")
    raw = s.encode()
    return tag + _uvarint(len(raw)) + raw


def _bool(tag: bytes, v: object) -> bytes:
    """The encoded field for a true bool, b"" for false; anything else is an error."""
    if v is True:
        return tag + b"\x01"
    if v is False or v is None:
        return b""
    raise EncodeError(f"not a bool: {v!r}")


def _double(tag: bytes, v: float) -> bytes:
    if v.__class__ is not float and not isinstance(v, (int, float)):
        raise EncodeError(f"not a number: {v!r}")
    packed = _pack_double(v)
    return b"" if packed == _ZERO8 else tag + packed


def _msg(tag: bytes, body: bytes | bytearray) -> bytes:
    return tag + _uvarint(len(body)) + body


# --------------------------------------------------------------------------- caches
CACHE_MAX: Final = 4096
"""Entries per cache before it is cleared; the constant strings refill it at once."""

SHORT_VALUE: Final = 24
"""Tag values up to this length (methods, status codes, db types) are cached with their key."""


class _Cache(dict[Any, bytes]):
    """Encoded fields seen before. ``make(key)`` encodes (and validates) a miss.

    Clearing when full (rather than LRU bookkeeping on every hit) keeps hits at one dict
    lookup; a stream of never-repeating keys costs at most CACHE_MAX entries.
    """

    __slots__ = ("make", "tag")

    def __init__(self, make: Callable[[Any], bytes], tag: bytes = b"") -> None:
        super().__init__()
        self.make = make
        self.tag = tag

    def __missing__(self, key: Any) -> bytes:
        field = self.make(key)
        if len(self) >= CACHE_MAX:
            self.clear()
        self[key] = field
        return field


_CACHES: list[_Cache] = []


def _cache(make: Callable[[Any], bytes], tag: bytes = b"") -> _Cache:
    c = _Cache(make, tag)
    _CACHES.append(c)
    return c


def _string_cache(tag: bytes) -> _Cache:
    return _cache(lambda s: _str(tag, s))


def clear_caches() -> None:
    """Forget every cached field (tests; a long-lived reporter never needs it)."""
    for c in _CACHES:
        c.clear()


# Field tags are (field_number << 3) | wire_type; named by message.field.
_SEG_SERVICE = _string_cache(b"\x22")  # SegmentObject.service = 4
_SEG_INSTANCE = _string_cache(b"\x2a")  # SegmentObject.serviceInstance = 5
_KV_KEY = _string_cache(b"\x0a")  # KeyStringValuePair.key = 1
_F1 = _string_cache(b"\x0a")  # string fields 1..4 of small messages (names, services...)
_F2 = _string_cache(b"\x12")
_F3 = _string_cache(b"\x1a")
_F4 = _string_cache(b"\x22")


def _pair_cache(tag: bytes) -> _Cache:
    """Whole KeyStringValuePair fields under ``tag``, keyed by (key, short value)."""

    def make(kv: tuple[str, str]) -> bytes:
        key, value = kv
        return _msg(tag, (_KV_KEY[key] if key else b"") + (_str(b"\x12", value) if value else b""))

    return _cache(make, tag)


def _span_ids(ids: tuple[int, int]) -> bytes:
    span_id, parent_id = ids
    return ((b"\x08" + _int32(span_id) if span_id else b"")
            + (b"\x10" + _int32(parent_id) if parent_id else b""))


def _span_static(key: tuple[str, str, int, int, int]) -> bytes:
    # operationName(6), peer(7), spanType(8), spanLayer(9), componentId(10): consecutive fields
    # that an instrumentation point always sets the same way.
    operation, peer, span_type, layer, component = key
    return ((_str(b"\x32", operation) if operation else b"") + (_str(b"\x3a", peer) if peer else b"")
            + (b"\x40" + _int32(span_type) if span_type else b"")
            + (b"\x48" + _int32(layer) if layer else b"")
            + (b"\x50" + _int32(component) if component else b""))


_SPAN_IDS = _cache(_span_ids)
_SPAN_STATIC = _cache(_span_static)
_SPAN_TAGS = _pair_cache(b"\x62")  # SpanObject.tags = 12
_KV_F1 = _pair_cache(b"\x0a")  # LogTags.data = 1
_KV_F2 = _pair_cache(b"\x12")  # Log.data = 2


def _kv_pairs(pairs: _Cache, flat: Sequence[str]) -> bytes:
    """A flat ``[k, v, k, v]`` list as repeated KeyStringValuePair (field tag of ``pairs``)."""
    if (flat.__class__ is not list and not isinstance(flat, (list, tuple))) or len(flat) & 1:
        raise EncodeError(f"not a flat key/value list: {flat!r}")
    out = []
    it = iter(flat)
    for k, v in zip(it, it):  # noqa: B905 (even length checked above)
        if len(v) <= SHORT_VALUE:
            out.append(pairs[(k, v)])
        else:  # long values (urls, statements) rarely repeat: do not let them evict the rest
            raw = v.encode()
            body = (_KV_KEY[k] if k else b"") + b"\x12" + _uvarint(len(raw)) + raw
            out.append(pairs.tag + _uvarint(len(body)) + body)
    return b"".join(out)


def _labels(flat: Sequence[str]) -> bytes:
    """A flat ``[name, value, ...]`` list as repeated Label (field 2 of meter values)."""
    if flat.__class__ is not list and not isinstance(flat, (list, tuple)):
        raise EncodeError(f"not a flat name/value list: {flat!r}")
    out = bytearray()
    it = iter(flat)
    for name in it:
        value = next(it)
        body = (_F1[name] if name else b"") + (_F2[value] if value else b"")
        out += _msg(b"\x12", body)
    return bytes(out)


# --------------------------------------------------------------------------- segments
def _ref_static(key: tuple[str, str, str, str]) -> bytes:
    # parentService(5) .. networkAddressUsedAtPeer(8): the same for every call from one caller
    service, instance, endpoint, address = key
    return ((_str(b"\x2a", service) if service else b"") + (_str(b"\x32", instance) if instance else b"")
            + (_str(b"\x3a", endpoint) if endpoint else b"") + (_str(b"\x42", address) if address else b""))


_REF_STATIC = _cache(_ref_static)


def _ref(ref: Record) -> bytes:
    ref_type, trace_id, parent_segment, parent_span, service, instance, endpoint, address = ref
    body = ((b"\x08" + _int32(ref_type) if ref_type else b"")
            + (_str(b"\x12", trace_id) if trace_id else b"")
            + (_str(b"\x1a", parent_segment) if parent_segment else b"")
            + (b"\x20" + _int32(parent_span) if parent_span else b"")
            + _REF_STATIC[(service, instance, endpoint, address)])
    return b"\x2a" + _uvarint(len(body)) + body  # SpanObject.refs = 5


def _span_log(entry: Record) -> bytes:
    time_ms, data = entry
    body = b"\x08" + _int64(time_ms) if time_ms else b""
    if data:
        body += _kv_pairs(_KV_F2, data)
    return _msg(b"\x6a", body)  # SpanObject.logs = 13


def _times(start: int, end: int) -> bytes:
    """startTime(3) and endTime(4) in one go: every span has both, both near "now"."""
    if start.__class__ is int and end.__class__ is int and 0x10000000 <= start < 0x40000000000 \
            and 0x10000000 <= end < 0x40000000000:
        return (b"\x18" + _LO14[start & 0x3FFF] + _LO14[start >> 14 & 0x3FFF] + _V14[start >> 28]
                + b"\x20" + _LO14[end & 0x3FFF] + _LO14[end >> 14 & 0x3FFF] + _V14[end >> 28])
    return (b"\x18" + _int64(start) if start else b"") + (b"\x20" + _int64(end) if end else b"")


def _span(span: Record) -> bytes:
    (span_id, parent_id, start, end, operation, peer, span_type, layer, component,
     is_error, skip_analysis, tags, logs, refs) = span
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


def segment_collection(encoded_segments: Sequence[bytes]) -> bytes:
    """SegmentCollection of already encoded SegmentObjects (field 1, repeated)."""
    return b"".join([b"\x0a" + _uvarint(len(s)) + s for s in encoded_segments])


# --------------------------------------------------------------------------- logs
_BODY_TAGS: Final = {"text": (b"\x12", b"\x0a\x04text"), "json": (b"\x1a", b"\x0a\x04json"),
                     "yaml": (b"\x22", b"\x0a\x04yaml")}


def _log(rec: Record) -> bytes:
    (timestamp, service, instance, endpoint, body_kind, body, trace_id, segment_id, span_id,
     tags, layer) = rec
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
    return (_F1[service] if service else b"") + (_F2[instance] if instance else b"") + (
        _F3[task_id] if task_id else b"")


# --------------------------------------------------------------------------- management
def _instance_properties(service: str, instance: str, properties: Sequence[tuple[str, str]],
                         layer: str = "") -> bytes:
    b = (_F1[service] if service else b"") + (_F2[instance] if instance else b"")
    for key, value in properties:
        body = (_str(b"\x0a", key) if key else b"") + (_str(b"\x12", value) if value else b"")
        b += _msg(b"\x1a", body)
    return b + (_F4[layer] if layer else b"")


def _instance_ping(service: str, instance: str, layer: str = "") -> bytes:
    return (_F1[service] if service else b"") + (_F2[instance] if instance else b"") + (
        _F3[layer] if layer else b"")


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


segment: Callable[[Record], bytes] = _guarded(_segment, "SEGMENT record -> SegmentObject")
log: Callable[[Record], bytes] = _guarded(_log, "LOG record -> LogData")
meter_datas: Callable[[Record], list[bytes]] = _guarded(
    _meter_datas, "METER record -> one MeterData per meter")
thread_snapshot: Callable[[Record], bytes] = _guarded(
    _thread_snapshot, "PROFILE_SNAPSHOT record -> ThreadSnapshot")
profile_finish: Callable[[Record], bytes] = _guarded(
    _profile_finish, "PROFILE_FINISH record -> ProfileTaskFinishReport")
instance_properties: Callable[..., bytes] = _guarded(
    _instance_properties, "InstanceProperties(service, instance, properties, layer)")
instance_ping: Callable[..., bytes] = _guarded(_instance_ping, "InstancePingPkg(service, instance, layer)")
profile_task_query: Callable[[str, str, int], bytes] = _guarded(
    _profile_task_query, "ProfileTaskCommandQuery(service, instance, last_command_time)")


def meter_collection(rec: Record) -> bytes:
    """METER record -> MeterDataCollection of its meters; raises EncodeError for anything invalid."""
    return b"".join([b"\x0a" + _uvarint(len(d)) + d for d in meter_datas(rec)])
