"""Read data back from a SkyWalking OAP (10.x) through its GraphQL query API.

``swmp traces --oap`` and the end-to-end tests read what a backend stored: services,
instances, traces and their spans, logs, meter values. These helpers wrap the handful of
GraphQL queries for that, with plain urllib (no client library) and small dataclasses as
results.

Time ranges: the OAP reads ``Duration`` strings ("yyyy-MM-dd HHmm") in its own time zone.
Durations here are built in UTC (the test launchers run the OAP with TZ=UTC); a caller that
does not know the OAP's zone widens the window with ``ahead_minutes`` (``swmp traces`` does).
An OAP on JDBC storage (H2, MySQL, PostgreSQL) keeps one table per day and answers a window
that reaches a day it has no table for with nothing at all, not with the days it has: a
client of an OAP started today (the tests' OAP) sets ``within_day`` to keep every window
inside the current UTC day.

Data shows up asynchronously (traces after ~1-2 s, metrics after the persistence period),
so tests combine a query with :func:`wait_for`, which polls until a predicate holds.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
MAX_ANSWER = 64 * 2**20  # bytes of one answer read at most: a server cannot fill our memory


class GraphQLError(RuntimeError):
    """The OAP answered, but with GraphQL errors (bad query, unknown field, ...)."""


@dataclass(frozen=True)
class Service:
    id: str
    name: str
    layers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Instance:
    id: str
    name: str
    language: str
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BasicTrace:
    segment_id: str
    trace_ids: tuple[str, ...]
    endpoint_names: tuple[str, ...]
    duration: int
    start: int
    is_error: bool


@dataclass(frozen=True)
class Ref:
    trace_id: str
    parent_segment_id: str
    parent_span_id: int
    type: str  # CROSS_PROCESS | CROSS_THREAD


@dataclass(frozen=True)
class SpanLog:
    time: int
    data: dict[str, str]


@dataclass(frozen=True)
class Span:
    trace_id: str
    segment_id: str
    span_id: int
    parent_span_id: int
    refs: tuple[Ref, ...]
    service_code: str
    service_instance_name: str
    start_time: int
    end_time: int
    operation_name: str  # GraphQL calls it endpointName
    type: str  # Entry | Exit | Local
    peer: str
    component: str  # the component's NAME from component-libraries.yml, "N/A" if unknown
    is_error: bool
    layer: str  # Unknown | Database | RPCFramework | Http | MQ | Cache | FAAS
    tags: dict[str, str]  # a repeated key keeps its last value; see tag_list for all
    tag_list: tuple[tuple[str, str], ...]
    logs: tuple[SpanLog, ...]


@dataclass(frozen=True)
class LogRecord:
    service_name: str
    service_instance_name: str
    endpoint_name: str
    trace_id: str
    timestamp: int
    content_type: str  # TEXT | JSON | YAML
    content: str
    tags: dict[str, str]


@dataclass(frozen=True)
class MqeResult:
    type: str  # SINGLE_VALUE | TIME_SERIES_VALUES | SORTED_LIST | RECORD_LIST | UNKNOWN
    error: str | None
    # One series per label set: (labels, [(bucket id, value or None), ...]).
    series: tuple[tuple[dict[str, str], tuple[tuple[str, float | None], ...]], ...]

    def values(self) -> list[float]:
        """Every non-empty value across all series, in time order."""
        return [v for _, points in self.series for _, v in points if v is not None]


def duration(
    minutes: float = 15,
    step: str = "MINUTE",
    ahead_minutes: float = 1,
    *,
    within_day: bool = False,
    now: _dt.datetime | None = None,
) -> dict[str, str]:
    """A GraphQL ``Duration`` covering the last ``minutes`` (UTC, see module doc).

    ``within_day`` clips the window to the current UTC day (see module doc).
    """
    now = now or _dt.datetime.now(_dt.timezone.utc)
    fmt = {"SECOND": "%Y-%m-%d %H%M%S", "MINUTE": "%Y-%m-%d %H%M", "HOUR": "%Y-%m-%d %H", "DAY": "%Y-%m-%d"}[
        step
    ]
    start = now - _dt.timedelta(minutes=minutes)
    end = now + _dt.timedelta(minutes=ahead_minutes)
    if within_day:
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
        start = max(start, midnight)
        end = min(end, midnight + _dt.timedelta(days=1, microseconds=-1))
    return {"start": start.strftime(fmt), "end": end.strftime(fmt), "step": step}


def entity(
    service: str, instance: str | None = None, endpoint: str | None = None, *, normal: bool = True
) -> dict[str, Any]:
    """An MQE ``Entity``: a service, one of its instances, or one of its endpoints."""
    ent: dict[str, Any] = {"serviceName": service, "normal": normal}
    if instance is not None:
        ent.update(scope="ServiceInstance", serviceInstanceName=instance)
    elif endpoint is not None:
        ent.update(scope="Endpoint", endpointName=endpoint)
    else:
        ent["scope"] = "Service"
    return ent


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float = 60.0,
    interval: float = 0.5,
    what: str = "condition",
) -> T:
    """Call ``predicate`` until it returns something truthy and return that value.

    Exceptions from the predicate (the backend still starting, a row not there yet) count
    as "not yet". After ``timeout`` seconds an AssertionError names ``what`` and the last
    value or exception, so a failing e2e test says what it was waiting for.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            result = predicate()
            if result:
                return result
            last = result
        except Exception as exc:  # keep polling; report the last failure on timeout
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


