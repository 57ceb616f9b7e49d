"""sw8 / sw8-correlation / sw8-x: round trips, malformed and hostile headers, fuzzing."""

from __future__ import annotations

import base64
import random
import string
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swmp import propagation as P
from swmp.tracing import span as span_module  # loads the native core, which gives P its split_sw8
from tests.fuzz_budget import examples

# Hypothesis generates a few thousand structured inputs per test here (generation, not decoding,
# is the slow part); each one is then decoded together with all of its prefixes, so every test
# still feeds the decoders hundreds of thousands of related inputs in a few seconds.
SETTINGS = settings(
    max_examples=examples(2500), deadline=None, suppress_health_check=list(HealthCheck), database=None
)

printable = st.text(min_size=1, max_size=60)


def b(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def valid_sw8(
    *,
    trace: str = "t.1",
    seg: str = "s.1",
    span: str = "3",
    svc: str = "svc",
    inst: str = "i",
    ep: str = "/ep",
    addr: str = "h:80",
    flag: str = "1",
) -> str:
    return "-".join([flag, b(trace), b(seg), span, b(svc), b(inst), b(ep), b(addr)])


def test_round_trip_sw8() -> None:
    value = P.encode_sw8("trace-é", "seg", 7, P.b64("svc|ns"), P.b64("inst"), "/orders/{id}", "10.0.0.1:80")
    c = P.decode_sw8(value)
    assert c is not None
    assert (c.trace_id, c.segment_id, c.span_id, c.service, c.instance, c.endpoint, c.address) == (
        "trace-é",
        "seg",
        7,
        "svc|ns",
        "inst",
        "/orders/{id}",
        "10.0.0.1:80",
    )
    assert c.sampled
    assert P.decode_sw8(c.to_sw8()).__repr__() == c.__repr__()
    assert P.decode_sw8(value.encode()) is not None  # bytes (ASGI) too


@given(
    st.text(min_size=1),
    st.text(min_size=1),
    st.integers(0, 2**31 - 1),
    st.text(min_size=1),
    st.text(min_size=1),
    st.text(min_size=1),
    st.text(min_size=1),
)
@settings(max_examples=examples(1000), deadline=None, database=None)
def test_round_trip_sw8_property(  # noqa: PLR0917 (one argument per strategy)
    tid: str, sid: str, span: int, svc: str, inst: str, ep: str, addr: str
) -> None:
    clean = [x.encode("utf-8", "replace").decode() for x in (tid, sid, svc, inst, ep, addr)]
    value = P.encode_sw8(clean[0], clean[1], span, P.b64(clean[2]), P.b64(clean[3]), clean[4], clean[5])
    c = P.decode_sw8(value)
    assert c is not None
    assert [c.trace_id, c.segment_id, c.service, c.instance, c.endpoint, c.address] == clean
    assert c.span_id == span


def test_malformed_sw8_is_rejected() -> None:
    """Malformed headers decode to None (the span starts a new trace). So do headers with an
    empty parent endpoint or an empty address used at the client: they used to be tolerated,
    but the Java agent (``ContextCarrier.isValid``) and the Python agent (``Carrier.is_valid``)
    refuse a carrier with any empty field, and the backend cannot link such a reference."""
    bad: list[Any] = [
        valid_sw8(ep=""),
        valid_sw8(addr=""),
        valid_sw8(ep="", addr=""),
        valid_sw8(inst=""),
        valid_sw8(seg=""),
        None,
        42,
        "",
        "-",
        "1",
        "1-2-3",
        valid_sw8() + "-extra",
        valid_sw8().replace("1-", "2-", 1),
        valid_sw8(span="-1"),
        valid_sw8(span="x"),
        valid_sw8(span="99999999999"),
        valid_sw8(span="²"),
        valid_sw8(span=""),
        valid_sw8(trace=""),
        valid_sw8(svc=""),
        "1-!!!!-" + valid_sw8()[2:].split("-", 1)[1],
        "1-" + "A" * 5000,
        valid_sw8() + "x" * 5000,
        b"\xff\xfe",
        "1-é-é-1-é-é-é-é",
        "-".join(["1", "=AAA", b("s"), "1", b("a"), b("b"), b("c"), b("d")]),
        "-".join(["1", base64.b64encode(b"\xff\xfe").decode(), b("s"), "1", b("a"), b("b"), b("c"), b("d")]),
    ]
    for v in bad:
        assert P.decode_sw8(v) is None, v
    assert P.decode_sw8(valid_sw8(flag="0")).sampled is False  # type: ignore[union-attr]
    for v in bad[:3]:  # from the callers' cache too, and with the native decoder's fast path
        assert P.decode_sw8(v) is None, v
    assert P.decode_sw8(valid_sw8(ep=" ", addr=" ")) is not None  # blank, not empty: as the peers


def test_unpadded_base64_is_tolerated() -> None:
    v = "-".join(["1", b("ab").rstrip("="), b("s"), "1", b("a"), b("b"), b("c"), b("d")])
    c = P.decode_sw8(v)
    assert c is not None and c.trace_id == "ab"


def test_correlation_round_trip_and_limits() -> None:
    corr = {"a": "1", "user": "ü", "x": "y"}
    assert P.decode_correlation(P.encode_correlation(corr)) == corr
    many = P.encode_correlation({f"k{i}": "v" for i in range(10)})
    assert len(P.decode_correlation(many, max_elements=3)) == 3
    long = P.encode_correlation({"k": "v" * 200, "ok": "fine"})
    assert P.decode_correlation(long, max_value_length=128) == {"ok": "fine"}
    assert P.decode_correlation("garbage,::,a:b:c," + P.encode_correlation({"k": "v"})) == {"k": "v"}
    assert P.decode_correlation("x" * 100_000) == {}
    assert P.decode_correlation(None) == {}


def test_correlation_value_limit_counts_characters_not_bytes() -> None:
    """SW_CORRELATION_VALUE_MAX_LENGTH is a number of characters (as the peer agents count
    it, and as set_correlation checks it): values of non-ASCII text within it arrive whole,
    one character over it is skipped alone, and the other entries stay."""
    within = {"e": "é" * 100, "zh": "中" * 128, "emoji": "🙂" * 128}
    assert P.decode_correlation(P.encode_correlation(within)) == within
    over = {"zh": "中" * 129, "ok": "fine", "e": "é" * 128}
    assert P.decode_correlation(P.encode_correlation(over)) == {"ok": "fine", "e": "é" * 128}
    ten, eleven = P.encode_correlation({"k": "中" * 10}), P.encode_correlation({"k": "中" * 11})
    assert P.decode_correlation(ten, max_value_length=10) == {"k": "中" * 10}
    assert P.decode_correlation(eleven, max_value_length=10) == {}


def test_sw8x() -> None:
    assert P.decode_sw8x(P.encode_sw8x(True, 123)) is True
    assert P.decode_sw8x(P.encode_sw8x(False)) is False
    assert P.decode_sw8x("1") is True
    for v in (None, "", "2-1", b"\xff", "1" * 1000):
        assert P.decode_sw8x(v) is False


def test_from_headers_and_lookup() -> None:
    headers = {"SW8": valid_sw8(), "Sw8-Correlation": P.encode_correlation({"k": "v"}), "sw8-x": "1-5"}
    c = P.from_headers(
        P.header_lookup(headers, "sw8"),
        P.header_lookup(headers, "sw8-correlation"),
        P.header_lookup(headers, "sw8-x"),
    )
    assert c is not None and c.correlation == {"k": "v"} and c.skip_analysis
    pairs = [(b"sw8", valid_sw8().encode()), (b"other", b"x")]
    assert P.header_lookup(pairs, "sw8") == valid_sw8().encode()
    assert P.header_lookup(object(), "sw8") is None
    assert P.from_headers(None) is None


# -- fuzzing: nothing may raise, whatever arrives ------------------------------------------------
# About 300k inputs in total: hypothesis-driven structure-aware cases plus a fast mutation loop.

fields = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=string.ascii_letters + string.digits + "+/=", max_size=40),
    st.binary(max_size=30).map(lambda x: base64.b64encode(x).decode()),
    st.integers(-(2**40), 2**40).map(str),
)


