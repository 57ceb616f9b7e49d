"""Cross-process headers: ``sw8``, ``sw8-correlation`` and ``sw8-x``.

Formats (protocol.md):

* ``sw8``: ``sample-b64(traceId)-b64(parentSegmentId)-parentSpanId-b64(parentService)-
  b64(parentInstance)-b64(parentEndpoint)-b64(addressUsedAtClient)``, exactly 8 fields.
* ``sw8-correlation``: ``b64(key):b64(value)`` pairs joined by commas.
* ``sw8-x``: ``tracingMode-timestamp``; tracing mode ``1`` means "skip analysis".

Headers arrive from the network, so decoding treats them as hostile: anything malformed
(wrong field count, bad base64, non-UTF-8, absurd sizes, a span id that is not a small
non-negative integer, an empty field, as the Java and Python agents refuse one) yields
``None`` and the request simply starts a fresh trace. Nothing
here raises into the application; work per header is bounded by the size caps below.

Each malformed header present is refused out loud (:func:`_refuse`): counted in the process's
ring (``bad_input`` in ``swmp status``) and logged once per process. That work is on the
refusal's path only: an absent or well-formed header costs nothing more.
"""

from __future__ import annotations

import binascii
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from swmp import _sink

SW8 = "sw8"
SW8_CORRELATION = "sw8-correlation"
SW8_X = "sw8-x"

# Caps on what we are willing to look at: generous for real traffic, small enough that a
# hostile header costs microseconds.
MAX_SW8_LENGTH = 4096
MAX_CORRELATION_HEADER = 8192
MAX_SW8X_LENGTH = 64
_MAX_SPAN_ID = 2**31 - 1

_b2a = binascii.b2a_base64
_a2b = binascii.a2b_base64
# One C pass over the text instead of a set lookup per character (a trace id is ~70 of them).
_is_b64 = re.compile("[A-Za-z0-9+/=]*").fullmatch
_FLAGS = frozenset(("0", "1"))

log = logging.getLogger("swmp.agent")
_refused_pid = 0  # the process that logged its first refusal (a forked child logs its own)


def _refuse(header: str, value: Any) -> None:
    """A malformed incoming ``header``: counted where ``swmp status`` shows it, logged the first
    time in this process (a caller sending garbage sends it on every request). Never raises."""
    global _refused_pid
    try:
        _sink.count_bad_input()
        pid = os.getpid()
        if _refused_pid != pid:
            _refused_pid = pid
            log.warning(
                "swmp: refused a malformed %s header %.120r: the request starts a new trace "
                "(further ones are only counted: bad input in swmp status)",
                header,
                value,
            )
    except Exception:
        pass


def b64(s: str) -> str:
    """Standard base64 (with padding) of the UTF-8 bytes of ``s``."""
    return _b2a(s.encode("utf-8", "replace"), newline=False).decode("ascii")


def unb64(s: str) -> str | None:
    """Decode standard base64 to text; None when it is not valid base64 of UTF-8 text."""
    if _is_b64(s) is None:
        return None
    return _unb64_checked(s)


def _unb64_strict(s: str) -> str | None:
    """:func:`unb64` for the ids of every ``sw8``: padded text is decoded in strict mode,
    which checks the alphabet and the padding in the same C pass as the decoding (Python
    3.11+); whatever it refuses, and unpadded text, goes through :func:`unb64`, so the result
    is always unb64's."""
    if len(s) & 3:
        return unb64(s)
    try:
        return _a2b(s, strict_mode=True).decode("utf-8")  # type: ignore[call-arg]  # 3.11+
    except ValueError:  # binascii.Error and UnicodeDecodeError
        return unb64(s)


_unb64_id = _unb64_strict if sys.version_info >= (3, 11) else unb64


def _unb64_checked(s: str) -> str | None:
    """:func:`unb64` of text already known to hold only base64 characters."""
    pad = len(s) % 4
    if pad:
        # Tolerate senders that strip the padding; a lone extra character is never valid.
        if pad == 1 or "=" in s:
            return None
        s += "=" * (4 - pad)
    try:
        return _a2b(s).decode("utf-8")
    except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
        return None


# The service, instance, endpoint and address fields of sw8 repeat from one request or
# message to the next (a caller sends a handful of distinct values), unlike the trace and
# segment ids: their decoded text is cached (bounded; invalid values cache as None).
_decoded: dict[str, str | None] = {}
_DECODED_MAX = 4096


def unb64_cached(s: str) -> str | None:
    """:func:`unb64` for values that repeat."""
    try:
        return _decoded[s]
    except KeyError:
        pass
    v = unb64(s)
    if len(s) <= 512:  # a hostile header must not fill the cache with huge keys
        if len(_decoded) >= _DECODED_MAX:
            _decoded.clear()
        _decoded[s] = v
    return v


# The caller's service, instance, endpoint and address repeat together: decoded once per
# distinct text (bounded like _decoded; an invalid one caches as None).
_callers: dict[str, tuple[str, str, str, str] | None] = {}


