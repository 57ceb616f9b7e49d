"""The proto3-JSON builder parses (with the protobuf library) into the same messages."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from google.protobuf import json_format
from hypothesis import given, settings

from reporter_proc import encode, jsonwire
from reporter_proc.encode import EncodeError
from reporter_proc.protocol.generated import logging_pb2, management_pb2, tracing_pb2
from tests import pbref

S = pbref.strategies()
FAST = settings(max_examples=150, deadline=None)


def _parse(obj: Any, cls: Any) -> Any:
    # Through real JSON bytes, as the HTTP body travels.
    return json_format.Parse(jsonwire.dumps(obj), cls())


@FAST
@given(S.segment)
def test_segment_json(rec: list[Any]) -> None:
    expected = pbref.segment(rec)
    assert _parse(jsonwire.segment(rec), tracing_pb2.SegmentObject) == expected
    assert tracing_pb2.SegmentObject.FromString(encode.segment(rec)) == expected


@FAST
@given(S.log)
def test_log_json(rec: list[Any]) -> None:
    assert _parse(jsonwire.log(rec), logging_pb2.LogData) == pbref.log(rec)


@FAST
@given(S.name, S.name, S.properties, S.name)
def test_management_json(service: str, instance: str, props: list[tuple[str, str]], layer: str) -> None:
    expected = pbref.instance_properties(service, instance, props, layer)
    body = jsonwire.instance_properties(service, instance, props, layer)
    got = _parse(body, management_pb2.InstanceProperties)
    assert got == expected
    assert _parse(
        jsonwire.instance_ping(service, instance, layer), management_pb2.InstancePingPkg
    ) == pbref.instance_ping(service, instance, layer)


def test_enums_by_name_and_camel_case() -> None:
    rec = [
        "t",
        "s",
        "svc",
        "i",
        True,
        [
            [
                1,
                0,
                10,
                20,
                "op",
                "peer",
                1,
                3,
                7,
                True,
                True,
                ["k", "v"],
                [[15, ["event", "x"]]],
                [[1, "t0", "s0", 2, "ps", "pi", "pe", "addr"]],
            ]
        ],
    ]
    d = jsonwire.segment(rec)
    span = d["spans"][0]
    assert span["spanType"] == "Exit" and span["spanLayer"] == "Http"
    assert span["refs"][0]["refType"] == "CrossThread"
    assert d["isSizeLimited"] is True and span["skipAnalysis"] is True
    assert "parentSpanId" not in span  # default values are left out
    # An array body for /v3/segments is a JSON list of such objects.
    assert orjson.loads(jsonwire.dumps([d, d]))[1]["traceSegmentId"] == "s"


@pytest.mark.parametrize(
    "rec",
    [
        None,
        [],
        ["t", "s", "svc", "i", "no", []],
        ["t", "s", 3, "i", False, []],
        ["t", "s", "svc", "i", False, [[0, -1, 1.5, 2, "op", "", 0, 0, 0, False, False, [], [], []]]],
        ["t", "s", "svc", "i", False, [[0, -1, 1, 2, "op", "", 0, 0, 2**31, False, False, [], [], []]]],
        ["t", "s", "svc", "i", False, [[0, -1, 1, 2, "op", "", 0, 0, 0, False, False, ["k"], [], []]]],
        ["t", "s", "svc", "i", False, [[0, -1, 1, 2, "op", "", 0, 0, 0, False, False, [], [], [[1]]]]],
    ],
)
def test_garbage_segments(rec: Any) -> None:
    with pytest.raises(EncodeError):
        jsonwire.segment(rec)


def test_garbage_logs_and_management() -> None:
    with pytest.raises(EncodeError):
        jsonwire.log([1, "s", "i", "e", "html", "x", "", "", -1, [], ""])
    with pytest.raises(EncodeError):
        jsonwire.log([1, "s", "i", "e", "text", "x", 5, "", -1, [], ""])
    with pytest.raises(EncodeError):
        jsonwire.instance_properties("s", "i", [("k", 1)])  # type: ignore[list-item]
    with pytest.raises(EncodeError):
        jsonwire.instance_ping("s", None, 3)  # type: ignore[arg-type]