def _kv(items: list[dict[str, Any]] | None) -> dict[str, str]:
    return {kv["key"]: kv.get("value") or "" for kv in items or ()}


class OapGraphQL:
    """Typed queries against one OAP's ``/graphql`` endpoint."""

    def __init__(self, url: str, timeout: float = 10.0, *, within_day: bool = False) -> None:
        self.url = url
        self.timeout = timeout
        self.within_day = within_day  # keep every window inside today (see module doc)

    def duration(self, minutes: float = 15, ahead_minutes: float = 1) -> dict[str, str]:
        """The window of the last ``minutes`` as this OAP can answer it."""
        return duration(minutes, ahead_minutes=ahead_minutes, within_day=self.within_day)

    def gql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run one query and return its ``data``; raise GraphQLError on GraphQL errors."""
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                body = resp.read(MAX_ANSWER + 1)
            if len(body) > MAX_ANSWER:
                raise GraphQLError(f"answer from {self.url} larger than {MAX_ANSWER} bytes")
            answer = json.loads(body)
        except urllib.error.HTTPError as exc:
            raise GraphQLError(f"HTTP {exc.code} from {self.url}: {exc.read()[:500]!r}") from exc
        if answer.get("errors"):
            raise GraphQLError(json.dumps(answer["errors"])[:1000])
        data: dict[str, Any] = answer.get("data") or {}
        return data

    # ------------------------------------------------------------------ metadata
    def services(self, layer: str = "GENERAL") -> list[Service]:
        data = self.gql("query($l:String){ listServices(layer:$l){ id name layers } }", {"l": layer})
        return [Service(s["id"], s["name"], tuple(s.get("layers") or ())) for s in data["listServices"]]

    def service_id(self, name: str, layer: str = "GENERAL") -> str | None:
        """The id of the service called ``name``, or None while the OAP has not seen it."""
        return next((s.id for s in self.services(layer) if s.name == name), None)

    def instances(self, service_id: str, minutes: float = 15) -> list[Instance]:
        data = self.gql(
            "query($s:ID!,$d:Duration!){ listInstances(serviceId:$s, duration:$d)"
            "{ id name language attributes{ name value } } }",
            {"s": service_id, "d": self.duration(minutes)},
        )
        return [
            Instance(i["id"], i["name"], i["language"], {a["name"]: a["value"] for a in i["attributes"]})
            for i in data["listInstances"]
        ]

    def endpoints(self, service_id: str, keyword: str = "", limit: int = 100) -> list[str]:
        data = self.gql(
            "query($s:ID!,$k:String,$n:Int!){ findEndpoint(serviceId:$s, keyword:$k, limit:$n){ name } }",
            {"s": service_id, "k": keyword, "n": limit},
        )
        return [e["name"] for e in data["findEndpoint"]]

    # ------------------------------------------------------------------ traces
    def traces(
        self,
        service_id: str | None = None,
        minutes: float = 15,
        *,
        state: str = "ALL",
        trace_id: str | None = None,
        page_size: int = 50,
        ahead_minutes: float = 1,
    ) -> list[BasicTrace]:
        """Segments (newest first) of one service, or of all services when None."""
        cond: dict[str, Any] = {
            "queryDuration": self.duration(minutes, ahead_minutes),
            "traceState": state,
            "queryOrder": "BY_START_TIME",
            "paging": {"pageNum": 1, "pageSize": page_size},
        }
        if service_id is not None:
            cond["serviceId"] = service_id
        if trace_id is not None:
            cond["traceId"] = trace_id
        data = self.gql(
            "query($c:TraceQueryCondition){ queryBasicTraces(condition:$c)"
            "{ traces{ segmentId traceIds endpointNames duration start isError } } }",
            {"c": cond},
        )
        return [
            BasicTrace(
                t["segmentId"],
                tuple(t["traceIds"]),
                tuple(t["endpointNames"]),
                int(t["duration"]),
                int(t["start"]),
                bool(t["isError"]),
            )
            for t in data["queryBasicTraces"]["traces"]
        ]

    def trace(self, trace_id: str) -> list[Span]:
        """Every stored span of one trace, across all its segments."""
        data = self.gql(
            "query($t:ID!){ queryTrace(traceId:$t){ spans{ traceId segmentId spanId parentSpanId"
            " refs{ traceId parentSegmentId parentSpanId type } serviceCode serviceInstanceName"
            " startTime endTime endpointName type peer component isError layer"
            " tags{ key value } logs{ time data{ key value } } } } }",
            {"t": trace_id},
        )
        spans = []
        for s in (data.get("queryTrace") or {}).get("spans") or ():
            tag_list = tuple((kv["key"], kv.get("value") or "") for kv in s["tags"])
            spans.append(
                Span(
                    trace_id=s["traceId"],
                    segment_id=s["segmentId"],
                    span_id=int(s["spanId"]),
                    parent_span_id=int(s["parentSpanId"]),
                    refs=tuple(
                        Ref(r["traceId"], r["parentSegmentId"], int(r["parentSpanId"]), r["type"])
                        for r in s["refs"]
                    ),
                    service_code=s["serviceCode"],
                    service_instance_name=s["serviceInstanceName"],
                    start_time=int(s["startTime"]),
                    end_time=int(s["endTime"]),
                    operation_name=s["endpointName"] or "",
                    type=s["type"],
                    peer=s["peer"] or "",
                    component=s["component"] or "",
                    is_error=bool(s["isError"]),
                    layer=s["layer"] or "",
                    tags=dict(tag_list),
                    tag_list=tag_list,
                    logs=tuple(SpanLog(int(lg["time"]), _kv(lg["data"])) for lg in s["logs"] or ()),
                )
            )
        return spans

    # ------------------------------------------------------------------ logs
    def logs(
        self,
        service_id: str | None = None,
        minutes: float = 15,
        *,
        trace_id: str | None = None,
        keyword: str | None = None,
        page_size: int = 100,
    ) -> list[LogRecord]:
        cond: dict[str, Any] = {
            "queryDuration": self.duration(minutes),
            "paging": {"pageNum": 1, "pageSize": page_size},
        }
        if service_id is not None:
            cond["serviceId"] = service_id
        if trace_id is not None:
            cond["relatedTrace"] = {"traceId": trace_id}
        if keyword is not None:
            # Keyword search needs a full-text capable storage; H2 does not support it.
            cond["keywordsOfContent"] = [keyword]
        data = self.gql(
            "query($c:LogQueryCondition){ queryLogs(condition:$c){ logs{ serviceName serviceInstanceName"
            " endpointName traceId timestamp contentType content tags{ key value } } } }",
            {"c": cond},
        )
        return [
            LogRecord(
                service_name=lg["serviceName"] or "",
                service_instance_name=lg["serviceInstanceName"] or "",
                endpoint_name=lg["endpointName"] or "",
                trace_id=lg["traceId"] or "",
                timestamp=int(lg["timestamp"]),
                content_type=lg["contentType"],
                content=lg["content"] or "",
                tags=_kv(lg["tags"]),
            )
            for lg in data["queryLogs"]["logs"]
        ]

    # ------------------------------------------------------------------ metrics
    def mqe(self, expression: str, entity: dict[str, Any], minutes: float = 15) -> MqeResult:
        """Evaluate an MQE expression (e.g. ``meter_swmp_test_gauge``) for one entity.

        Build ``entity`` with :func:`entity`. An expression the OAP cannot evaluate comes
        back with ``error`` set rather than raising, as the OAP reports it that way.
        """
        data = self.gql(
            "query($e:String!,$en:Entity!,$d:Duration!)"
            "{ execExpression(expression:$e, entity:$en, duration:$d)"
            "{ type error results{ metric{ labels{ key value } } values{ id value } } } }",
            {"e": expression, "en": entity, "d": self.duration(minutes)},
        )
        res = data["execExpression"]
        series = tuple(
            (
                _kv(r["metric"]["labels"]),
                tuple(
                    (v["id"] or "", None if v["value"] in (None, "") else float(v["value"]))
                    for v in r["values"]
                ),
            )
            for r in res["results"] or ()
        )
        return MqeResult(res["type"], res.get("error"), series)
