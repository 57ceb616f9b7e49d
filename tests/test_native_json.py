"""The SEGMENT record's JSON written by the native core (swmp/_native/json.c) is orjson's,
byte for byte, and every value it does not take goes to orjson as before."""

from __future__ import annotations

import enum
import random
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from swmp import _sink, tracing
from swmp.config import load
from swmp.propagation import ContextCarrier, decode_sw8
from swmp.tracing import context as C
from swmp.tracing import span as S

native = pytest.importorskip("swmp._spancore")
pytestmark = pytest.mark.skipif(not S.NATIVE, reason="the native span core is not built")


class Kind(enum.IntEnum):
    EXIT = 1


class Text(str):
    pass


def _deep(levels: int) -> Any:
    v: Any = 1
    for _ in range(levels):
        v = [v]
    return v


TAKEN = [
    'quote " backslash \\ slash /',
    "".join(chr(i) for i in range(32)) + "\x7f",
    "é 漢字 😀 \u2028\u2029",
    "",
    "x" * 5000,  # past the writer's first buffer
    True,
    False,
    None,
    0,
    -1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,  # orjson writes unsigned 64-bit integers too
    [],
    [[]],
    (1, "tuple"),
    Kind.EXIT,
    Text("a str subclass"),
    _deep(20),
]
DECLINED = [1.5, {"a": 1}, 2**64, -(2**63) - 1, "lone \ud800 surrogate", _deep(40), object()]


@pytest.mark.parametrize("value", TAKEN, ids=lambda v: repr(v)[:30])
def test_values_are_written_as_orjson_writes_them(value: Any) -> None:
    assert native.json_dumps([value, "next"]) == orjson.dumps([value, "next"])


@pytest.mark.parametrize("value", DECLINED, ids=lambda v: repr(v)[:30])
def test_values_only_orjson_decides_are_declined(value: Any) -> None:
    assert native.json_dumps(["before", value]) is None


def test_random_text_matches_orjson() -> None:
    rnd = random.Random(20261126)
    planes = [(0, 128), (128, 0xD800), (0xE000, 0x110000)]
    for _ in range(5000):
        text = "".join(chr(rnd.randrange(*rnd.choice(planes))) for _ in range(rnd.randrange(0, 24)))
        assert native.json_dumps([text, [text]]) == orjson.dumps([text, [text]]), repr(text)


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    s = _sink.MemorySink()
    _sink.set_sink(s)
    tracing.configure(load({}, agent_log_reporter_active=False, agent_meter_reporter_active=False))
    yield s
    _sink.set_sink(None)


def _payloads(sink: _sink.MemorySink) -> list[bytes]:
    return [bytes(p) for _t, p in list(sink.records)]


def test_emitted_records_are_orjsons_bytes(sink: _sink.MemorySink) -> None:
    """A request with tags, logs, an error, refs and escapes in its text: the record the
    native core writes decodes to the segment's fields and re-encodes to the same bytes."""
    carrier = decode_sw8(ContextCarrier("t-1", "s-1", 3, "up", "i", "/e", "h:1").to_sw8())
    assert carrier is not None
    with C.new_entry_span('/users/"quoted"\n', carrier, 7001, 3) as entry:
        entry.tag("http.method", "GET")
        with C.new_exit_span("SELECT é", "db:5432", 22, 1) as exit_span:
            exit_span.tag("db.statement", "SELECT '\t漢'")
            exit_span.error(ValueError("bad\x00value"))
        entry.log("done", attempt=2)
    (payload,) = _payloads(sink)
    record = orjson.loads(payload)
    assert orjson.dumps(record) == payload
    assert record[0] == "t-1" and record[1] == entry.segment.segment_id
    spans = record[5]
    assert [s[4] for s in spans] == ["SELECT é", '/users/"quoted"\n']
    assert spans[0][11][-2:] == ["db.statement", "SELECT '\t漢'"] and spans[0][9] is True
    assert spans[1][13][0][1:3] == ["t-1", "s-1"]  # the caller's reference


def test_a_value_the_writer_declines_goes_to_orjson(sink: _sink.MemorySink) -> None:
    with C.new_entry_span("/float", None, 7001, 3) as entry:
        entry.tags = ["ratio", 1.5]  # set directly: span.tag() would have made it text
    with C.new_entry_span("/surrogate", None, 7001, 3), C.new_local_span("lone \ud800"):
        pass
    first, second = _payloads(sink)
    assert orjson.loads(first)[5][0][11] == ["ratio", 1.5]  # written, by orjson
    # orjson refuses the surrogate too: the Python emit sends it escaped (swmp.tracing.utf8).
    assert [s[4] for s in orjson.loads(second)[5]] == ["lone \\ud800", "/surrogate"]


def test_text_with_an_escape_at_every_position_matches_orjson() -> None:
    """The writer checks text by words of eight (the last one overlapping) and four (4-7
    bytes) before copying it whole: one byte to escape (or one that needs none: DEL,
    non-ASCII) at every position of every length around those words."""
    for n in range(1, 26):
        for pos in range(n):
            for ch in ('"', "\\", "\n", "\x00", "\x1f", " ", "\x7f", "é", "😀"):
                text = "a" * pos + ch + "b" * (n - pos - 1)
                assert native.json_dumps([text]) == orjson.dumps([text]), repr(text)
        assert native.json_dumps(["c" * n]) == orjson.dumps(["c" * n])


@pytest.mark.parametrize("bits", [0, 1, 29, 30, 31, 59, 60, 61, 62, 63])
def test_integers_around_the_digit_boundaries_match_orjson(bits: int) -> None:
    """Exact ints of up to two 30-bit digits are read from their digits."""
    for v in (2**bits - 1, 2**bits, 2**bits + 1):
        for value in (v, -v):
            if -(2**63) <= value < 2**64:
                assert native.json_dumps([value]) == orjson.dumps([value]), value


@pytest.mark.parametrize("k", range(20))
def test_integers_of_every_decimal_length_match_orjson(k: int) -> None:
    """The writer counts an integer's digits before writing them in place: around every
    power of ten, each sign, alone and between other values."""
    for v in (10**k - 1, 10**k, 10**k + 1, 2 * 10**k, 10 ** (k + 1) - 1):
        for value in (v, -v):
            if -(2**63) <= value < 2**64:
                row = ["a", value, value, "b"]
                assert native.json_dumps([value]) == orjson.dumps([value]), value
                assert native.json_dumps(row) == orjson.dumps(row), value
