"""Reference builders: records -> messages of the generated protobuf classes, field by field.

This is the obvious, slow way to encode records. The hand-written encoder
(``reporter_proc.encode``) and the proto3-JSON builder (``reporter_proc.jsonwire``) are
tested against it: same record -> same message, and the same bytes.
Mapping choices follow the docstring of ``reporter_proc.encode``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reporter_proc.protocol.generated import (
    common_pb2,
    logging_pb2,
    management_pb2,
    meter_pb2,
    profile_pb2,
    tracing_pb2,
)
from reporter_proc.records import METER_SINGLE


def _pairs(target: Any, flat: Sequence[str]) -> None:
    for i in range(0, len(flat), 2):
        target.add(key=flat[i], value=flat[i + 1])


def segment(rec: Sequence[Any]) -> tracing_pb2.SegmentObject:
    trace_id, segment_id, service, instance, size_limited, spans = rec
    seg = tracing_pb2.SegmentObject(
        traceId=trace_id,
        traceSegmentId=segment_id,
        service=service,
        serviceInstance=instance,
        isSizeLimited=size_limited,
    )
    for s in spans:
        span = seg.spans.add()
        span.spanId = s[0]
        span.parentSpanId = s[1]
        span.startTime = s[2]
        span.endTime = s[3]
        span.operationName = s[4]
        span.peer = s[5]
        span.spanType = s[6]
        span.spanLayer = s[7]
        span.componentId = s[8]
        span.isError = s[9]
        span.skipAnalysis = s[10]
        _pairs(span.tags, s[11])
        for time_ms, data in s[12]:
            entry = span.logs.add(time=time_ms)
            _pairs(entry.data, data)
        for r in s[13]:
            span.refs.add(
                refType=r[0],
                traceId=r[1],
                parentTraceSegmentId=r[2],
                parentSpanId=r[3],
                parentService=r[4],
                parentServiceInstance=r[5],
                parentEndpoint=r[6],
                networkAddressUsedAtPeer=r[7],
            )
    return seg


def log(rec: Sequence[Any]) -> logging_pb2.LogData:
    (timestamp, service, instance, endpoint, kind, body, trace_id, segment_id, span_id, tags, layer) = rec
    msg = logging_pb2.LogData(
        timestamp=timestamp, service=service, serviceInstance=instance, endpoint=endpoint, layer=layer
    )
    msg.body.type = kind
    if kind == "text":
        msg.body.text.text = body
    elif kind == "json":
        msg.body.json.json = body
    else:
        msg.body.yaml.yaml = body
    if trace_id or segment_id:
        msg.traceContext.traceId = trace_id
        msg.traceContext.traceSegmentId = segment_id
        if span_id > 0:
            msg.traceContext.spanId = span_id
    if tags:
        _pairs(msg.tags.data, tags)
    return msg


def meter_datas(rec: Sequence[Any]) -> list[meter_pb2.MeterData]:
    timestamp, service, instance, meters = rec
    out = []
    for kind, name, labels, value in meters:
        md = meter_pb2.MeterData(service=service, serviceInstance=instance, timestamp=timestamp)
        target: Any = md.singleValue if kind == METER_SINGLE else md.histogram
        target.SetInParent()
        target.name = name
        for i in range(0, len(labels), 2):
            target.labels.add(name=labels[i], value=labels[i + 1])
        if kind == METER_SINGLE:
            target.value = value
        else:
            for bucket, count, neg_inf in value:
                target.values.add(bucket=bucket, count=count, isNegativeInfinity=neg_inf)
        out.append(md)
    return out


def meter_collection(rec: Sequence[Any]) -> meter_pb2.MeterDataCollection:
    return meter_pb2.MeterDataCollection(meterData=meter_datas(rec))


def thread_snapshot(rec: Sequence[Any]) -> profile_pb2.ThreadSnapshot:
    task_id, segment_id, time_ms, sequence, signatures = rec
    msg = profile_pb2.ThreadSnapshot(
        taskId=task_id, traceSegmentId=segment_id, time=time_ms, sequence=sequence
    )
    msg.stack.SetInParent()
    msg.stack.codeSignatures.extend(signatures)
    return msg


def profile_finish(rec: Sequence[Any]) -> profile_pb2.ProfileTaskFinishReport:
    service, instance, task_id = rec
    return profile_pb2.ProfileTaskFinishReport(service=service, serviceInstance=instance, taskId=task_id)


def instance_properties(
    service: str, instance: str, properties: Sequence[tuple[str, str]], layer: str = ""
) -> management_pb2.InstanceProperties:
    return management_pb2.InstanceProperties(
        service=service,
        serviceInstance=instance,
        layer=layer,
        properties=[common_pb2.KeyStringValuePair(key=k, value=v) for k, v in properties],
    )


def instance_ping(service: str, instance: str, layer: str = "") -> management_pb2.InstancePingPkg:
    return management_pb2.InstancePingPkg(service=service, serviceInstance=instance, layer=layer)


def profile_task_query(service: str, instance: str, last: int) -> profile_pb2.ProfileTaskCommandQuery:
    return profile_pb2.ProfileTaskCommandQuery(
        service=service, serviceInstance=instance, lastCommandTime=last
    )


# --------------------------------------------------------------------------- record strategies
def strategies() -> Any:
    """Hypothesis strategies for valid records (imported lazily: only tests need hypothesis)."""
    from types import SimpleNamespace

    from hypothesis import strategies as st

    text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
    # Mostly small, sometimes the same few strings (exercises the caches), sometimes long.
    name = st.one_of(
        text, st.sampled_from(["", "GET /users", "svc", "http.method", "200"]), st.text(max_size=300)
    )
    i32 = st.integers(-(2**31), 2**31 - 1)
    i64 = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**42))
    small = st.integers(-2, 200)
    num = st.one_of(st.floats(allow_nan=False), st.just(-0.0), st.integers(-(2**40), 2**40))

    def flat(max_pairs: int = 4) -> Any:
        return st.lists(st.tuples(name, name), max_size=max_pairs).map(
            lambda pairs: [x for p in pairs for x in p]
        )

    ref = st.tuples(st.one_of(small, i32), text, text, st.one_of(small, i32), name, name, name, name).map(
        list
    )
    span_log = st.tuples(i64, flat()).map(list)
    span = st.tuples(
        st.one_of(small, i32),
        st.one_of(st.just(-1), small, i32),
        i64,
        i64,
        name,
        name,
        st.one_of(small, i32),
        st.one_of(small, i32),
        st.one_of(small, i32),
        st.booleans(),
        st.booleans(),
        flat(),
        st.lists(span_log, max_size=2),
        st.lists(ref, max_size=2),
    ).map(list)
    segment = st.tuples(text, text, name, name, st.booleans(), st.lists(span, max_size=4)).map(list)
    log = st.tuples(
        i64,
        name,
        name,
        name,
        st.sampled_from(["text", "json", "yaml"]),
        st.text(),
        text,
        text,
        st.one_of(st.just(-1), small, i32),
        flat(),
        name,
    ).map(list)
    bucket = st.tuples(num, i64, st.booleans()).map(list)
    single = st.tuples(st.just(1), name, flat(3), num).map(list)
    histogram = st.tuples(st.just(2), name, flat(3), st.lists(bucket, max_size=4)).map(list)
    meter = st.tuples(i64, name, name, st.lists(st.one_of(single, histogram), max_size=4)).map(list)
    snapshot = st.tuples(name, text, i64, st.one_of(small, i32), st.lists(name, max_size=5)).map(list)
    finish = st.tuples(name, name, name).map(list)
    return SimpleNamespace(
        text=text,
        name=name,
        i32=i32,
        i64=i64,
        flat=flat,
        segment=segment,
        log=log,
        meter=meter,
        snapshot=snapshot,
        finish=finish,
        properties=st.lists(st.tuples(name, name), max_size=6),
    )
