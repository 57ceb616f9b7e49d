"""The record format between application workers and the reporter: the one contract.

This is the one module both sides import: the in-application agent (``swmp``) builds
records and writes them into its ring; the reporter (``reporter_proc``) reads them back and
turns them into SkyWalking protocol messages. The module imports nothing but the standard
library and orjson, so a worker pays nothing for it.

Every record is a ring entry with a 16-bit *type* (below) and a payload. Payloads are orjson
arrays with a fixed field order ("positional records"). Positional lists cost a third of a
keyed dict to serialize (see docs/performance.md) and map one-to-one onto protobuf field
numbers, which keeps the reporter's encoder a straight walk over the list.

Layouts (``str`` unless said otherwise; ``[k, v, k, v]`` is a flat key/value list):

``SEGMENT``::

    [trace_id, segment_id, service, instance, is_size_limited(bool), spans]
    span = [span_id(int), parent_span_id(int), start_ms(int), end_ms(int), operation_name,
            peer, span_type(int), span_layer(int), component_id(int), is_error(bool),
            skip_analysis(bool), tags[k, v, ...], logs, refs]
    log  = [time_ms(int), [k, v, ...]]
    ref  = [ref_type(int), trace_id, parent_segment_id, parent_span_id(int), parent_service,
            parent_instance, parent_endpoint, network_address_used_at_peer]

``LOG``::

    [timestamp_ms(int), service, instance, endpoint, body_kind("text"|"json"|"yaml"), body,
     trace_id, segment_id, span_id(int, -1 = none), tags[k, v, ...], layer]

``METER``: one report period of one instance::

    [timestamp_ms(int), service, instance, meters]
    meter = [METER_SINGLE, name, labels[n, v, ...], value(float)]
          | [METER_HISTOGRAM, name, labels[n, v, ...], [[bucket(float), count(int), is_neg_inf(bool)], ...]]

``PROFILE_SNAPSHOT``: ``[task_id, segment_id, time_ms(int), sequence(int), [code_signature, ...]]``

``PROFILE_FINISH``: ``[service, instance, task_id]``

``WORKER_START``: a worker claimed a slot (written once, first thing after the claim)::

    [pid(int), slot(int), service, instance, properties[k, v, ...], layer, namespace]

``WORKER_STOP``: a worker is leaving cleanly: ``[pid(int), slot(int)]``

Everything about a record type lives here and nowhere else: :data:`KINDS` is the one table
of types (number, name, the sender capability it needs, the shortest valid layout, the
sender method that ships a batch of it); the ``*_``-prefixed constants name every field
position; the ``build_*`` functions are the only places that order fields, used by the
workers and by the tests alike. Other modules index records through these names only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

# Record types. 0 is never used (a zeroed ring must not look like data); the ring reserves
# 0xFFFF for its own padding records.
SEGMENT: Final = 1
LOG: Final = 2
METER: Final = 3
PROFILE_SNAPSHOT: Final = 4
PROFILE_FINISH: Final = 5
WORKER_START: Final = 10
WORKER_STOP: Final = 11


@dataclass(frozen=True)
class Kind:
    """One record type: what it is called, what carries it, what it must look like.

    ``capability`` is the ``Sender.supports`` entry it needs ("" for the reporter's own
    control records); ``send`` names the ``Sender`` coroutine that ships a batch of it
    ("" for control records, which are never batched).
    """

    rtype: int
    name: str
    capability: str
    min_len: int
    send: str

    @property
    def data(self) -> bool:
        """Telemetry to batch and ship (as opposed to a worker's control record)."""
        return bool(self.send)


KINDS: Final[tuple[Kind, ...]] = (
    Kind(SEGMENT, "segment", "segment", 6, "send_segments"),
    Kind(LOG, "log", "log", 11, "send_logs"),
    Kind(METER, "meter", "meter", 4, "send_meters"),
    Kind(PROFILE_SNAPSHOT, "profile_snapshot", "profile", 5, "send_snapshots"),
    Kind(PROFILE_FINISH, "profile_finish", "profile", 3, "send_finishes"),
    Kind(WORKER_START, "worker_start", "", 7, ""),
    Kind(WORKER_STOP, "worker_stop", "", 2, ""),
)
BY_TYPE: Final[dict[int, Kind]] = {k.rtype: k for k in KINDS}
BY_NAME: Final[dict[str, Kind]] = {k.name: k for k in KINDS}
DATA_KINDS: Final[tuple[Kind, ...]] = tuple(k for k in KINDS if k.data)
NAMES: Final[dict[int, str]] = {k.rtype: k.name for k in KINDS}
# Every capability a sender may declare: the data ones plus instance management.
CAPABILITIES: Final = frozenset({k.capability for k in DATA_KINDS} | {"management"})

# Segment field positions.
SEG_TRACE_ID: Final = 0
SEG_SEGMENT_ID: Final = 1
SEG_SERVICE: Final = 2
SEG_INSTANCE: Final = 3
SEG_SIZE_LIMITED: Final = 4
SEG_SPANS: Final = 5

# Span field positions.
SPAN_ID: Final = 0
SPAN_PARENT_ID: Final = 1
SPAN_START: Final = 2
SPAN_END: Final = 3
SPAN_OPERATION: Final = 4
SPAN_PEER: Final = 5
SPAN_TYPE: Final = 6
SPAN_LAYER: Final = 7
SPAN_COMPONENT: Final = 8
SPAN_IS_ERROR: Final = 9
SPAN_SKIP_ANALYSIS: Final = 10
SPAN_TAGS: Final = 11
SPAN_LOGS: Final = 12
SPAN_REFS: Final = 13

# LOG field positions.
LOG_TIME: Final = 0
LOG_SERVICE: Final = 1
LOG_INSTANCE: Final = 2
LOG_ENDPOINT: Final = 3
LOG_BODY_KIND: Final = 4
LOG_BODY: Final = 5
LOG_TRACE_ID: Final = 6
LOG_SEGMENT_ID: Final = 7
LOG_SPAN_ID: Final = 8
LOG_TAGS: Final = 9
LOG_LAYER: Final = 10

# METER field positions (the report), and of one meter in it.
METER_TIME: Final = 0
METER_SERVICE: Final = 1
METER_INSTANCE: Final = 2
METER_LIST: Final = 3
METER_KIND: Final = 0
METER_NAME: Final = 1
METER_LABELS: Final = 2
METER_VALUE: Final = 3

# PROFILE_SNAPSHOT / PROFILE_FINISH field positions.
SNAP_TASK_ID: Final = 0
SNAP_SEGMENT_ID: Final = 1
SNAP_TIME: Final = 2
SNAP_SEQUENCE: Final = 3
SNAP_STACK: Final = 4
FINISH_SERVICE: Final = 0
FINISH_INSTANCE: Final = 1
FINISH_TASK_ID: Final = 2

# WORKER_START / WORKER_STOP field positions.
WS_PID: Final = 0
WS_SLOT: Final = 1
WS_SERVICE: Final = 2
WS_INSTANCE: Final = 3
WS_PROPERTIES: Final = 4
WS_LAYER: Final = 5
WS_NAMESPACE: Final = 6

# Where the instance name sits in each record type whose payload carries one.
INSTANCE_FIELD: Final[dict[int, int]] = {SEGMENT: SEG_INSTANCE, LOG: LOG_INSTANCE, METER: METER_INSTANCE}
# The field that keys a record (Kafka message key: records of one key stay in order).
KEY_FIELD: Final[dict[int, int]] = {SEGMENT: SEG_SEGMENT_ID, LOG: LOG_SEGMENT_ID, METER: METER_INSTANCE}

# Protocol enums (skywalking.v3), mirrored here so a worker never imports protobuf.
SPAN_TYPE_ENTRY: Final = 0
SPAN_TYPE_EXIT: Final = 1
SPAN_TYPE_LOCAL: Final = 2

LAYER_UNKNOWN: Final = 0
LAYER_DATABASE: Final = 1
LAYER_RPC_FRAMEWORK: Final = 2
LAYER_HTTP: Final = 3
LAYER_MQ: Final = 4
LAYER_CACHE: Final = 5
LAYER_FAAS: Final = 6

REF_CROSS_PROCESS: Final = 0
REF_CROSS_THREAD: Final = 1

METER_SINGLE: Final = 1
METER_HISTOGRAM: Final = 2

LOG_BODY_KINDS: Final = ("text", "json", "yaml")


# -- builders: the only code that puts fields in order ---------------------------------------
def flat_pairs(pairs: dict[str, str] | list[tuple[str, str]]) -> list[str]:
    """``{k: v}`` or ``[(k, v)]`` as the flat ``[k, v, k, v]`` list every layout uses."""
    items = pairs.items() if isinstance(pairs, dict) else pairs
    out: list[str] = []
    for k, v in items:
        out += (k, v)
    return out


def worker_start(
    pid: int,
    slot: int,
    *,
    service: str,
    instance: str,
    properties: dict[str, str] | list[tuple[str, str]],
    layer: str = "",
    namespace: str = "",
) -> list[Any]:
    return [pid, slot, service, instance, flat_pairs(properties), layer, namespace]


def worker_stop(pid: int, slot: int) -> list[Any]:
    return [pid, slot]


def segment(
    trace_id: str,
    segment_id: str,
    *,
    service: str,
    instance: str,
    spans: list[Any],
    size_limited: bool = False,
) -> list[Any]:
    return [trace_id, segment_id, service, instance, size_limited, spans]


def span(
    span_id: int,
    parent_id: int,
    start_ms: int,
    end_ms: int,
    operation: str,
    *,
    peer: str = "",
    span_type: int = SPAN_TYPE_LOCAL,
    layer: int = LAYER_UNKNOWN,
    component: int = 0,
    is_error: bool = False,
    skip_analysis: bool = False,
    tags: list[str] | None = None,
    logs: list[Any] | None = None,
    refs: list[Any] | None = None,
) -> list[Any]:
    return [
        span_id,
        parent_id,
        start_ms,
        end_ms,
        operation,
        peer,
        span_type,
        layer,
        component,
        is_error,
        skip_analysis,
        tags or [],
        logs or [],
        refs or [],
    ]


def log(
    time_ms: int,
    service: str,
    instance: str,
    body: str,
    *,
    endpoint: str = "",
    body_kind: str = "text",
    trace_id: str = "",
    segment_id: str = "",
    span_id: int = -1,
    tags: list[str] | None = None,
    layer: str = "",
) -> list[Any]:
    return [
        time_ms,
        service,
        instance,
        endpoint,
        body_kind,
        body,
        trace_id,
        segment_id,
        span_id,
        tags or [],
        layer,
    ]


def meter_report(time_ms: int, service: str, instance: str, meters: list[Any]) -> list[Any]:
    return [time_ms, service, instance, meters]


def single_meter(name: str, labels: list[str], value: float) -> list[Any]:
    return [METER_SINGLE, name, labels, value]


def histogram_meter(name: str, labels: list[str], buckets: list[list[Any]]) -> list[Any]:
    return [METER_HISTOGRAM, name, labels, buckets]


def profile_snapshot(
    task_id: str, segment_id: str, *, time_ms: int, sequence: int, stack: list[str]
) -> list[Any]:
    return [task_id, segment_id, time_ms, sequence, stack]


def profile_finish(service: str, instance: str, task_id: str) -> list[Any]:
    return [service, instance, task_id]


def encode(record: list[Any]) -> bytes:
    """A record as its ring payload."""
    return orjson.dumps(record)


def restamp_instance(rtype: int, payload: bytes, instance: str) -> bytes:
    """``payload`` with its instance field replaced (a record built before a fork noticed late)."""
    index = INSTANCE_FIELD.get(rtype)
    if index is None:
        return payload
    rec: list[Any] = orjson.loads(payload)
    rec[index] = instance
    return orjson.dumps(rec)
