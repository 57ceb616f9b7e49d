"""The native encoder (reporter_proc/_native/*.c) is the pure-Python encoder, byte for byte.

The module under test is compiled from the current C source into a temporary directory by
``setup.py build_ext`` (the build ``pip install`` runs; only this module of setup.py's three),
so these tests never pass on a stale in-place build and they fail, rather than skip, when
the extension does not compile. They skip only on a machine without a C compiler, where the
install falls back to pure Python.

Checked: equal bytes for every valid record the records contract allows (generated: unicode,
empty strings, huge and negative ints, falsy optional fields, every span/ref/tag/log shape),
the same outcome for malformed records (both raise EncodeError, or both encode the same
bytes), BaseExceptions passing through, no reference or memory leaks, and the selection
between native and pure Python (``SWMP_ENCODE_PURE``).
"""

from __future__ import annotations

import copy
import gc
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reporter_proc import encode
from reporter_proc.encode import EncodeError
from tests import pbref
from tests.fuzz_budget import examples

ROOT = Path(__file__).resolve().parent.parent
S = pbref.strategies()
MANY = settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
# setup.py run as is, but with only the encoder among its extensions: the same definition
# (sources, flags, CFLAGS from the environment) without compiling the other two modules,
# which took ~80% of the build's time (~9 of 11 s; 36 s in the sanitizer run's loaded shard).
ENCODER_ONLY = """
import sys, setuptools
full_setup = setuptools.setup
def encoder_only(**kw):
    exts = [e for e in kw["ext_modules"] if e.name == "reporter_proc._encode_native"]
    assert len(exts) == 1, kw["ext_modules"]
    return full_setup(**{**kw, "ext_modules": exts})
setuptools.setup = encoder_only
sys.argv[0] = "setup.py"
exec(compile(open("setup.py").read(), "setup.py", "exec"), {"__name__": "__main__", "__file__": "setup.py"})
"""