@given(st.lists(fields, min_size=0, max_size=10).map("-".join))
@SETTINGS
def test_fuzz_structured_sw8_never_raises(value: str) -> None:
    for k in range(len(value), -1, -1):
        c = P.decode_sw8(value[:k])
        if c is not None:
            assert c.trace_id and c.segment_id and 0 <= c.span_id < 2**31
            for s in (c.trace_id, c.segment_id, c.service, c.instance, c.endpoint, c.address):
                s.encode("utf-8")  # always valid text (no lone surrogates)


@given(
    st.one_of(st.text(max_size=300), st.binary(max_size=300)),
    st.one_of(st.none(), st.text(max_size=300)),
    st.one_of(st.none(), st.text(max_size=40), st.binary(max_size=40)),
)
@SETTINGS
def test_fuzz_arbitrary_headers_never_raise(sw8: Any, corr: Any, x: Any) -> None:
    for k in range(len(sw8), -1, -1):
        P.from_headers(sw8[:k], corr, x)
        P.decode_correlation(sw8[:k])
        P.decode_sw8x(sw8[:k])


def test_fuzz_mutations_of_valid_headers() -> None:
    rng = random.Random(8)
    seeds = [
        valid_sw8(),
        valid_sw8(trace="x" * 50, ep="/a/b/c?d"),
        P.encode_correlation({"a": "b", "c": "d"}),
    ]
    alphabet = "-=+/:,01AZaz\x00\xff\u00e9\ud800 "
    n = 0
    for _ in range(300_000):
        s = list(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            pos = rng.randrange(len(s) + 1)
            if op < 0.4 and s:
                s[min(pos, len(s) - 1)] = rng.choice(alphabet)
            elif op < 0.7:
                s.insert(pos, rng.choice(alphabet))
            elif s:
                del s[min(pos, len(s) - 1)]
        value = "".join(s)
        c = P.decode_sw8(value)
        P.decode_correlation(value)
        if c is not None:
            n += 1
            c.to_sw8()
    assert n > 0  # some mutations stay valid (e.g. changed base64 payloads): they decode cleanly


def test_repeated_fields_decode_the_same_from_the_cache() -> None:
    # service / instance / endpoint / address are cached by their encoded text: a second
    # decode gives the same carrier, and an invalid field stays invalid when seen again.
    first = P.decode_sw8(valid_sw8(svc="svc-é", ep="/orders"))
    again = P.decode_sw8(valid_sw8(svc="svc-é", ep="/orders", trace="t.2"))
    assert first is not None and again is not None
    assert (again.service, again.endpoint, again.trace_id) == ("svc-é", "/orders", "t.2")
    broken_inst = "-".join(["1", b("t"), b("s"), "1", b("svc"), "!!!", b("e"), b("a")])
    assert P.decode_sw8(broken_inst) is None
    assert P.decode_sw8(broken_inst) is None
    assert P.unb64_cached("!!!") is None and P.unb64_cached(b("x")) == "x"


# -- the decoder against its previous, plainer form --------------------------------------------
_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")


def _reference_unb64(s: str) -> str | None:
    if not s.isascii() or not _ALPHABET.issuperset(s):
        return None
    pad = len(s) % 4
    if pad:
        if pad == 1 or "=" in s:
            return None
        s += "=" * (4 - pad)
    try:
        return base64.b64decode(s).decode("utf-8")
    except ValueError:
        return None


def _reference_sw8(value: Any) -> tuple[Any, ...] | None:
    """decode_sw8 before its single-pattern form (2026-11-26), as a tuple of its fields."""
    try:
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode("ascii")
        if not isinstance(value, str) or len(value) > P.MAX_SW8_LENGTH:
            return None
        parts = value.strip().split("-")
        if len(parts) != 8:
            return None
        flag, tid, sid, span, svc, inst, ep, addr = parts
        if flag not in ("0", "1") or not (span.isascii() and span.isdigit() and len(span) <= 10):
            return None
        span_id = int(span)
        decoded = [_reference_unb64(f) for f in (tid, sid, svc, inst, ep, addr)]
        if span_id > 2**31 - 1 or not all(decoded):  # empty endpoint/address too (since 2026-11-30)
            return None
        return (*decoded[:2], span_id, *decoded[2:], flag == "1")
    except Exception:
        return None


def _fields(c: P.ContextCarrier | None) -> tuple[Any, ...] | None:
    if c is None:
        return None
    return (c.trace_id, c.segment_id, c.span_id, c.service, c.instance, c.endpoint, c.address, c.sampled)


def test_decoder_agrees_with_its_previous_form() -> None:
    """The same carrier (or None) for valid headers and for ~200k mutations of them, as text
    and as bytes, each mutation decoded twice (the second time from the field cache)."""
    rng = random.Random(11)
    seeds = [
        valid_sw8(),
        valid_sw8(trace="x" * 50, ep="/a/b/c?d", addr=""),
        valid_sw8(svc="svc-é", span="2147483647", flag="0"),
        " " + valid_sw8(seg="s" * 7) + "\n",
    ]
    alphabet = "-=+/01AZaz9\x00\xff\u00e9\ud800 \t\n٣"
    native = {"split": 0, "carrier": 0}
    split, carrier = P._split_native, P._carrier_native

    def counted(fn: Any, name: str) -> Any:
        def call(value: str) -> Any:
            got = fn(value)
            native[name] += got is not None
            return got

        return call

    if split is not None and carrier is not None:
        P._split_native, P._carrier_native = counted(split, "split"), counted(carrier, "carrier")
    try:
        _compare_mutations(rng, seeds, alphabet)
    finally:
        P._split_native, P._carrier_native = split, carrier
    # The native paths answered for the plain ones: the split for a caller seen the first
    # time, the whole carrier once its fields are known.
    assert split is None or (native["split"] > 1000 and native["carrier"] > 1000), native


def _compare_mutations(rng: random.Random, seeds: list[str], alphabet: str) -> None:
    agreed = valid = 0
    for _ in range(200_000):
        s = list(rng.choice(seeds))
        for _ in range(rng.randint(0, 3)):
            op, pos = rng.random(), rng.randrange(len(s) + 1)
            if op < 0.4 and s:
                s[min(pos, len(s) - 1)] = rng.choice(alphabet)
            elif op < 0.7:
                s.insert(pos, rng.choice(alphabet))
            elif s:
                del s[min(pos, len(s) - 1)]
        value = "".join(s)
        want = _reference_sw8(value)
        assert _fields(P.decode_sw8(value)) == want, value
        again = P.decode_sw8(value)  # from the callers' cache: the native carrier, if built
        assert _fields(again) == want, value
        if again is not None:
            assert type(again) is P.ContextCarrier, value
            assert again.correlation == {} and again.skip_analysis is False, value
        raw = value.encode("utf-8", "surrogatepass")
        assert _fields(P.decode_sw8(raw)) == _reference_sw8(raw), value
        agreed += 1
        valid += want is not None
    assert agreed == 200_000 and valid > 1000


def test_the_native_carrier_is_the_one_python_builds() -> None:
    """``decode_carrier`` (carrier.c) answers once the caller's fields are known, with a
    ContextCarrier equal to the Python path's: each its own correlation dict, writable
    fields, collected like any other object; the Python path still answers the rest."""
    if P._carrier_native is None:
        return
    import gc

    value = valid_sw8(svc="svc-native", ep="/carrier", addr="db:5432")
    saved = P._carrier_native
    P._carrier_native = None
    try:
        python_built = P.decode_sw8(value)  # fills the callers' cache
    finally:
        P._carrier_native = saved
    first, second = P._carrier_native(value), P.decode_sw8(value)
    assert first is not None and second is not None and python_built is not None
    assert repr(first) == repr(python_built) == repr(second)
    assert _fields(first) == _fields(python_built)
    assert first.correlation is not second.correlation
    assert gc.is_tracked(first)
    first.correlation["k"] = "v"
    first.skip_analysis = True
    assert second.correlation == {} and second.skip_analysis is False
    assert P._carrier_native(valid_sw8(svc="svc-never-seen")) is None  # the caller is not known yet
    # Callers in turn, one the same length as the last with another byte (the native core
    # remembers the last caller's text): each gets its own fields.
    other = valid_sw8(svc="svc-nativf", ep="/carrier", addr="db:5432")
    for v in (value, other, value, other, other, value):
        got, want = P.decode_sw8(v), _reference_sw8(v)
        assert _fields(got) == want, v
    assert P._carrier_native(" " + value) is None and P.decode_sw8(" " + value) is not None


def test_the_native_split_answers_for_plain_headers_only() -> None:
    """``split_sw8`` (swmp/_native/sw8.c) parses what agents send and leaves everything else
    to decode_sw8's Python path (None), which then decides as before."""
    if not span_module.NATIVE:
        return
    from swmp import _spancore

    plain = valid_sw8(trace="a" * 37, seg="seg.7", span="2147483647", flag="0", addr="")
    assert _spancore.split_sw8(plain) == (False, "a" * 37, "seg.7", 2147483647, plain.split("-", 4)[4])
    head = "-".join(["1", b("t.1"), b("s.1"), "3"])
    tail = "-".join([b("svc"), b("i"), b("/ep"), b("h:80")])
    others = [
        " " + plain,  # surrounding whitespace: str.strip()'s
        plain + "\n",
        "2" + plain[1:],  # an unknown flag
        "11" + plain[1:],
        "-".join(["1", b("t.10").rstrip("="), b("s.1"), "3", tail]),  # unpadded (tolerated by Python)
        "-".join(["1", "QR==", b("s.1"), "3", tail]),  # stray bits after the last byte
        "-".join(["1", b("é"), b("s.1"), "3", tail]),  # an id that is not ASCII
        "-".join(["1", "", b("s.1"), "3", tail]),  # an empty id
        "-".join(["1", "A=B=", b("s.1"), "3", tail]),  # padding inside
        "-".join(["1", b("t.1"), b("s.1"), "2147483648", tail]),  # span id too large
        "-".join(["1", b("t.1"), b("s.1"), "00000000003", tail]),  # 11 digits
        "-".join(["1", b("t.1"), b("s.1"), "", tail]),
        "-".join(["1", b("t.1"), b("s.1"), "٣", tail]),  # a digit, not ASCII
        head,  # too few fields
        plain.replace("a", "é", 1),  # not ASCII at all
        "1-" + "A" * 4096,  # longer than MAX_SW8_LENGTH
    ]
    for value in others:
        assert _spancore.split_sw8(value) is None, value
        assert _fields(P.decode_sw8(value)) == _reference_sw8(value), value
    assert _spancore.split_sw8(head + "-" + tail) == (True, "t.1", "s.1", 3, tail)
    assert _spancore.split_sw8(b"bytes") is None  # decode_sw8 turns bytes into text first


def test_the_native_split_decodes_every_id_as_base64_does() -> None:
    """The ids' base64 (decoded four characters a step): every last character of a padded
    quad (stray bits or not), a byte with its high bit at every position of ids of 1-9
    bytes, and random ASCII ids of 1-60 bytes; the answer is the text strict base64 gives
    back, or None where that is not canonical ASCII."""
    if not span_module.NATIVE:
        return
    from swmp import _spancore

    tail = "-".join([b("svc"), b("i"), b("/ep"), b("h:80")])

    def native_id(encoded: str) -> str | None:
        out = _spancore.split_sw8("-".join(["1", encoded, b("s.1"), "3", tail]))
        return None if out is None else str(out[1])

    def strict(encoded: str) -> str | None:
        try:
            raw = base64.b64decode(encoded, validate=True)
        except ValueError:
            return None
        canonical = raw and base64.b64encode(raw).decode() == encoded and raw.isascii()
        return raw.decode() if canonical else None

    alphabet = string.ascii_uppercase + string.ascii_lowercase + string.digits + "+/"
    cases = [f"QU{c}=" for c in alphabet] + [f"Q{c}==" for c in alphabet] + [f"QUJD{c}A==" for c in alphabet]
    for size in range(1, 10):
        for at in range(size):
            raw = bytearray(b"abcdefghi"[:size])
            raw[at] |= 0x80
            cases.append(base64.b64encode(bytes(raw)).decode())
    rng = random.Random(3)
    for _ in range(2000):
        text = "".join(rng.choice(string.printable) for _ in range(rng.randrange(1, 61)))
        cases.append(base64.b64encode(text.encode()).decode())
    for encoded in cases:
        assert native_id(encoded) == strict(encoded), encoded
    assert sum(strict(c) is not None for c in cases) > 2000  # most decode; the rest are refused


def test_the_native_sw8_header_is_the_python_one() -> None:
    """``sw8_header`` (swmp/_native/sw8.c, inject.c) builds what Span.inject's Python path
    builds, byte for byte: ASCII and other text in the endpoint and the peer, an empty peer
    or endpoint, a trace continued from a caller (its own trace id) or new (one id for both),
    any span id; it leaves text it would encode differently (a lone surrogate) and
    pure-Python segments to that path (None). Decoding the result gives the fields back
    (but for an empty peer, which a decoder refuses: test_malformed_sw8_is_rejected)."""
    if not span_module.NATIVE:
        return
    from swmp import _spancore
    from swmp.tracing.identity import identity
    from swmp.tracing.segment import Segment

    def python_sw8(span: Any) -> str:
        saved, span_module._sw8_header = span_module._sw8_header, None
        span.segment.encoded = None
        try:
            return span_module._inject(span)["sw8"]
        finally:
            span_module._sw8_header = saved
            span.segment.encoded = None

    rng = random.Random(7)
    texts = ["", "/ep", "h:80", "/users/{id}", "é/ü", "中文:9", "a" * 300, "🙂", "x-y-z", " sp ace "]
    alphabet = string.printable + "éß中"
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40))) for _ in range(200)]
    for i, (op, peer) in enumerate(zip(texts, reversed(texts), strict=True)):
        seg = Segment() if i % 2 else Segment(f"caller-{i}.{op[:5]}")
        span = span_module.Span(seg, [0, 1, 7, 2**31 - 1][i % 4], -1, op or "/x", 1, 3, 23, peer)
        seg.first = span
        native = _spancore.sw8_header(span, identity.service_b64, identity.instance_b64)
        assert native == python_sw8(span), (op, peer)
        decoded = P.decode_sw8(native)
        if not peer:  # an empty address used at the client: refused, as the peer agents do
            assert decoded is None, native
            continue
        assert decoded is not None and decoded.trace_id == seg.trace_id, native
        assert (decoded.span_id, decoded.endpoint, decoded.address) == (span.span_id, op or "/x", peer)
    for big in (2**40, 2**63 - 1):  # beyond what a decoder takes back, still the same text
        span = span_module.Span(Segment(), big, -1, "/x", 1, 3, 23, "h:1")
        assert _spancore.sw8_header(span, identity.service_b64, identity.instance_b64) == python_sw8(span)
    for odd_id in (-1, 2**64):  # left to Python
        span = span_module.Span(Segment(), odd_id, -1, "/x", 1, 3, 23, "h:1")
        assert _spancore.sw8_header(span, identity.service_b64, identity.instance_b64) is None
    # Text Python encodes with "replace", and a segment the C core does not know: Python's.
    seg = Segment()
    odd = span_module.Span(seg, 1, 0, "/x", 1, 3, 23, "h\udc80:1")
    assert _spancore.sw8_header(odd, identity.service_b64, identity.instance_b64) is None
    assert odd.inject()["sw8"] == python_sw8(odd)

    class PySegment:
        trace_id = segment_id = "t.1"
        encoded = None
        first = None
        ended_op = "/x"

    foreign = span_module.Span(seg, 1, 0, "/x", 1, 3, 23, "h:1")
    foreign.segment = PySegment()  # type: ignore[assignment]
    assert _spancore.sw8_header(foreign, identity.service_b64, identity.instance_b64) is None