def _caller(tail: str) -> tuple[str, str, str, str] | None:
    """``(service, instance, endpoint, address)`` of sw8's last four fields (``a-b-c-d``);
    None when any is invalid or empty. Empty is refused as the Java agent
    (``ContextCarrier.isValid``) and the Python agent (``Carrier.is_valid``) refuse it: the
    backend cannot link a reference without the parent endpoint and the address used at the
    client. This is the one check of the caller's fields: the native decoder
    (``decode_carrier``) takes only callers cached here as valid."""
    try:
        return _callers[tail]
    except KeyError:
        pass
    svc, inst, ep, addr = tail.split("-")
    fields = (unb64_cached(svc), unb64_cached(inst), unb64_cached(ep), unb64_cached(addr))
    v: tuple[str, str, str, str] | None = None
    if fields[0] and fields[1] and fields[2] and fields[3]:
        v = fields  # type: ignore[assignment]  # none is None
    if len(tail) <= 512:  # a hostile header must not fill the cache with huge keys
        if len(_callers) >= _DECODED_MAX:
            _callers.clear()
        _callers[tail] = v
    return v


class ContextCarrier:
    """What an incoming request tells us about its caller (the decoded headers)."""

    __slots__ = (
        "address",
        "correlation",
        "endpoint",
        "instance",
        "sampled",
        "segment_id",
        "service",
        "skip_analysis",
        "span_id",
        "trace_id",
    )

    def __init__(  # noqa: PLR0917 (mirrors the header's fields, in order)
        self,
        trace_id: str,
        segment_id: str,
        span_id: int,
        service: str,
        instance: str,
        endpoint: str,
        address: str,
        sampled: bool = True,
        correlation: dict[str, str] | None = None,
        skip_analysis: bool = False,
    ) -> None:
        self.sampled = sampled
        self.trace_id = trace_id
        self.segment_id = segment_id
        self.span_id = span_id
        self.service = service
        self.instance = instance
        self.endpoint = endpoint
        self.address = address
        self.correlation = correlation if correlation is not None else {}
        self.skip_analysis = skip_analysis

    def __repr__(self) -> str:
        return (
            f"ContextCarrier(trace_id={self.trace_id!r}, segment_id={self.segment_id!r}, "
            f"span_id={self.span_id}, service={self.service!r}, instance={self.instance!r}, "
            f"endpoint={self.endpoint!r}, address={self.address!r}, sampled={self.sampled})"
        )

    def to_sw8(self) -> str:
        return encode_sw8(
            self.trace_id,
            self.segment_id,
            self.span_id,
            b64(self.service),
            b64(self.instance),
            self.endpoint,
            self.address,
            self.sampled,
        )


# -- sw8 -----------------------------------------------------------------------------------


def encode_sw8(  # noqa: PLR0917 (the header's fields, in order)
    trace_id: str,
    segment_id: str,
    span_id: int,
    service_b64: str,
    instance_b64: str,
    endpoint: str,
    address: str,
    sampled: bool = True,
) -> str:
    """Build an ``sw8`` value; service and instance come pre-encoded (they are constant)."""
    return "-".join(
        (
            "1" if sampled else "0",
            b64(trace_id),
            b64(segment_id),
            str(span_id),
            service_b64,
            instance_b64,
            b64(endpoint),
            b64(address),
        )
    )


# The native core's split_sw8 (swmp/_native/sw8.c), set by swmp.tracing.span when it loads
# the core: the plain case in one C pass, None for anything else (decided below).
_split_native: Callable[[str], tuple[bool, str, str, int, str] | None] | None = None


# decode_carrier(value): the whole common case in C (a plain header from a caller already in
# ``_callers``), or None; then the split above, then the Python path.
_carrier_native: Callable[[str], ContextCarrier | None] | None = None


def use_native(core: Any) -> None:
    """Decode through the native span core's fast paths (None: the Python path only)."""
    global _split_native, _carrier_native
    if core is None:
        _split_native = _carrier_native = None
        return
    core.setup_carrier(ContextCarrier, _callers)
    _split_native, _carrier_native = core.split_sw8, core.decode_carrier


def _bad_sw8(value: Any) -> ContextCarrier | None:
    """What :func:`decode_sw8` answers for a malformed value (None), refused out loud."""
    _refuse(SW8, value)
    return None