@pytest.fixture(scope="session")
def native(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    if shutil.which(os.environ.get("CC", "cc")) is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the install falls back to the pure-Python encoder")
    out = tmp_path_factory.mktemp("native-build")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            ENCODER_ONLY,
            "-q",
            "build_ext",
            "--build-lib",
            str(out / "lib"),
            "--build-temp",
            str(out / "tmp"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    built = sorted((out / "lib" / "reporter_proc").glob("_encode_native*.so"))
    assert proc.returncode == 0 and built, f"native encoder did not build:\n{proc.stdout}\n{proc.stderr}"
    spec = importlib.util.spec_from_file_location("reporter_proc._encode_native", built[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)  # not put in sys.modules: encode.py is untouched
    spec.loader.exec_module(module)
    yield module


def _outcome(fn: Callable[[Any], bytes], rec: Any) -> bytes | str:
    """The bytes, or the class name of what was raised (anything but EncodeError fails)."""
    try:
        return fn(rec)
    except EncodeError:
        return "EncodeError"


def _pure(fn: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    def call(rec: Any) -> bytes:
        # Cached fields are looked up by equality, so a cache warmed by earlier examples could
        # accept a float where an int belongs (1.0 == 1); start every example cold.
        encode.clear_caches()
        return fn(rec)

    return call


# --------------------------------------------------------------------------- valid records
@MANY
@given(S.segment)
def test_segments_are_byte_identical(native: ModuleType, rec: list[Any]) -> None:
    assert native.segment(rec) == encode.segment_py(rec)


@MANY
@given(S.log)
def test_logs_are_byte_identical(native: ModuleType, rec: list[Any]) -> None:
    assert native.log(rec) == encode.log_py(rec)


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=20))
def test_segment_collection_is_byte_identical(native: ModuleType, bodies: list[bytes]) -> None:
    assert native.segment_collection(bodies) == encode.segment_collection_py(bodies)
    assert native.segment_collection(tuple(bodies)) == encode.segment_collection_py(bodies)


def _rich_segment(value_len: int = 30) -> list[Any]:
    """Every shape at once: refs, span logs, short and long tags, unicode, -1 and huge ints."""
    long_value = "é" * value_len
    ref = [1, "tr\u00e9ce", "parent-seg", 3, "frontend", "frontend-0@host", "/checkout", "10.0.0.1:80"]
    spans = [
        [
            0,
            -1,
            1_700_000_000_000,
            1_700_000_000_025,
            "GET /users/{id}",
            "",
            0,
            3,
            7000,
            True,
            False,
            ["http.method", "GET", "url", long_value, "", "no key", "empty value", ""],
            [[1_700_000_000_001, ["event", "error", "message", long_value]], [0, []]],
            [ref, ref],
        ],
        [1, 0, 2**62, -(2**63), "SELECT ✓", "db:5432", 1, 1, 2**31 - 1, False, True, [], [], []],
        [-(2**31), 2**31 - 1, 0, 0, "", "", -1, -(2**31), 0, None, None, None, None, None],
    ]
    return ["trace-🙂", "segment-1", "svc-ü", "inst-0@host", True, spans]


@pytest.mark.parametrize("value_len", [0, 24, 25, 127, 128, 8191, 8192, 16384, 1 << 21])
def test_every_shape_and_length_boundary(native: ModuleType, value_len: int) -> None:
    # Lengths straddle the cached-value limit and 1-, 2-, 3- and 4-byte varint lengths (a
    # nested message whose length outgrows the two reserved bytes moves its body).
    rec = _rich_segment(value_len)
    assert native.segment(rec) == encode.segment_py(rec)
    log = [
        1_700_000_000_000,
        "svc",
        "inst",
        "/ep",
        "json",
        "x" * value_len,
        "t",
        "s",
        2,
        ["level", "ERROR", "logger", "é" * value_len],
        "GENERAL",
    ]
    assert native.log(log) == encode.log_py(log)


def test_tuples_are_records_too(native: ModuleType) -> None:
    rec = _rich_segment()
    as_tuples = tuple(tuple(x) if isinstance(x, list) else x for x in rec)
    assert native.segment(as_tuples) == encode.segment_py(as_tuples) == native.segment(rec)


# --------------------------------------------------------------------------- malformed records
class _BadBool:
    """A value whose truth cannot be taken."""

    def __bool__(self) -> bool:
        raise ValueError("no truth")


JUNK = [
    None,
    "",
    "x",
    "é" * 30,
    "\ud800",
    0,
    1,
    -1,
    -5,
    2**31,
    -(2**31) - 1,
    2**63,
    -(2**63) - 1,
    2**70,
    1.5,
    0.0,
    True,
    False,
    [],
    [1],
    ["a"],
    ["a", "b"],
    ("a",),
    (),
    {},
    {"a": 1},
    b"",
    b"x",
    _BadBool(),
]
# Not in JUNK, and a documented difference: an integral float where an int belongs is an
# error for the native encoder, while the pure one accepts -1.0 (and any float equal to a
# cached int). Workers write ints, and orjson decodes integral JSON numbers as ints.


@st.composite
def _mutated(draw: st.DrawFn, records: st.SearchStrategy[list[Any]]) -> list[Any]:
    """A valid record with one element, at any depth, replaced by junk."""
    rec = copy.deepcopy(draw(records))
    node: list[Any] = rec
    while True:
        i = draw(st.integers(0, len(node) - 1))
        child = node[i]
        if isinstance(child, list) and child and draw(st.booleans()):
            node = child
            continue
        node[i] = draw(st.sampled_from(JUNK))
        return rec


@settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated(S.segment))
def test_malformed_segments_fail_the_same_way(native: ModuleType, rec: list[Any]) -> None:
    assert _outcome(native.segment, rec) == _outcome(_pure(encode.segment_py), rec)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated(S.log))
def test_malformed_logs_fail_the_same_way(native: ModuleType, rec: list[Any]) -> None:
    assert _outcome(native.log, rec) == _outcome(_pure(encode.log_py), rec)


