"""PostgreSQL drivers against a real PostgreSQL 15 (tests/daemons.py): psycopg2, psycopg 3
(sync and async) and asyncpg record one exit span per call with the SkyWalking shape, leave
results, errors, cursors and cancellation as they are, and record nothing outside a trace."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterator
from typing import Any

import pytest

from swmp.tracing import Component
from tests.daemons import ServerInfo
from tests.datastore_support import Exit, Traced, check_sql, only, start_traced, stop_traced, traced

__all__ = ["traced"]  # the fixture, used by name


def _check_shape(e: Exit, s: ServerInfo, op: str, component: int, statement: str) -> None:
    check_sql(e, s, op, component, db_type="PostgreSQL", statement=statement)


def _dsn(s: ServerInfo) -> dict[str, Any]:
    return {"host": s.host, "port": s.port, "user": s.user, "password": s.password, "dbname": s.database}


# -- psycopg2 -----------------------------------------------------------------------------------
@pytest.fixture()
def pg2(traced: Traced, postgres_server: ServerInfo) -> Iterator[Any]:
    import psycopg2

    conn = psycopg2.connect(**_dsn(postgres_server))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS pg2_items; CREATE TABLE pg2_items (id int, name text)")
    yield conn
    conn.close()


def test_psycopg2_execute_span_and_results(traced: Traced, pg2: Any, postgres_server: ServerInfo) -> None:
    with traced.trace() as got, pg2.cursor() as cur:
        cur.execute("SELECT %s::int + 1, %s::text", (41, "x"))
        assert cur.fetchone() == (42, "x")
    e = only(got)
    _check_shape(
        e, postgres_server, "PostgreSQL/Psycopg/execute", Component.PSYCOPG, "SELECT %s::int + 1, %s::text"
    )
    assert e.tags["db.sql.parameters"] == "[41,x]"
    assert not e.error


def test_psycopg2_cursor_factories_and_signatures_of_the_application(traced: Traced, pg2: Any) -> None:
    """A ``cursor_factory`` that is a callable but not a class works (its cursors untraced);
    a cursor class with an ``execute`` of its own names and options gets its calls as
    written; ``callproc`` by keyword is refused as psycopg2 refuses it."""
    import functools

    import psycopg2.extras
    from psycopg2.extensions import cursor as plain_cursor

    def made_by_a_function(*args: Any, **kwargs: Any) -> Any:
        return psycopg2.extras.RealDictCursor(*args, **kwargs)

    class OwnNames(plain_cursor):  # type: ignore[misc]
        def execute(self, sql: Any, params: Any = None, *, tag: Any = None) -> Any:
            self.tag = tag
            return super().execute(sql, params)

    with traced.trace() as got:
        with pg2.cursor(cursor_factory=functools.partial(psycopg2.extras.DictCursor)) as cur:
            cur.execute("SELECT 1 AS one")
            assert cur.fetchone()["one"] == 1
        with pg2.cursor(cursor_factory=made_by_a_function) as cur:
            cur.execute("SELECT 2 AS two")
            assert cur.fetchone() == {"two": 2}
        with pg2.cursor(cursor_factory=OwnNames) as cur:
            cur.execute("SELECT 3", params=None, tag="x")
            assert cur.fetchone() == (3,) and cur.tag == "x"
            cur.execute(sql="SELECT %s::int", params=(4,))
            assert cur.fetchone() == (4,)
            with pytest.raises(TypeError):
                cur.callproc("abs", parameters=[-3])
    # Traced: the call that names its query by position (OwnNames' first), and the refused
    # callproc (its span marked as failed); by its own keyword names the call runs untraced.
    assert [(e.op, e.error) for e in got.exits] == [
        ("PostgreSQL/Psycopg/execute", False),
        ("PostgreSQL/Psycopg/callproc", True),
    ]


def test_psycopg2_error_reaches_the_app_unchanged(traced: Traced, pg2: Any) -> None:
    import psycopg2.errors

    with traced.trace() as got, pg2.cursor() as cur, pytest.raises(psycopg2.errors.UndefinedTable):
        cur.execute("SELECT * FROM no_such_table")
    e = only(got)
    assert e.error
    assert e.logs[0]["error.kind"] == "UndefinedTable"


def test_psycopg2_executemany_copy_and_cursor_factories(traced: Traced, pg2: Any) -> None:
    import psycopg2.extras

    with traced.trace() as got:
        with pg2.cursor() as cur:
            cur.executemany("INSERT INTO pg2_items VALUES (%s, %s)", iter([(1, "a"), (2, "b")]))
            cur.copy_expert("COPY pg2_items FROM STDIN", io.StringIO("3\tc\n"))
        with pg2.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
            assert isinstance(cur, psycopg2.extras.RealDictCursor)
            cur.execute("SELECT id, name FROM pg2_items ORDER BY id")
            assert cur.fetchall() == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}]
    ops = [e.op.rsplit("/", 1)[1] for e in got.exits]
    assert ops == ["executemany", "copy_expert", "execute"]
    assert got.exits[0].tags["db.sql.parameters"] == "[[1,a],[2,b]]"


def test_psycopg2_connection_factories_keep_their_cursor_classes(
    traced: Traced, postgres_server: ServerInfo
) -> None:
    import psycopg2.extras

    conn = psycopg2.connect(**_dsn(postgres_server), connection_factory=psycopg2.extras.RealDictConnection)
    try:
        assert isinstance(conn, psycopg2.extras.RealDictConnection)
        with traced.trace() as got:
            with conn.cursor() as cur:
                assert isinstance(cur, psycopg2.extras.RealDictCursor)
                cur.execute("SELECT 1 AS one")
                assert cur.fetchone() == {"one": 1}
            with conn.cursor("rd_named") as named:  # positional name, server-side
                assert isinstance(named, psycopg2.extras.RealDictCursor)
                named.execute("SELECT 2 AS two")
                assert named.fetchall() == [{"two": 2}]
            with conn.cursor(None, psycopg2.extras.NamedTupleCursor) as nt:  # positional factory
                nt.execute("SELECT 3 AS three")
                assert nt.fetchone().three == 3
        assert [e.tags["db.statement"] for e in got.exits] == [
            "SELECT 1 AS one",
            "SELECT 2 AS two",
            "SELECT 3 AS three",
        ]
    finally:
        conn.close()


@pytest.mark.parametrize("factory", ["RealDictConnection", "NamedTupleConnection", "LoggingConnection"])
def test_psycopg2_named_cursor_of_a_connection_class_sends_nothing(
    traced: Traced, postgres_server: ServerInfo, factory: str
) -> None:
    """A connection class with a ``cursor()`` of its own (``RealDictConnection``...) hands out
    a named cursor as psycopg2 does, without a statement to the server: psycopg2's refcursor
    pattern (a function opens a cursor, ``conn.cursor(its name)`` reads it) keeps working."""
    import logging

    import psycopg2
    import psycopg2.extras

    cls = getattr(psycopg2.extras, factory)
    conn = psycopg2.connect(**_dsn(postgres_server), connection_factory=cls)
    if factory == "LoggingConnection":
        conn.initialize(logging.getLogger("tests.psycopg2"))
    watcher = psycopg2.connect(**_dsn(postgres_server))
    watcher.autocommit = True

    def last_query() -> str:  # what the server last received from ``conn``
        with watcher.cursor() as w:
            w.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", (conn.info.backend_pid,))
            return str(w.fetchone()[0])

    try:
        with traced.trace() as got:
            with conn.cursor() as cur:
                cur.execute(
                    "CREATE OR REPLACE FUNCTION swmp_reffunc(refcursor) RETURNS refcursor AS $$"
                    " BEGIN OPEN $1 FOR SELECT generate_series(1, 3) AS n; RETURN $1; END; $$"
                    " LANGUAGE plpgsql"
                )
                cur.callproc("swmp_reffunc", ["swmp_ref"])
            sent = last_query()
            named = conn.cursor("swmp_ref")
            assert last_query() == sent
            assert type(named).__name__ == factory.replace("Connection", "Cursor")
            # psycopg2's Dict cursors cannot fetch from a cursor they did not execute.
            if factory != "RealDictConnection":
                assert [r[0] for r in named.fetchall()] == [1, 2, 3]
            named.close()
        conn.rollback()
        ops = [e.op for e in got.exits if "pg_stat_activity" not in e.tags["db.statement"]]
        assert ops == ["PostgreSQL/Psycopg/execute", "PostgreSQL/Psycopg/callproc"]
    finally:
        conn.close()
        watcher.close()


def test_psycopg2_cursor_argument_given_twice_is_refused_as_psycopg2_refuses_it(pg2: Any) -> None:
    from psycopg2.extensions import connection as plain_connection

    with pytest.raises(TypeError) as plain:
        plain_connection.cursor(pg2, "a", name="b")
    with pytest.raises(TypeError) as wrapped:
        pg2.cursor("a", name="b")
    assert str(wrapped.value) == str(plain.value)
    with pytest.raises(TypeError) as wrapped:
        pg2.cursor(None, None, False, cursor_factory=None)
    assert "cursor_factory" in str(wrapped.value)


def test_psycopg2_server_side_cursor_and_transaction(traced: Traced, postgres_server: ServerInfo) -> None:
    import psycopg2

    conn = psycopg2.connect(**_dsn(postgres_server))
    try:
        with traced.trace() as got, conn, conn.cursor("named") as cur:  # a transaction, then commit
            cur.execute("SELECT generate_series(1, 5)")
            assert [r[0] for r in cur] == [1, 2, 3, 4, 5]
        assert only(got).op == "PostgreSQL/Psycopg/execute"
    finally:
        conn.close()


def test_composed_sql_is_recorded_as_its_text(traced: Traced, pg2: Any, pg3: Any) -> None:
    import psycopg.sql
    import psycopg2.sql

    with traced.trace() as got:
        with pg2.cursor() as cur:
            cur.execute(psycopg2.sql.SQL("SELECT {} FROM pg2_items").format(psycopg2.sql.Identifier("id")))
        pg3.execute(psycopg.sql.SQL("SELECT {} FROM pg3_items").format(psycopg.sql.Identifier("name")))
    statements = [e.tags["db.statement"] for e in got.exits]
    assert statements == ['SELECT "id" FROM pg2_items', 'SELECT "name" FROM pg3_items']


def test_psycopg2_outside_a_trace_records_nothing(traced: Traced, pg2: Any) -> None:
    with traced.untraced(), pg2.cursor() as cur:
        cur.execute("SELECT 1")
        assert cur.fetchone() == (1,)


def test_psycopg2_connection_made_before_the_install_is_not_traced(
    traced: Traced, postgres_server: ServerInfo
) -> None:
    """The documented limit: psycopg2's C connection and cursor cannot be changed once made,
    so a connection from before the install records nothing, and works as before."""
    import psycopg2
    import psycopg2.extras

    stop_traced()
    conn = psycopg2.connect(**_dsn(postgres_server))
    try:
        late, _ = start_traced()
        with late.trace() as got:
            for factory in (None, psycopg2.extras.RealDictCursor):
                with conn.cursor(cursor_factory=factory) as cur:
                    cur.execute("SELECT 1 AS one")
                    row = cur.fetchone()
                    assert (row["one"] if factory else row[0]) == 1
        assert got.exits == []
    finally:
        conn.close()


# -- psycopg 3 ----------------------------------------------------------------------------------
@pytest.fixture()
def pg3(traced: Traced, postgres_server: ServerInfo) -> Iterator[Any]:
    import psycopg

    conn = psycopg.connect(**_dsn(postgres_server), autocommit=True)
    conn.execute("DROP TABLE IF EXISTS pg3_items; CREATE TABLE pg3_items (id int, name text)")
    yield conn
    conn.close()


def test_psycopg_sync_calls(traced: Traced, pg3: Any, postgres_server: ServerInfo) -> None:
    with traced.trace() as got:
        assert pg3.execute("SELECT %s::int * 2", (21,)).fetchone() == (42,)
        with pg3.cursor() as cur:
            cur.executemany("INSERT INTO pg3_items VALUES (%s, %s)", [(1, "a"), (2, "b")])
            with cur.copy("COPY pg3_items FROM STDIN") as copy:
                copy.write_row((3, "c"))
            assert [r[0] for r in cur.stream("SELECT id FROM pg3_items ORDER BY id")] == [1, 2, 3]
        with pg3.transaction(), pg3.cursor(name="pg3_named") as named:
            named.execute("SELECT generate_series(1, 3)")
            assert named.fetchall() == [(1,), (2,), (3,)]
    ops = [e.op for e in got.exits]
    assert ops == [
        "PostgreSQL/Psycopg/execute",
        "PostgreSQL/Psycopg/executemany",
        "PostgreSQL/Psycopg/copy",
        "PostgreSQL/Psycopg/stream",
        "PostgreSQL/Psycopg/execute",
    ]
    _check_shape(got.exits[0], postgres_server, ops[0], Component.PSYCOPG, "SELECT %s::int * 2")
    assert got.exits[0].tags["db.sql.parameters"] == "[21]"
    assert all(e.parent_id == 0 and not e.error for e in got.exits)


def test_psycopg_executemany_rows_from_an_iterator_are_read_as_it_sends_them(
    traced: Traced, pg3: Any
) -> None:
    """Rows given as a one-shot iterator (parameters recorded): psycopg takes them one at a
    time inside its pipeline, as without the agent, and the span still shows them."""
    from psycopg import pq

    status: list[pq.PipelineStatus] = []

    def rows() -> Iterator[tuple[int, str]]:
        for row in ((1, "a"), (2, "b")):
            status.append(pg3.pgconn.pipeline_status)
            yield row

    with traced.trace() as got, pg3.cursor() as cur:
        cur.executemany("INSERT INTO pg3_items VALUES (%s, %s)", rows())
        cur.executemany("INSERT INTO pg3_items VALUES (%s, %s)", iter(()))
    assert status == [pq.PipelineStatus.ON, pq.PipelineStatus.ON]
    assert got.exits[0].tags["db.sql.parameters"] == "[[1,a],[2,b]]"
    assert "db.sql.parameters" not in got.exits[1].tags
    assert [r[0] for r in pg3.execute("SELECT id FROM pg3_items ORDER BY id")] == [1, 2]


def test_psycopg_connections_dropped_unclosed_are_freed(
    traced: Traced, pg3: Any, postgres_server: ServerInfo
) -> None:
    """A connection the application drops without closing it is freed, and its server
    session ended, as without the agent: the agent remembers a connection's address weakly
    (the Python memo and the native call's alike)."""
    import gc

    import psycopg

    name = "swmp-dropped"
    with traced.trace():
        for _ in range(6):
            conn = psycopg.connect(**_dsn(postgres_server), application_name=name)
            conn.execute("SELECT 1")
            del conn
    gc.collect()

    def sessions() -> int:
        row = pg3.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,))
        return int(row.fetchone()[0])

    deadline = time.monotonic() + 10
    while sessions() > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sessions() == 0


