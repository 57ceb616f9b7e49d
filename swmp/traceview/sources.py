"""Where ``swmp traces`` reads from: the local collector's JSON API, or an OAP's GraphQL."""

from __future__ import annotations

import datetime as _dt
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol

from swmp.traceview.model import TraceSummary, TreeSpan, spans_from_segments
from swmp.traceview.oap import MAX_ANSWER, OapGraphQL

DEFAULT_COLLECTOR = "http://127.0.0.1:12800"


def read_json(resp: Any, limit: int = MAX_ANSWER) -> Any:
    """The JSON document of an HTTP answer of at most ``limit`` bytes (ValueError otherwise,
    also for JSON nested too deeply to parse)."""
    body = resp.read(limit + 1)
    if len(body) > limit:
        raise ValueError(f"answer larger than {limit} bytes")
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError("answer nested too deeply") from None


class SourceError(RuntimeError):
    """The source could not be reached or answered something unexpected."""


@dataclass(frozen=True)
class Filters:
    service: str = ""
    endpoint: str = ""
    errors_only: bool = False
    min_duration_ms: int = 0
    limit: int = 20
    minutes: float = 30  # OAP only: how far back to look


class Source(Protocol):
    def recent(self, f: Filters) -> list[TraceSummary]: ...

    def trace(self, trace_id: str) -> list[TreeSpan]: ...


class CollectorSource:
    """``swmp collector``'s ``/api/traces`` and ``/api/trace/<id>``."""

    def __init__(self, url: str = DEFAULT_COLLECTOR, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(self.url + path, timeout=self.timeout) as resp:
                return read_json(resp)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise SourceError(f"{self.url}{path}: HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise SourceError(f"cannot read {self.url}{path}: {exc} (is `swmp collector` running?)") from None

    def recent(self, f: Filters) -> list[TraceSummary]:
        query = {"limit": str(f.limit)}
        if f.service:
            query["service"] = f.service
        if f.endpoint:
            query["endpoint"] = f.endpoint
        if f.errors_only:
            query["errors"] = "1"
        if f.min_duration_ms:
            query["min_ms"] = str(f.min_duration_ms)
        rows = self._get("/api/traces?" + urllib.parse.urlencode(query)) or []
        return [
            TraceSummary(
                r["trace_id"],
                r["start"],
                r["duration_ms"],
                r["endpoint"],
                r["is_error"],
                tuple(r["services"]),
            )
            for r in rows
        ]

    def trace(self, trace_id: str) -> list[TreeSpan]:
        doc = self._get("/api/trace/" + urllib.parse.quote(trace_id, safe=""))
        return spans_from_segments(doc["segments"]) if doc else []


def _reaches_yesterday(minutes: float) -> bool:
    now = _dt.datetime.now(_dt.timezone.utc)
    return (now - _dt.timedelta(minutes=minutes)).date() < now.date()


class OapSource:
    """A SkyWalking OAP's GraphQL API (``http://host:12800``; ``/graphql`` is added)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        url = url.rstrip("/")
        if "://" not in url:
            url = "http://" + url
        self.client = OapGraphQL(url if url.endswith("/graphql") else url + "/graphql", timeout)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (OSError, ValueError, RuntimeError) as exc:
            raise SourceError(f"OAP {self.client.url}: {exc}") from None

    def recent(self, f: Filters) -> list[TraceSummary]:
        service_id = None
        if f.service:
            service_id = self._call(self.client.service_id, f.service)
            if service_id is None:
                return []
        # The OAP reads the window in its own time zone, which we do not know: look a day ahead.
        query = {
            "state": "ERROR" if f.errors_only else "ALL",
            "page_size": max(f.limit * 3, 30),
            "ahead_minutes": 24 * 60,
        }
        rows = self._call(self.client.traces, service_id, f.minutes, **query)
        if not rows and _reaches_yesterday(f.minutes):
            # An OAP on JDBC storage started today has no table for yesterday and answers a
            # window reaching it with nothing: ask again for today's part of the window.
            today = OapGraphQL(self.client.url, self.client.timeout, within_day=True)
            rows = self._call(today.traces, service_id, f.minutes, **query)
        out: list[TraceSummary] = []
        seen: set[str] = set()
        for r in rows:  # one row per segment: keep the first (newest) per trace
            trace_id = r.trace_ids[0] if r.trace_ids else r.segment_id
            endpoint = r.endpoint_names[0] if r.endpoint_names else ""
            if (
                trace_id in seen
                or (f.endpoint and f.endpoint not in endpoint)
                or r.duration < f.min_duration_ms
            ):
                continue
            seen.add(trace_id)
            out.append(TraceSummary(trace_id, r.start, r.duration, endpoint, r.is_error, ()))
        return out[: f.limit]

    def trace(self, trace_id: str) -> list[TreeSpan]:
        spans = self._call(self.client.trace, trace_id)
        return [
            TreeSpan(
                segment_id=s.segment_id,
                span_id=s.span_id,
                parent_span_id=s.parent_span_id,
                parent_ref=(s.refs[0].parent_segment_id, s.refs[0].parent_span_id) if s.refs else None,
                service=s.service_code,
                instance=s.service_instance_name,
                start=s.start_time,
                end=s.end_time,
                operation=s.operation_name,
                type=s.type,
                peer=s.peer,
                component=s.component,
                is_error=s.is_error,
                tags=list(s.tag_list),
            )
            for s in spans
        ]
