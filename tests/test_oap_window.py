"""The time windows swmp asks an OAP about (``swmp.traceview.oap.duration``).

An OAP on JDBC storage keeps one table per day and answers a window reaching a day it has
no table for with nothing; an OAP started today (the tests' OAP, a fresh install) has no
table for yesterday. ``within_day`` keeps the window inside the current UTC day, and
``swmp traces --oap`` falls back to it when the whole window came back empty.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from swmp.traceview import sources
from swmp.traceview.oap import BasicTrace, OapGraphQL, duration

UTC = dt.timezone.utc


def at(hour: int, minute: int, second: int = 0) -> dt.datetime:
    return dt.datetime(2026, 11, 30, hour, minute, second, tzinfo=UTC)


def test_window_after_midnight_reaches_yesterday_unless_kept_within_day() -> None:
    assert duration(15, now=at(0, 5)) == {
        "start": "2026-11-29 2350",
        "end": "2026-11-30 0006",
        "step": "MINUTE",
    }
    assert duration(15, now=at(0, 5), within_day=True) == {
        "start": "2026-11-30 0000",
        "end": "2026-11-30 0006",
        "step": "MINUTE",
    }


def test_window_before_midnight_ends_today_when_kept_within_day() -> None:
    assert duration(15, now=at(23, 59, 30))["end"] == "2026-12-01 0000"
    assert duration(15, now=at(23, 59, 30), within_day=True)["end"] == "2026-11-30 2359"


def test_window_inside_the_day_is_the_same_either_way() -> None:
    for step in ("SECOND", "MINUTE", "HOUR", "DAY"):
        assert duration(30, step, now=at(12, 0)) == duration(30, step, now=at(12, 0), within_day=True)


def test_client_windows_follow_its_setting() -> None:
    assert OapGraphQL("http://127.0.0.1:1/graphql", within_day=True).within_day
    assert not OapGraphQL("http://127.0.0.1:1/graphql").within_day


def _row(segment: str) -> BasicTrace:
    return BasicTrace(segment, (segment,), ("/x",), 3, 1_700_000_000_000, False)


def test_traces_command_asks_again_for_today_when_a_window_reaching_yesterday_is_empty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[bool] = []

    def traces(self: OapGraphQL, *args: Any, **kwargs: Any) -> list[BasicTrace]:
        asked.append(self.within_day)
        return [_row("today")] if self.within_day else []  # what a fresh JDBC OAP does

    monkeypatch.setattr(OapGraphQL, "traces", traces)
    rows = sources.OapSource("127.0.0.1:1").recent(sources.Filters(minutes=25 * 60))
    assert [r.trace_id for r in rows] == ["today"]
    assert asked == [False, True]


def test_traces_command_asks_once_when_the_window_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[bool] = []

    def traces(self: OapGraphQL, *args: Any, **kwargs: Any) -> list[BasicTrace]:
        asked.append(self.within_day)
        return [_row("all")]

    monkeypatch.setattr(OapGraphQL, "traces", traces)
    rows = sources.OapSource("127.0.0.1:1").recent(sources.Filters(minutes=25 * 60))
    assert [r.trace_id for r in rows] == ["all"]
    assert asked == [False]
