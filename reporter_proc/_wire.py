"""Protobuf wire-format primitives and the caches of encoded fields behind ``encode.py``.

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

``EncodeError`` lives here (not in ``encode.py``) so that the native encoder
(``_native/*.c``) can import it without importing the encoder it accelerates.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

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
    return (b"\x08" + _int32(span_id) if span_id else b"") + (
        b"\x10" + _int32(parent_id) if parent_id else b""
    )


def _span_static(key: tuple[str, str, int, int, int]) -> bytes:
    # operationName(6), peer(7), spanType(8), spanLayer(9), componentId(10): consecutive fields
    # that an instrumentation point always sets the same way.
    operation, peer, span_type, layer, component = key
    return (
        (_str(b"\x32", operation) if operation else b"")
        + (_str(b"\x3a", peer) if peer else b"")
        + (b"\x40" + _int32(span_type) if span_type else b"")
        + (b"\x48" + _int32(layer) if layer else b"")
        + (b"\x50" + _int32(component) if component else b"")
    )


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