def test_psycopg_errors(traced: Traced, pg3: Any) -> None:
    import psycopg

    with traced.trace() as got:
        with pytest.raises(psycopg.errors.UndefinedTable):
            pg3.execute("SELECT * FROM no_such_table")
        with pytest.raises(psycopg.errors.UndefinedTable), pg3.cursor() as cur:
            cur.copy("COPY no_such_table FROM STDIN").__enter__()
        with pytest.raises(ZeroDivisionError), pg3.cursor() as cur, cur.copy("COPY pg3_items FROM STDIN"):
            raise ZeroDivisionError  # the application's own failure inside the block
    assert [e.error for e in got.exits] == [True, True, True]
    assert got.exits[0].logs[0]["error.kind"] == "UndefinedTable"
    assert got.exits[2].logs[0]["error.kind"] == "ZeroDivisionError"


def test_psycopg_stream_and_copy_never_used_leave_the_trace_whole(traced: Traced, pg3: Any) -> None:
    """psycopg sends a ``stream()``'s query at its first row and a ``copy()``'s statement when
    its block is entered: one made and dropped sends nothing and records nothing, and the
    trace around it is still reported (a span left open would hold its segment back)."""
    with traced.trace() as got, pg3.cursor() as cur:
        cur.stream("SELECT 1")  # dropped unstarted
        cur.copy("COPY pg3_items FROM STDIN")  # dropped unentered
        assert cur.execute("SELECT 2").fetchone() == (2,)
    assert got.segments == 1
    assert [e.tags["db.statement"] for e in got.exits] == ["SELECT 2"]


