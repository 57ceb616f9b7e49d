"""Capturing the spans the data-store instrumentations record, for the tests against the real
servers of ``tests/daemons.py``. No mocks: the drivers talk to real PostgreSQL, MariaDB,
Redis and memcached; the spans are read back from the in-memory sink the agent writes to.

    def test_x(traced: Traced, postgres_server: ServerInfo) -> None:
        with traced.trace() as got:
            ...  # driver calls
        (span,) = got.exits
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from reporter_proc import records as R
from swmp import _sink, instrument, tracing
from swmp.config import load
from swmp.tracing import Kind, Layer
from swmp.tracing.context import new_local_span

PARAMS_MAX = 40  # SW_PLUGIN_SQL_PARAMETERS_MAX_LENGTH used by these tests


@dataclass
class Exit:
    op: str
    peer: str
    component: int
    layer: int
    error: bool
    tags: dict[str, str]
    logs: list[dict[str, str]]
    parent_id: int


@dataclass
class Got:
    exits: list[Exit] = field(default_factory=list)
    segments: int = 0


def _tags(raw: Any) -> dict[str, str]:
    if not raw:
        return {}
    if isinstance(raw[0], list):
        return {k: v for k, v in raw}
    return dict(zip(raw[::2], raw[1::2], strict=True))


def _logs(raw: Any) -> list[dict[str, str]]:
    out = []
    for entry in raw or []:
        data = entry[1]
        out.append(dict(zip(data[::2], data[1::2], strict=True)))
    return out


def read_exits(sink: _sink.MemorySink) -> Got:
    got = Got()
    for rtype, payload in list(sink.records):
        if rtype != R.SEGMENT:
            continue
        seg = orjson.loads(payload)
        got.segments += 1
        for s in seg[R.SEG_SPANS]:
            if s[R.SPAN_TYPE] == Kind.EXIT:
                got.exits.append(
                    Exit(
                        op=s[R.SPAN_OPERATION],
                        peer=s[R.SPAN_PEER],
                        component=s[R.SPAN_COMPONENT],
                        layer=s[R.SPAN_LAYER],
                        error=bool(s[R.SPAN_IS_ERROR]),
                        tags=_tags(s[R.SPAN_TAGS]),
                        logs=_logs(s[R.SPAN_LOGS]),
                        parent_id=s[R.SPAN_PARENT_ID],
                    )
                )
    return got


class Traced:
    """Runs code inside a trace (a local span) and collects the exit spans it recorded."""

    def __init__(self, sink: _sink.MemorySink) -> None:
        self.sink = sink

    @contextlib.contextmanager
    def trace(self) -> Iterator[Got]:
        self.sink.clear()
        got = Got()
        with new_local_span("test"):
            yield got
        found = read_exits(self.sink)
        got.exits[:] = found.exits
        got.segments = found.segments

    @contextlib.contextmanager
    def untraced(self) -> Iterator[None]:
        """Code outside any trace: it must record nothing at all."""
        self.sink.clear()
        yield
        assert self.sink.records == [], "a call outside any trace recorded something"


def start_traced(**overrides: Any) -> tuple[Traced, Any]:
    """Install every instrumentation on a memory sink; returns ``(traced, statuses)``."""
    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    overrides.setdefault("plugin_sql_parameters_max_length", PARAMS_MAX)
    cfg = load({}, agent_log_reporter_active=False, **overrides)
    tracing.configure(cfg)
    tracing.stats.reset()
    return Traced(sink), instrument.install_all(cfg)


def stop_traced() -> None:
    instrument.uninstall_all()
    _sink.set_sink(None)


@pytest.fixture()
def traced() -> Iterator[Traced]:
    # The drivers are imported first so install_all patches them at once (deferred
    # installation on first import is proven in test_instrument_lazy.py).
    import aiomysql  # noqa: F401
    import asyncpg  # noqa: F401
    import MySQLdb  # noqa: F401
    import psycopg  # noqa: F401
    import psycopg2  # noqa: F401
    import pymemcache  # noqa: F401
    import pymysql  # noqa: F401
    import redis  # noqa: F401

    t, status = start_traced()
    names = ("psycopg2", "psycopg", "asyncpg", "pymysql", "mysqlclient", "aiomysql", "redis", "pymemcache")
    assert {n: status[n] for n in names} == dict.fromkeys(names, "installed")
    yield t
    stop_traced()


def check_sql(e: Exit, s: Any, op: str, component: int, *, db_type: str, statement: str) -> None:
    """The SkyWalking shape of one SQL exit span against the server ``s`` (a ServerInfo)."""
    assert e.op == op
    assert e.peer == f"127.0.0.1:{s.port}"
    assert e.component == component
    assert e.layer == Layer.DATABASE
    assert e.tags["db.type"] == db_type
    assert e.tags["db.instance"] == s.database
    assert e.tags["db.statement"] == statement


def only(got: Got) -> Exit:
    assert len(got.exits) == 1, [(e.op, e.tags) for e in got.exits]
    return got.exits[0]
