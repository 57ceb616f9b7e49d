"""The native ``SqlCall`` (swmp/_native/sql.c) runs a cursor's ``execute`` as the Python
wrappers do: the same calls reach the driver, the same results and exceptions reach the
caller, the same segments are recorded. Each case runs through the native form and through
the Python form alone (the fallback it is given), for the three ways the drivers find their
connection's ``(peer, database)``: a memo pair (psycopg2), a memo keyed by the connection's
database attribute (PyMySQL, mysqlclient) and a function of the connection (psycopg).

The drivers themselves are exercised against the real servers in test_instrument_postgres.py
and test_instrument_mysql.py; here a DB-API-shaped cursor records what it is given, so that
every call shape and failure can be provoked."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from swmp import _sink
from swmp.instrument import _datastore as ds
from swmp.instrument._gate import gated
from swmp.tracing.context import new_entry_span
from swmp.tracing.span import NATIVE, current_span, native_core
from tests.native_forms import PLACES, call_in, recording, segments

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")

OP = "Db/Test/execute"
COMPONENT = 7010


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with recording() as memory:
        yield memory


class Connection:
    def __init__(self, db: Any = "shop") -> None:
        self.db = db


class Cursor:
    """Records each call's arguments and the span current during it."""

    def __init__(self, conn: Any) -> None:
        self.connection = conn
        self.calls: list[Any] = []

    def execute(self, query: Any, params: Any = None, *rest: Any, **kw: Any) -> Any:
        seen = current_span.get()
        self.calls.append((query, params, rest, kw, None if seen is None else seen.op))
        if query == "FAIL":
            raise RuntimeError("driver says no")
        if query == "INTERRUPT":
            raise KeyboardInterrupt
        return ("result", query)


class Counted:
    """A ``where`` that counts its calls: the native path takes the memo without it."""

    def __init__(self, fn: Callable[[Any], tuple[str, str]]) -> None:
        self.fn = fn
        self.calls = 0

    def __call__(self, arg: Any) -> tuple[str, str]:
        self.calls += 1
        return self.fn(arg)


def _memo_pair(cur: Any) -> tuple[str, str]:  # psycopg2's: the pair itself, on the connection
    conn = cur.connection
    pair = getattr(conn, ds.WHERE, None)
    if pair is None:
        pair = ("db.local:5432", str(conn.db))
        setattr(conn, ds.WHERE, pair)
    return pair  # type: ignore[no-any-return]


def _memo_keyed(cur: Any) -> tuple[str, str]:  # PyMySQL's: (its db then, pair)
    conn = cur.connection
    memo = getattr(conn, ds.WHERE, None)
    if memo is not None and memo[0] is conn.db:
        return memo[1]  # type: ignore[no-any-return]
    pair = ("db.local:3306", ds.text(conn.db or ""))
    setattr(conn, ds.WHERE, (conn.db, pair))
    return pair


def _of_connection(conn: Any) -> tuple[str, str]:  # psycopg's: a function of the connection
    return ("db.local:5433", str(conn.db))


STYLES = ("pair", "keyed", "function", "function-keyed")


def _wrapper(style: str, truthy: bool) -> tuple[Callable[..., Any], Callable[..., Any], Counted]:
    """(native gate, Python gate, the counted where) around ``Cursor.execute``."""
    orig = Cursor.execute
    if style.startswith("function"):
        where = Counted(_of_connection)
        cursor_where = Counted(lambda cur: where(cur.connection))
    else:
        where = cursor_where = Counted(_memo_pair if style == "pair" else _memo_keyed)

    def traced(self: Any, query: Any, params: Any = None, *rest: Any, **kw: Any) -> Any:
        # The Python forms' shape: the pair, the span, the call inside it.
        address, db = cursor_where(self)
        if truthy:
            params = params or None
        span = ds.sql_span(OP, address, COMPONENT, "PostgreSQL", db, query, params)
        with span:
            return orig(self, query, params, *rest, **kw) if (rest or kw) else orig(self, query, params)

    native = native_core.SqlCall(
        orig,
        traced,
        OP,
        COMPONENT,
        "PostgreSQL",
        "connection",
        where if style.startswith("function") else None,
        "db" if style in ("keyed", "function-keyed") else None,
        truthy,
    )
    return gated(orig, native), gated(orig, traced), where


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("SELECT 1",), {}),
    (("SELECT %s", (1,)), {}),
    (("SELECT %s", [1, "a"]), {}),
    (("SELECT %(a)s", {"a": 2}), {}),
    (("SELECT 1", ()), {}),
    (("SELECT 1", None), {}),
    (("FAIL", (1,)), {}),
    (("INTERRUPT",), {}),
    ((b"SELECT bytes",), {}),
    (("SELECT %s",), {"params": (3,)}),
    (("SELECT 1", None, "extra"), {}),
    (("SELECT 1",), {"prepare": True}),
    (("SELECT %s", (4,)), {"prepare": True}),  # psycopg's Connection.execute: native
    (("SELECT %s", None), {"prepare": False, "binary": True}),
    (("x" * 5000,), {}),
]


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("truthy", [False, True])
@pytest.mark.parametrize("params_max", [0, 8, 512])
def test_native_execute_matches_the_python_form(
    sink: _sink.MemorySink, style: str, truthy: bool, params_max: int
) -> None:
    ds.settings.params_max = params_max
    native, python, _ = _wrapper(style, truthy)
    for (args, kw), inside in itertools.product(CALLS, PLACES):
        # A fresh connection each time: the first call makes the memo, the second uses it.
        results = []
        for fn in (native, python):
            cur = Cursor(Connection())
            first = call_in(fn, cur, args, kw, sink, inside)
            second = call_in(fn, cur, args, kw, sink, inside)
            results.append((first, second))
        (n1, n2), (p1, p2) = results
        for n, p in ((n1, p1), (n2, p2)):
            assert n[0] == p[0] and n[2] == p[2], (args, kw, inside)
            # The driver is given the caller's arguments: an absent parameter stays absent
            # (the Python form passes None, the driver's default, in its place).
            assert [c[0] for c in n[1]] == [c[0] for c in p[1]]
            assert [c[4] for c in n[1]] == [c[4] for c in p[1]]