@pytest.mark.parametrize("bad", [None, 5, "abc", [1, 2], [None] * 6, [None] * 11, {}, b"x" * 6])
def test_whole_record_junk(native: ModuleType, bad: Any) -> None:
    assert _outcome(native.segment, bad) == _outcome(_pure(encode.segment_py), bad)
    assert _outcome(native.log, bad) == _outcome(_pure(encode.log_py), bad)


def test_error_is_encode_error_with_cause(native: ModuleType) -> None:
    rec = _rich_segment()
    rec[5][0][4] = _BadBool()  # a ValueError inside becomes EncodeError, chained as in encode.py
    with pytest.raises(EncodeError) as info:
        native.segment(rec)
    assert isinstance(info.value.__cause__, ValueError)
    rec[5][0][2] = 2**64  # out of range: EncodeError itself
    with pytest.raises(EncodeError, match="int64"):
        native.segment(rec)


def test_base_exceptions_pass_through(native: ModuleType) -> None:
    class Interrupting:
        def __bool__(self) -> bool:
            raise KeyboardInterrupt

    rec = _rich_segment()
    rec[0] = Interrupting()
    with pytest.raises(KeyboardInterrupt):
        native.segment(rec)
    with pytest.raises(KeyboardInterrupt):
        encode.segment_py(rec)


class _Clearing:
    """A falsy value whose truth, once taken, empties the list holding it (frees its items)."""

    def __init__(self) -> None:
        self.holder: list[Any] = []

    def __bool__(self) -> bool:
        self.holder.clear()
        return False


def _with_clearing(where: str) -> list[Any]:
    rec = _rich_segment()
    if where == "span":  # the span's operation name: the span's own list is emptied
        value = _Clearing()
        value.holder = rec[5][0]
        rec[5][0][4] = value
    elif where == "tags":  # a tag key: the tag list being walked is emptied
        value = _Clearing()
        value.holder = rec[5][0][11]
        rec[5][0][11][2] = value
    else:  # the record's service: the record itself
        value = _Clearing()
        value.holder = rec
        rec[2] = value
    return rec


@pytest.mark.parametrize("where", ["span", "tags", "record"])
def test_values_that_run_code_are_encoded_as_python_does(native: ModuleType, where: str) -> None:
    """The native walk reads the record's lists without running Python code; a value whose
    truth, length or hash does run code (here: emptying the list it is in) sends the record to
    the pure-Python encoder, which gives the bytes (or the error) the Python rules give."""
    assert _outcome(native.segment, _with_clearing(where)) == _outcome(
        _pure(encode.segment_py), _with_clearing(where)
    )

    def log() -> list[Any]:  # the endpoint empties the record
        rec = [1_700_000_000_000, "svc", "inst", _Clearing(), "text", "body", "t", "s", 2, ["level", "X"], ""]
        rec[3].holder = rec
        return rec

    assert _outcome(native.log, log()) == _outcome(_pure(encode.log_py), log())


def test_segment_collection_rejects_non_bytes(native: ModuleType) -> None:
    with pytest.raises(TypeError):
        native.segment_collection([b"ok", "not bytes"])
    with pytest.raises(TypeError):
        native.segment_collection(None)


# --------------------------------------------------------------------------- from JSON bytes
def _exact(payload: bytes) -> bytes | str:
    """What the reporter does without the fast path: decode, then encode (pure Python)."""
    encode.clear_caches()
    try:
        rec = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return "EncodeError"
    if not isinstance(rec, list):
        return "EncodeError"
    return _outcome(encode.segment_py, rec)


def _check_json(native: ModuleType, payload: bytes) -> bool:
    """The fast path either declines (None) or gives exactly the bytes of the exact path."""
    got = native.segment_json(payload)
    if got is not None:
        assert got == _exact(payload)
    return got is not None


@MANY
@given(S.segment)
def test_segments_from_json_are_byte_identical(native: ModuleType, rec: list[Any]) -> None:
    expected = encode.segment_py(rec)
    # orjson's output (what workers write), pretty-printed, and ASCII-only with \u escapes
    # (surrogate pairs for emoji) all take the fast path and give the same bytes.
    for payload in (
        orjson.dumps(rec),
        orjson.dumps(rec, option=orjson.OPT_INDENT_2),
        json.dumps(rec, ensure_ascii=True).encode(),
    ):
        try:
            orjson.loads(payload)
        except orjson.JSONDecodeError:  # a lone surrogate generated by hypothesis
            continue
        assert native.segment_json(payload) == expected


@settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated(S.segment))
def test_malformed_json_records_decline_or_agree(native: ModuleType, rec: list[Any]) -> None:
    try:
        payload = orjson.dumps(rec)
    except TypeError:  # junk JSON cannot carry (bytes, a lone surrogate, an object)
        return
    _check_json(native, payload)


@settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(S.segment, st.data())
def test_corrupted_json_bytes_decline_or_agree(
    native: ModuleType, rec: list[Any], data: st.DataObject
) -> None:
    raw = bytearray(orjson.dumps(rec))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["set", "delete", "insert"]))
        byte = data.draw(
            st.sampled_from(
                [
                    *b'[]{}",:\\-.0123456789eEtfnul x',
                    0x00,
                    0x1F,
                    0x7F,
                    0x80,
                    0xC0,
                    0xE2,
                    0xED,
                    0xF4,
                    0xF5,
                    0xFF,
                ]
            )
        )
        if action == "set":
            raw[i] = byte
        elif action == "delete":
            del raw[i]
        else:
            raw.insert(i, byte)
    _check_json(native, bytes(raw))


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"[",
        b"]",
        b"null",
        b"{}",
        b'"x"',
        b"[1,2]",
        b'["t","s","svc","i",false,[]] x',
        b'["t","s","svc","i",false,null]',
        b'["t","s","svc","i",false,[]]',
        b'{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6}',
        b'["t","s","svc","i",false,[],7]',
        b'["\\ud800","s","svc","i",false,[]]',
        b'["\\u00e9\\ud83d\\ude00","s","","",false,[]]',
        b'["t\\"q","s\\\\","svc","i",true,[]]',
        b'["t","s","svc","i",1,[]]',
        b'["t","s","svc","i",false,[[01,-1,1,2,"","",0,0,0,false,false,[],[],[]]]]',
        b'["t","s","svc","i",false,[[1.0,-1,1,2,"","",0,0,0,false,false,[],[],[]]]]',
        b'["t","s","svc","i",false,[[-0,-1,1e3,2,"","",0,0,0,false,false,[],[],[]]]]',
        b'["t","s","svc","i",false,[[2147483648,-1,1,2,"","",0,0,0,false,false,[],[],[]]]]',
        b'["t","s","svc","i",false,[[-2147483648,-1,9223372036854775807,-9223372036854775808,'
        b'"","",0,0,0,null,null,null,null,null]]]',
        b'["t","s","svc","i",false,[[0,-1,1,2,"","",0,0,0,false,false,["k"],[],[]]]]',
        b'["t","s","svc","i",false,[[0,-1,1,2,"","",0,0,0,false,false,[null,"v","k",null],[],[]]]]',
        b'["t","s","svc","i",false,[[0,-1,1,2,"","",0,0,0,false,false,[],[[1,null],[null,[]]],'
        b'[[0,"","",0,"","","",""],[1,"t","s",-1,null,"i","e","a"]]]]]',
        b' [ "t" , "s" , "svc" , "i" , false , [ ] ] \n',
        b'["t","s","svc","i",false,[]]\x00',
    ],
)
def test_json_edge_payloads(native: ModuleType, payload: bytes) -> None:
    _check_json(native, payload)


def test_plain_payloads_take_the_fast_path(native: ModuleType) -> None:
    rec = _rich_segment()
    rec[5][2][9:14] = [False, False, [], [], []]  # the null-free shape workers write
    for r in (rec, _rich_segment(1 << 21)):
        r[5][2][9:11] = [False, False]
        payload = orjson.dumps(r)
        assert native.segment_json(payload) == encode.segment_py(r)
    empty = ["t", "s", "svc", "i", False, []]
    assert native.segment_json(b'["t","s","svc","i",false,[]]') == encode.segment_py(empty)
    assert native.segment_json(bytearray(b"[]")) is None  # only bytes objects


