"""The hand-written encoder produces exactly what the generated protobuf classes produce."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reporter_proc import encode
from reporter_proc.encode import EncodeError
from reporter_proc.protocol.generated import (
    logging_pb2,
    management_pb2,
    meter_pb2,
    profile_pb2,
    tracing_pb2,
)
from tests import pbref

S = pbref.strategies()
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _same(encoded: bytes, expected: Any, cls: Any) -> None:
    # Parsing proves the bytes are a valid message equal to the reference; comparing bytes
    # proves field order and default-skipping match upb's serializer too.
    assert cls.FromString(encoded) == expected
    assert encoded == expected.SerializeToString()


@FAST
@given(S.segment)
def test_segment_matches_generated_classes(rec: list[Any]) -> None:
    _same(encode.segment(rec), pbref.segment(rec), tracing_pb2.SegmentObject)


@settings(max_examples=60, deadline=None)
@given(st.lists(S.segment, max_size=3))
def test_segment_collection(recs: list[list[Any]]) -> None:
    coll = tracing_pb2.SegmentCollection(segments=[pbref.segment(r) for r in recs])
    _same(encode.segment_collection([encode.segment(r) for r in recs]), coll, tracing_pb2.SegmentCollection)


@FAST
@given(S.log)
def test_log_matches_generated_classes(rec: list[Any]) -> None:
    _same(encode.log(rec), pbref.log(rec), logging_pb2.LogData)


@FAST
@given(S.meter)
def test_meters_match_generated_classes(rec: list[Any]) -> None:
    _same(encode.meter_collection(rec), pbref.meter_collection(rec), meter_pb2.MeterDataCollection)
    datas = encode.meter_datas(rec)
    expected = pbref.meter_datas(rec)
    assert len(datas) == len(expected)
    for got, want in zip(datas, expected, strict=True):
        _same(got, want, meter_pb2.MeterData)


def test_meter_nan_and_negative_zero_bytes() -> None:
    rec = [
        1,
        "s",
        "i",
        [
            [1, "nan", [], math.nan],
            [1, "negzero", [], -0.0],
            [1, "zero", [], 0.0],
            [2, "h", ["a", "b"], [[-math.inf, 0, True], [0.0, 3, False], [math.inf, 1, False]]],
        ],
    ]
    assert encode.meter_collection(rec) == pbref.meter_collection(rec).SerializeToString()


@FAST
@given(S.snapshot, S.finish)
def test_profile_messages(snapshot: list[Any], finish: list[Any]) -> None:
    _same(encode.thread_snapshot(snapshot), pbref.thread_snapshot(snapshot), profile_pb2.ThreadSnapshot)
    _same(encode.profile_finish(finish), pbref.profile_finish(finish), profile_pb2.ProfileTaskFinishReport)


@FAST
@given(S.name, S.name, S.properties, S.name, S.i64)
def test_management_and_query(
    service: str, instance: str, props: list[tuple[str, str]], layer: str, last: int
) -> None:
    _same(
        encode.instance_properties(service, instance, props, layer),
        pbref.instance_properties(service, instance, props, layer),
        management_pb2.InstanceProperties,
    )
    _same(
        encode.instance_properties(service, instance, props),
        pbref.instance_properties(service, instance, props),
        management_pb2.InstanceProperties,
    )
    _same(
        encode.instance_ping(service, instance, layer),
        pbref.instance_ping(service, instance, layer),
        management_pb2.InstancePingPkg,
    )
    _same(
        encode.profile_task_query(service, instance, last),
        pbref.profile_task_query(service, instance, last),
        profile_pb2.ProfileTaskCommandQuery,
    )


def test_cache_stays_bounded_and_correct() -> None:
    encode.clear_caches()
    span = [0, -1, 1, 2, "", "", 0, 0, 0, False, False, [], [], []]
    for i in range(encode.CACHE_MAX * 2 + 7):
        span[4] = f"op-{i}"
        rec = ["t", "s", "svc", "inst", False, [span]]
        got = encode.segment_py(rec)  # the pure-Python encoder is the one with caches
        assert tracing_pb2.SegmentObject.FromString(got).spans[0].operationName == f"op-{i}"
    assert 0 < len(encode._SPAN_STATIC) <= encode.CACHE_MAX


def _span(**over: Any) -> list[Any]:
    fields = [
        "id",
        "parent",
        "start",
        "end",
        "op",
        "peer",
        "type",
        "layer",
        "component",
        "error",
        "skip",
        "tags",
        "logs",
        "refs",
    ]
    values = [0, -1, 1, 2, "op", "", 0, 3, 7000, False, False, ["k", "v"], [], []]
    base = dict(zip(fields, values, strict=True))
    base.update(over)
    return [base[f] for f in fields]


GARBAGE_SEGMENTS = [
    None,
    7,
    "abc",
    [],
    ["t", "s", "svc", "i", False],  # too short
    ["t", "s", "svc", "i", False, [], "extra"],  # too long
    ["t", "s", "svc", "i", "yes", []],  # bool field holding a string
    [1, "s", "svc", "i", False, []],  # int where a string belongs
    ["t", "s", b"svc", "i", False, []],  # bytes where a string belongs
    ["t", "s", "svc", "i", False, [_span()[:-1]]],  # short span
    ["t", "s", "svc", "i", False, [_span(id="1")]],
    ["t", "s", "svc", "i", False, [_span(id=2**31)]],  # int32 overflow
    ["t", "s", "svc", "i", False, [_span(start=2**63)]],  # int64 overflow
    ["t", "s", "svc", "i", False, [_span(start=1.5)]],
    ["t", "s", "svc", "i", False, [_span(start=1000.0)]],
    ["t", "s", "svc", "i", False, [_span(tags=["k"])]],  # odd key/value list
    ["t", "s", "svc", "i", False, [_span(tags="kv")]],
    ["t", "s", "svc", "i", False, [_span(tags=[1, 2])]],
    ["t", "s", "svc", "i", False, [_span(tags=[["k"], "v"])]],
    ["t", "s", "svc", "i", False, [_span(logs=[[1]])]],
    ["t", "s", "svc", "i", False, [_span(refs=[[0, "t"]])]],
    ["t", "s", "svc", "i", False, [_span(error=1)]],
    ["t", "s", "svc", "i", False, [_span(op="\ud800")]],  # lone surrogate: not UTF-8 encodable
    ["t", "s", "svc", "i", False, [{"id": 1}]],
]


@pytest.mark.parametrize("rec", GARBAGE_SEGMENTS)
def test_garbage_segments_raise_encode_error(rec: Any) -> None:
    with pytest.raises(EncodeError):
        encode.segment(rec)


@pytest.mark.parametrize(
    ("fn", "rec"),
    [
        (encode.log, [1, "s", "i", "e", "html", "x", "", "", -1, [], ""]),  # unknown body kind
        (encode.log, [1, "s", "i", "e", "text", "x", "t", "", "3", [], ""]),
        (encode.log, [1, "s", "i", "e", "text", "x", "", "", None, [], ""]),
        (encode.log, [1, "s", "i", "e", "text", "x", "", "", -1, []]),
        (encode.meter_collection, [1, "s", "i", [[3, "m", [], 1.0]]]),  # unknown meter kind
        (encode.meter_collection, [1, "s", "i", [[1, "m", [], "1.0"]]]),
        (encode.meter_collection, [1, "s", "i", [[2, "m", [], [[1.0, 2]]]]]),
        (encode.meter_datas, [1, "s", "i", None]),
        (encode.thread_snapshot, ["t", "s", 1, 2, [3]]),
        (encode.profile_finish, ["s", "i"]),
    ],
)
def test_garbage_other_records_raise_encode_error(fn: Any, rec: Any) -> None:
    with pytest.raises(EncodeError):
        fn(rec)


def test_garbage_management_arguments() -> None:
    with pytest.raises(EncodeError):
        encode.instance_properties("s", "i", [("k",)])
    with pytest.raises(EncodeError):
        encode.instance_ping("s", 5)
    with pytest.raises(EncodeError):
        encode.profile_task_query("s", "i", "1")  # type: ignore[arg-type]


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5)),
    lambda children: st.lists(children, max_size=6),
    max_leaves=40,
)


@FAST
@given(json_values)
def test_arbitrary_values_only_ever_raise_encode_error(value: Any) -> None:
    for fn in (
        encode.segment,
        encode.log,
        encode.meter_collection,
        encode.thread_snapshot,
        encode.profile_finish,
    ):
        try:
            fn(value)
        except EncodeError:
            pass


@FAST
@given(S.segment, st.data())
def test_mutated_segments_only_ever_raise_encode_error(rec: list[Any], data: st.DataObject) -> None:
    # Replace one node anywhere in a valid record with a value of another kind.
    mutated = copy.deepcopy(rec)
    path: list[tuple[list[Any], int]] = []

    def walk(node: list[Any]) -> None:
        for i, child in enumerate(node):
            path.append((node, i))
            if isinstance(child, list):
                walk(child)

    walk(mutated)
    parent, index = data.draw(st.sampled_from(path))
    parent[index] = data.draw(json_values)
    try:
        out = encode.segment(mutated)
    except EncodeError:
        return
    tracing_pb2.SegmentObject.FromString(out)  # whatever was accepted is still a valid message
