"""The record format between application workers and the reporter.

This is the one contract both sides import: the in-application agent (``swmp``) builds
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
"""

from __future__ import annotations

from typing import Final

# Record types. 0 is never used (a zeroed ring must not look like data); the ring reserves
# 0xFFFF for its own padding records.
SEGMENT: Final = 1
LOG: Final = 2
METER: Final = 3
PROFILE_SNAPSHOT: Final = 4
PROFILE_FINISH: Final = 5
WORKER_START: Final = 10
WORKER_STOP: Final = 11

NAMES: Final[dict[int, str]] = {
    SEGMENT: "segment",
    LOG: "log",
    METER: "meter",
    PROFILE_SNAPSHOT: "profile_snapshot",
    PROFILE_FINISH: "profile_finish",
    WORKER_START: "worker_start",
    WORKER_STOP: "worker_stop",
}

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