def test_psycopg_async_stream_and_copy_never_used_leave_the_trace_whole(
    traced: Traced, postgres_server: ServerInfo
) -> None:
    import psycopg

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(**_dsn(postgres_server), autocommit=True) as conn:
            with traced.trace() as got:
                async with conn.cursor() as cur:
                    cur.stream("SELECT 1")
                    cur.copy("COPY pg3_items FROM STDIN")
                    await cur.execute("SELECT 3")
            assert got.segments == 1
            assert [e.tags["db.statement"] for e in got.exits] == ["SELECT 3"]

    asyncio.run(main())


def test_psycopg_async(traced: Traced, postgres_server: ServerInfo) -> None:
    import psycopg

    async def main() -> None:
        conn = await psycopg.AsyncConnection.connect(**_dsn(postgres_server), autocommit=True)
        async with conn:
            with traced.trace() as got:
                cur = await conn.execute("SELECT %s::int", (7,))
                assert await cur.fetchone() == (7,)
                async with conn.cursor() as c2:
                    await c2.executemany("SELECT %s::int", [(1,), (2,)])
                    rows = [r async for r in c2.stream("SELECT generate_series(1, 3)")]
                    assert rows == [(1,), (2,), (3,)]
                with pytest.raises(psycopg.errors.UndefinedTable):
                    await conn.execute("SELECT * FROM no_such_table")
                with pytest.raises(asyncio.TimeoutError):  # cancellation reaches the app as it would
                    await asyncio.wait_for(conn.execute("SELECT pg_sleep(10)"), 0.3)
            assert [e.op.rsplit("/", 1)[1] for e in got.exits] == [
                "execute", "executemany", "stream", "execute", "execute"
            ]  # fmt: skip
            # The query the caller's timeout cancelled is no failed query: logged, not flagged.
            assert [e.error for e in got.exits] == [False, False, False, True, False]
            assert got.exits[4].logs[0]["event"] == "interrupted"
            with traced.untraced():
                assert await (await conn.execute("SELECT 1")).fetchone() == (1,)

    asyncio.run(main())


