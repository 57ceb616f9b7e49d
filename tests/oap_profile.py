"""GraphQL for the OAP's trace profiling (query protocol of OAP 10.1): create a task, list
its logs and profiled segments, analyse snapshots into stack trees."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.oap_graphql import OapGraphQL


@dataclass(frozen=True)
class ProfiledSegment:
    segment_id: str
    trace_id: str
    instance_name: str
    start_ms: int  # the segment's first span
    end_ms: int


def create_task(
    q: OapGraphQL,
    service_id: str,
    endpoint: str,
    *,
    duration_min: int = 1,
    min_duration_ms: int = 0,
    dump_period_ms: int = 10,
    max_sampling_count: int = 5,
) -> str:
    """A task starting now; returns its id (raises AssertionError with the OAP's reason)."""
    data = q.gql(
        "mutation($r: ProfileTaskCreationRequest){"
        " createProfileTask(creationRequest: $r){ id errorReason } }",
        {
            "r": {
                "serviceId": service_id,
                "endpointName": endpoint,
                "duration": duration_min,
                "minDurationThreshold": min_duration_ms,
                "dumpPeriod": dump_period_ms,
                "maxSamplingCount": max_sampling_count,
            }
        },
    )
    result = data["createProfileTask"]
    assert not result.get("errorReason") and result.get("id"), result
    return str(result["id"])


def task_logs(q: OapGraphQL, task_id: str) -> list[tuple[str, str]]:
    """``(instance name, operation type)`` of every log of the task."""
    data = q.gql(
        "query($t: String){ getProfileTaskLogs(taskID: $t){ instanceName operationType } }", {"t": task_id}
    )
    return [(x["instanceName"], x["operationType"]) for x in data["getProfileTaskLogs"]]


def profiled_segments(q: OapGraphQL, task_id: str) -> list[ProfiledSegment]:
    data = q.gql(
        "query($t: ID!){ getProfileTaskSegments(taskID: $t){ traceId instanceName "
        "spans { spanId parentSpanId segmentId startTime endTime } } }",
        {"t": task_id},
    )
    out = []
    for trace in data["getProfileTaskSegments"]:
        for span in trace["spans"]:
            if span["spanId"] == 0:
                out.append(
                    ProfiledSegment(
                        span["segmentId"],
                        trace["traceId"],
                        trace["instanceName"],
                        int(span["startTime"]),
                        int(span["endTime"]),
                    )
                )
    return out


def analyze(q: OapGraphQL, segment_id: str, start_ms: int, end_ms: int) -> list[list[dict[str, Any]]]:
    """The stack trees of one segment's snapshots dumped in [start_ms, end_ms]: a list of
    trees, each a list of elements (id, parentId, codeSignature, duration, count)."""
    data = q.gql(
        "query($q: [SegmentProfileAnalyzeQuery!]!){ getSegmentsProfileAnalyze(queries: $q){ tip "
        "trees { elements { id parentId codeSignature duration durationChildExcluded count } } } }",
        {"q": [{"segmentId": segment_id, "timeRange": {"start": start_ms, "end": end_ms}}]},
    )
    return [t["elements"] for t in data["getSegmentsProfileAnalyze"]["trees"] or []]


def snapshot_count(trees: list[list[dict[str, Any]]]) -> int:
    """Snapshots an analysis covers: the counts of its root frames (every snapshot has one)."""
    total = 0
    for elements in trees:
        ids = {e["id"] for e in elements}
        total += sum(int(e["count"]) for e in elements if e["parentId"] not in ids)
    return total