def decode_sw8(value: Any) -> ContextCarrier | None:
    """Parse an ``sw8`` value; None if it is malformed in any way (refused: :func:`_refuse`)."""
    try:
        if value.__class__ is not str:
            if isinstance(value, (bytes, bytearray)):
                value = bytes(value).decode("ascii")
            elif not isinstance(value, str):
                return _bad_sw8(value)
        if _carrier_native is not None:
            carrier = _carrier_native(value)
            if carrier is not None:
                return carrier
        if _split_native is not None:
            fields = _split_native(value)
            if fields is not None:
                sampled, tid, sid, span_id, tail = fields
                caller = _callers.get(tail) or _caller(tail)
                if caller is None:
                    return _bad_sw8(value)
                return ContextCarrier(tid, sid, span_id, *caller, sampled)
        if len(value) > MAX_SW8_LENGTH:
            return _bad_sw8(value)
        # The sample flag, the trace and segment ids, the span id and the caller's four fields
        # as one text (see _caller, which splits and checks them once per distinct text).
        parts = value.strip().split("-", 4)
        if len(parts) != 5:
            return _bad_sw8(value)
        flag, tid, sid, span, tail = parts
        if flag not in _FLAGS or not (span.isdigit() and span.isascii() and len(span) <= 10):
            return _bad_sw8(value)
        span_id = int(span)
        if span_id > _MAX_SPAN_ID:
            return _bad_sw8(value)
        trace_id = _unb64_id(tid)
        segment_id = _unb64_id(sid)
        caller = _callers.get(tail) or _caller(tail)
        if not trace_id or not segment_id or caller is None:
            return _bad_sw8(value)
        return ContextCarrier(trace_id, segment_id, span_id, *caller, flag == "1")
    except Exception:
        # Defensive: decoding must never raise into the request, whatever the input type.
        return _bad_sw8(value)


# -- sw8-correlation -----------------------------------------------------------------------


def encode_correlation(correlation: Mapping[str, str]) -> str:
    return ",".join(f"{b64(k)}:{b64(v)}" for k, v in correlation.items())


def decode_correlation(value: Any, max_elements: int = 3, max_value_length: int = 128) -> dict[str, str]:
    """Parse ``sw8-correlation``; malformed entries are skipped (the header refused once:
    :func:`_refuse`), extra entries and values over the limit ignored."""
    out: dict[str, str] = {}
    try:
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode("ascii")
        if not isinstance(value, str) or len(value) > MAX_CORRELATION_HEADER:
            _refuse(SW8_CORRELATION, value)
            return out
        if not value or max_elements <= 0:
            return out
        # The limit counts characters, and a character is up to 4 bytes of UTF-8: skip
        # entries whose encoded form is longer than any allowed value's before decoding them
        # (the exact check on the decoded text follows).
        max_encoded = (max_value_length * 4 + 2) // 3 * 4
        malformed = False
        for entry in value.split(",", max_elements * 4)[: max_elements * 4]:
            if len(out) >= max_elements:
                break
            kv = entry.strip().split(":")
            if len(kv) != 2:
                malformed = True
                continue
            if len(kv[1]) > max_encoded:
                continue
            k = unb64(kv[0])
            v = unb64(kv[1])
            if not k or v is None:
                malformed = True
                continue
            if len(v) > max_value_length:
                continue
            out[k] = v
        if malformed:
            _refuse(SW8_CORRELATION, value)
    except Exception:
        _refuse(SW8_CORRELATION, value)
        return {}
    return out


# -- sw8-x ---------------------------------------------------------------------------------


def encode_sw8x(skip_analysis: bool, timestamp_ms: int | None = None) -> str:
    mode = "1" if skip_analysis else "0"
    return mode if timestamp_ms is None else f"{mode}-{timestamp_ms}"


def decode_sw8x(value: Any) -> bool:
    """True when the extension header asks to skip analysis (tracing mode 1). Anything but
    ``mode`` or ``mode-timestamp`` (the Java agent's form, its timestamp possibly empty) is
    refused (:func:`_refuse`); its first field still decides, as it always did."""
    try:
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode("ascii")
        if isinstance(value, str) and len(value) <= MAX_SW8X_LENGTH:
            mode, _, stamp = value.strip().partition("-")
            if mode not in _FLAGS or (stamp and not (stamp.isdigit() and stamp.isascii())):
                _refuse(SW8_X, value)
            return mode == "1"
    except Exception:
        pass
    _refuse(SW8_X, value)
    return False


# -- carriers from request headers ---------------------------------------------------------


def from_headers(
    sw8: Any, correlation: Any = None, sw8x: Any = None, max_elements: int = 3, max_value_length: int = 128
) -> ContextCarrier | None:
    """Decode the three headers (any may be None); None when ``sw8`` is absent or bad."""
    if sw8 is None:
        return None
    carrier = decode_sw8(sw8)
    if carrier is None:
        return None
    if correlation is not None:
        carrier.correlation = decode_correlation(correlation, max_elements, max_value_length)
    if sw8x is not None:
        carrier.skip_analysis = decode_sw8x(sw8x)
    return carrier


def header_lookup(headers: Any, name: str) -> Any:
    """Case-insensitive ``headers[name]`` over a mapping or ``(name, value)`` pairs; None if absent."""
    try:
        if isinstance(headers, Mapping) or hasattr(headers, "get"):
            v = headers.get(name)
            if v is not None:
                return v
            if isinstance(headers, dict):
                for k, val in headers.items():
                    if isinstance(k, str) and k.lower() == name:
                        return val
            return None
        if isinstance(headers, Iterable):
            bname = name.encode("ascii")
            for pair in headers:
                k = pair[0]
                if (k.lower() == bname) if isinstance(k, (bytes, bytearray)) else (str(k).lower() == name):
                    return pair[1]
    except Exception:
        return None
    return None