# -- asyncpg ------------------------------------------------------------------------------------
def test_asyncpg_calls_errors_and_outside(traced: Traced, postgres_server: ServerInfo) -> None:
    import asyncpg

    s = postgres_server

    async def main() -> None:
        conn = await asyncpg.connect(
            host=s.host, port=s.port, user=s.user, password=s.password, database=s.database
        )
        try:
            await conn.execute("DROP TABLE IF EXISTS apg_items; CREATE TABLE apg_items (id int)")
            with traced.trace() as got:
                assert await conn.fetchval("SELECT $1::int + 1", 1) == 2
                await conn.executemany("INSERT INTO apg_items VALUES ($1)", [(1,), (2,)])
                stmt = await conn.prepare("SELECT id FROM apg_items WHERE id > $1 ORDER BY id")
                assert [r["id"] for r in await stmt.fetch(0)] == [1, 2]
                async with conn.transaction():  # BEGIN / COMMIT are simple queries: spans too
                    assert [r[0] async for r in conn.cursor("SELECT id FROM apg_items")] == [1, 2]
                with pytest.raises(asyncpg.exceptions.UndefinedTableError):
                    await conn.fetch("SELECT * FROM no_such_table")
            calls = [(e.op.rsplit("/", 1)[1], e.tags["db.statement"]) for e in got.exits]
            assert calls == [
                ("prepare", "SELECT $1::int + 1"),
                ("bind", "SELECT $1::int + 1"),
                ("prepare", "INSERT INTO apg_items VALUES ($1)"),
                ("bind", "INSERT INTO apg_items VALUES ($1)"),
                ("prepare", "SELECT id FROM apg_items WHERE id > $1 ORDER BY id"),
                ("bind", "SELECT id FROM apg_items WHERE id > $1 ORDER BY id"),
                ("bind", "BEGIN;"),
                ("prepare", "SELECT id FROM apg_items"),
                ("bind", "SELECT id FROM apg_items"),
                ("bind", "COMMIT;"),
                ("prepare", "SELECT * FROM no_such_table"),
            ]
            bind = got.exits[1]
            _check_shape(bind, s, "PostgreSQL/AsyncPG/bind", Component.ASYNCPG, "SELECT $1::int + 1")
            assert bind.tags["db.sql.parameters"] == "[1]"
            assert got.exits[3].tags["db.sql.parameters"] == "[[1],[2]]"
            assert [e.error for e in got.exits] == [False] * 10 + [True]
            assert got.exits[-1].logs[0]["error.kind"] == "UndefinedTableError"
            with traced.trace() as again:  # a cached statement is not parsed again
                assert await conn.fetchval("SELECT $1::int + 1", 5) == 6
            assert [e.op for e in again.exits] == ["PostgreSQL/AsyncPG/bind"]
            with traced.untraced():
                assert await conn.fetchval("SELECT 3") == 3
        finally:
            await conn.close()

    asyncio.run(main())