@pytest.mark.parametrize("style", STYLES)
def test_the_native_path_is_taken_once_the_memo_exists(sink: _sink.MemorySink, style: str) -> None:
    native, _, where = _wrapper(style, truthy=True)
    cur = Cursor(Connection())
    with new_entry_span("/request"):
        for _ in range(5):
            assert native(cur, "SELECT %s", (1,)) == ("result", "SELECT %s")
    # The memo styles ask the Python where once (the fallback makes the memo, or C keeps the
    # answer for the connection's key object); the function style calls it on every query,
    # from C.
    assert where.calls == (5 if style == "function" else 1)
    (segment,) = segments(sink.records)
    spans = segment[3]
    assert [s[2] for s in spans[:-1]] == [OP] * 5  # op of every exit span
    tags = spans[0][9]
    assert tags[:6] == ["db.type", "PostgreSQL", "db.instance", "shop", "db.statement", "SELECT %s"]


@pytest.mark.parametrize("style", ["keyed", "function-keyed"])
def test_a_changed_database_asks_the_python_where_again(sink: _sink.MemorySink, style: str) -> None:
    native, _, where = _wrapper(style, truthy=True)
    conn = Connection("first")
    cur = Cursor(conn)
    with new_entry_span("/request"):
        native(cur, "SELECT 1")
        native(cur, "SELECT 1")
        conn.db = "second"  # select_db: the memo's key is not the connection's db any more
        native(cur, "SELECT 1")
        native(cur, "SELECT 1")
    assert where.calls == 2
    (segment,) = segments(sink.records)
    assert [s[9][3] for s in segment[3][:-1]] == ["first", "first", "second", "second"]


def test_odd_memos_and_connections_go_to_the_python_form(sink: _sink.MemorySink) -> None:
    native, python, where = _wrapper("pair", truthy=False)
    for memo in ("not a pair", ("one",), ["a", "b"], ("a", "b", "c")):
        outcomes = []
        for fn in (python, native):
            conn = Connection()
            setattr(conn, ds.WHERE, memo)
            before = where.calls
            outcomes.append(call_in(fn, Cursor(conn), ("SELECT 1",), {}, sink, "entry"))
            assert where.calls == before + 1  # the native form left it to the Python one
        assert outcomes[0] == outcomes[1], memo
    # A closed connection (None): the Python where decides (here: it fails as it would).
    assert call_in(native, Cursor(None), ("SELECT 1",), {}, sink, "entry") == call_in(
        python, Cursor(None), ("SELECT 1",), {}, sink, "entry"
    )


def test_a_failing_where_function_is_left_to_the_python_form(sink: _sink.MemorySink) -> None:
    calls: list[str] = []

    def where(conn: Any) -> tuple[str, str]:
        calls.append("where")
        raise ValueError("cannot tell")

    def traced(self: Any, query: Any, params: Any = None) -> Any:
        calls.append("fallback")
        return Cursor.execute(self, query, params)

    native = native_core.SqlCall(
        Cursor.execute, traced, OP, COMPONENT, "PostgreSQL", "connection", where, None, False
    )
    cur = Cursor(Connection())
    with new_entry_span("/request"):
        assert native(cur, "SELECT 1") == ("result", "SELECT 1")
    assert calls == ["where", "fallback"]


def test_constructor_refuses_wrong_arguments() -> None:
    with pytest.raises(TypeError):
        native_core.SqlCall(Cursor.execute, 1, OP, COMPONENT, "PostgreSQL", "connection", None, None, False)
    with pytest.raises(TypeError):
        native_core.SqlCall(
            Cursor.execute, Cursor.execute, OP, COMPONENT, "PostgreSQL", "connection", 5, None, False
        )
    with pytest.raises(TypeError):
        native_core.SqlCall(
            Cursor.execute, Cursor.execute, OP, COMPONENT, "PostgreSQL", "connection", None, 3, False
        )
    with pytest.raises(TypeError):
        native_core.SqlCall(
            Cursor.execute, Cursor.execute, OP, COMPONENT, "PostgreSQL", "connection", None, None, False, x=1
        )