def test_the_native_inject_gives_the_python_headers() -> None:
    """``span.inject()`` of the native core (inject.c) returns what the Python reference
    (``span._inject`` without the native sw8) returns: for peers that come back as the same
    string object, as another object with the same text, or alternate with others (the
    native core remembers the last peer's base64); for any span id; and, through the
    reference it falls back to, with correlation data and ``sw8-x``."""
    if not span_module.NATIVE:
        return
    from swmp.tracing.segment import Segment

    def reference(span: Any) -> dict[str, str]:
        saved, span_module._sw8_header = span_module._sw8_header, None
        encoded, span.segment.encoded = span.segment.encoded, None
        try:
            return span_module._inject(span)
        finally:
            span_module._sw8_header = saved
            span.segment.encoded = encoded

    peer = "broker:5672"
    peers = [peer, peer, "".join(["broker:", "5672"]), "other:1", peer, "é:1", "é:1", "", peer, "h\udc80:1"]
    for i, p in enumerate(peers):
        seg = Segment() if i % 2 else Segment(f"caller-{i}.1")
        span = span_module.Span(seg, [0, 1, 10, 2**40][i % 4], -1, f"/op/{i}", 1, 3, 23, p)
        seg.first = span
        assert span.inject() == reference(span), p
    seg = Segment()
    span = span_module.Span(seg, 3, 0, "/x", 1, 3, 23, peer)
    seg.first = span
    seg.correlation = {}  # a caller's empty correlation, as the Python entry path keeps it
    assert span.inject() == reference(span) and set(span.inject()) == {"sw8"}
    seg.correlation = {"k": "v"}
    seg.skip_analysis = True
    got = span.inject()
    assert got == reference(span) and set(got) == {"sw8", "sw8-correlation", "sw8-x"}, got