def test_segment_payload_takes_raw_or_decoded(native: ModuleType) -> None:
    rec = _rich_segment()
    payload = orjson.dumps(rec)
    assert encode.segment_payload(payload) == encode.segment_payload(rec) == encode.segment_py(rec)
    assert encode.segment_from_json_py(payload) == encode.segment_py(rec)
    for bad in (b"not json", b'{"a": 1}', b"[1, 2]"):
        with pytest.raises(EncodeError):
            encode.segment_payload(bad)


# --------------------------------------------------------------------------- leaks
def _unique(obj: Any) -> Any:
    """A copy whose containers, strings (len > 1) and ints (beyond the cached small ones)
    are new objects nobody else holds, so their reference counts are exact."""
    if isinstance(obj, list):
        return [_unique(x) for x in obj]
    if isinstance(obj, str) and len(obj) > 1:
        return (obj + ".")[:-1]
    if type(obj) is int and not -5 <= obj <= 256:
        return int(str(obj))
    return obj


def _owned(obj: Any) -> list[Any]:
    """The objects of ``obj`` that _unique made new."""
    if isinstance(obj, list):
        return [obj] + [y for x in obj for y in _owned(x)]
    if (isinstance(obj, str) and len(obj) > 1) or (type(obj) is int and not -5 <= obj <= 256):
        return [obj]
    return []


def test_no_reference_leaks(native: ModuleType) -> None:
    good = _unique(_rich_segment())
    good[0] = _unique("trace-é")  # non-ASCII: the string caches its UTF-8
    bad = _unique(_rich_segment())
    bad[5][1][13] = [[1, "t", "s", 2, "svc", "inst", "/ep", _BadBool()]]  # fails deep inside
    log = _unique([1, "svc", "inst", "", "text", "body é", "trace", "", 1, ["k", "vé"], ""])
    payload = orjson.dumps(good)
    objects = [*_owned(good), *_owned(bad), *_owned(log), payload]
    gc.collect()
    before = [sys.getrefcount(o) for o in objects]
    for _ in range(2000):
        native.segment(good)
        native.segment_json(payload)
        native.segment_json(payload[:-3])  # declined half way
        native.log(log)
        with pytest.raises(EncodeError):
            native.segment(bad)
    gc.collect()
    after = [sys.getrefcount(o) for o in objects]
    assert after == before


def test_no_memory_growth(native: ModuleType) -> None:
    good = _rich_segment()
    big = _rich_segment(20_000)  # outgrows the stack buffer: the heap path must free too
    bad = _rich_segment()
    bad[5][2][11] = ["k", ["not", "a", "string"]]
    big_json = orjson.dumps(big)
    calls = [
        lambda: native.segment(good),
        lambda: native.segment(big),
        lambda: native.segment_json(big_json),
        lambda: native.segment_json(big_json[:-2]),
        lambda: native.segment_collection([b"a" * 100] * 10),
    ]

    def loop(n: int) -> None:
        for _ in range(n):
            for call in calls:
                call()
            try:
                native.segment(bad)
            except EncodeError:
                pass

    gc.collect()
    tracemalloc.start()
    try:
        loop(200)  # warm-up: whatever is allocated once (caches, free lists) is allocated now
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        loop(3000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes still allocated after 3000 rounds"


# --------------------------------------------------------------------------- selection
def _selected(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != encode.PURE_ENV}
    if env_value is not None:
        env[encode.PURE_ENV] = env_value
    code = (
        "from reporter_proc import encode; "
        "print(encode.NATIVE is not None, encode.segment is encode.segment_py, "
        "encode.log is encode.log_py)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.strip()


def test_pure_python_can_be_forced() -> None:
    assert _selected("1") == "False True True"


def test_native_is_used_when_importable() -> None:
    # In this checkout the module is importable only if it was built in place (pip install
    # -e . or setup.py build_ext --inplace); either way the selection must follow.
    built = importlib.util.find_spec("reporter_proc._encode_native") is not None
    expected = "True False False" if built else "False True True"
    assert _selected(None) == expected
    assert _selected("0") == expected