def test_asyncpg_pool(traced: Traced, postgres_server: ServerInfo) -> None:
    import asyncpg

    s = postgres_server

    async def main() -> None:
        login = {"host": s.host, "port": s.port, "user": s.user, "password": s.password}
        pool = await asyncpg.create_pool(**login, database=s.database, min_size=2, max_size=2)
        try:
            with traced.trace() as got:
                values = await asyncio.gather(*(pool.fetchval("SELECT $1::int", i) for i in range(4)))
                assert sorted(values) == [0, 1, 2, 3]
                async with pool.acquire() as conn:
                    assert await conn.fetchval("SELECT 9") == 9
            statements = [e.tags["db.statement"] for e in got.exits if e.op == "PostgreSQL/AsyncPG/bind"]
            assert statements.count("SELECT $1::int") == 4
            assert statements.count("SELECT 9") == 1
            # The rest: the pool's own reset on each release, a real round trip each.
            others = [t for t in statements if t not in ("SELECT $1::int", "SELECT 9")]
            assert others and all("RESET ALL" in t for t in others), others
            assert {e.peer for e in got.exits} == {f"127.0.0.1:{s.port}"}
        finally:
            await pool.close()

    asyncio.run(main())


def test_asyncpg_connection_opened_before_the_install(traced: Traced, postgres_server: ServerInfo) -> None:
    """A connection made before the agent was installed (``swmp.start()`` after connecting):
    its calls have the peer and database too, found once from the connection."""
    import asyncpg

    s = postgres_server
    stop_traced()  # as if the agent had not started yet

    async def main() -> None:
        login = {"host": s.host, "port": s.port, "user": s.user, "password": s.password}
        conn = await asyncpg.connect(**login, database=s.database)
        pool = await asyncpg.create_pool(**login, database=s.database, min_size=1, max_size=1)
        try:
            late, _ = start_traced()
            with late.trace() as got:
                assert await conn.fetchval("SELECT $1::int + 1", 1) == 2
                stmt = await conn.prepare("SELECT 7")
                assert await stmt.fetchval() == 7
                async with conn.transaction():
                    assert [r[0] async for r in conn.cursor("SELECT 8")] == [8]
                assert await pool.fetchval("SELECT 9") == 9
            assert len(got.exits) >= 8
            for e in got.exits:
                assert e.peer == f"127.0.0.1:{s.port}", e
                assert e.tags["db.instance"] == s.database, e
        finally:
            await pool.close()
            await conn.close()

    asyncio.run(main())
