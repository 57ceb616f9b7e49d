"""MySQL drivers against a real MariaDB (tests/daemons.py): PyMySQL, mysqlclient and
aiomysql record one exit span per call with the SkyWalking shape, leave results, errors and
cursor classes as they are, and record nothing outside a trace."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from swmp.tracing import Component
from tests.daemons import ServerInfo
from tests.datastore_support import Exit, Traced, check_sql, only, traced

__all__ = ["traced"]


def _check_shape(e: Exit, s: ServerInfo, op: str, component: int, statement: str) -> None:
    check_sql(e, s, op, component, db_type="mysql", statement=statement)


@pytest.fixture()
def pymysql_conn(traced: Traced, mariadb_server: ServerInfo) -> Iterator[Any]:
    import pymysql

    s = mariadb_server
    conn = pymysql.connect(
        host=s.host, port=s.port, user=s.user, password=s.password, database=s.database, autocommit=True
    )
    with conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS pm_items")
        cur.execute("CREATE TABLE pm_items (id int, name varchar(10))")
    yield conn
    conn.close()


def test_pymysql_calls(traced: Traced, pymysql_conn: Any, mariadb_server: ServerInfo) -> None:
    import pymysql.cursors

    with traced.trace() as got:
        with pymysql_conn.cursor() as cur:
            assert cur.execute("SELECT %s + 1", (41,)) == 1
            assert cur.fetchone() == (42,)
            # PyMySQL turns an INSERT executemany into one statement through execute: one span.
            assert cur.executemany("INSERT INTO pm_items VALUES (%s, %s)", [(1, "a"), (2, "b")]) == 2
        with pymysql_conn.cursor(pymysql.cursors.SSDictCursor) as cur:
            cur.execute("SELECT id, name FROM pm_items ORDER BY id")
            assert list(cur) == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    assert [e.op for e in got.exits] == [
        "Mysql/PyMsql/execute",
        "Mysql/PyMsql/executemany",
        "Mysql/PyMsql/execute",
    ]
    _check_shape(got.exits[0], mariadb_server, "Mysql/PyMsql/execute", Component.PYMYSQL, "SELECT %s + 1")
    assert got.exits[0].tags["db.sql.parameters"] == "[41]"
    assert got.exits[1].tags["db.sql.parameters"] == "[[1,a],[2,b]]"


def test_pymysql_error_and_outside(traced: Traced, pymysql_conn: Any) -> None:
    import pymysql

    with (
        traced.trace() as got,
        pymysql_conn.cursor() as cur,
        pytest.raises(pymysql.err.ProgrammingError) as ei,
    ):
        cur.execute("SELECT * FROM no_such_table")
    assert ei.value.args[0] == 1146  # the driver's own exception, untouched
    e = only(got)
    assert e.error
    assert e.logs[0]["error.kind"] == "ProgrammingError"
    with traced.untraced(), pymysql_conn.cursor() as cur:
        cur.execute("SELECT 1")
        assert cur.fetchone() == (1,)


def test_pymysql_calls_by_keyword(traced: Traced, pymysql_conn: Any) -> None:
    """Arguments named as the driver names them bind inside a trace and outside one."""
    with pymysql_conn.cursor() as cur:
        cur.execute("DROP PROCEDURE IF EXISTS swmp_plus_one")
        cur.execute("CREATE PROCEDURE swmp_plus_one(IN x INT) SELECT x + 1")
    with traced.trace() as got, pymysql_conn.cursor() as cur:
        assert cur.execute(query="SELECT %s + 2", args=(40,)) == 1
        assert cur.fetchone() == (42,)
        assert cur.callproc(procname="swmp_plus_one", args=(41,)) == (41,)
        assert cur.fetchone() == (42,)
        cur.nextset()
    assert [e.op for e in got.exits] == ["Mysql/PyMsql/execute", "Mysql/PyMsql/callproc"]
    assert got.exits[1].tags["db.statement"] == "swmp_plus_one"
    with traced.untraced(), pymysql_conn.cursor() as cur:
        assert cur.callproc(procname="swmp_plus_one", args=(1,)) == (1,)
        assert cur.fetchone() == (2,)


def test_pymysql_calls_without_parameters_are_the_drivers(traced: Traced, pymysql_conn: Any) -> None:
    """A call without its parameters reaches the driver without them: ``execute`` takes its
    own default, ``executemany`` (whose parameters PyMySQL requires) raises as without us."""
    with pymysql_conn.cursor() as cur, pytest.raises(TypeError) as outside:
        cur.executemany("SELECT 1")
    with traced.trace() as got, pymysql_conn.cursor() as cur:
        assert cur.execute("SELECT 3") == 1
        with pytest.raises(TypeError) as inside:
            cur.executemany("SELECT 1")
    assert str(inside.value) == str(outside.value)
    assert [(e.op, e.error) for e in got.exits] == [
        ("Mysql/PyMsql/execute", False),
        ("Mysql/PyMsql/executemany", True),
    ]


def test_pymysql_executemany_rows_from_an_iterator_reach_it_as_they_would(
    traced: Traced, pymysql_conn: Any
) -> None:
    """Rows given as a one-shot iterator (parameters recorded): PyMySQL takes them one at a
    time as it runs the statements, an empty one is not an empty list (``if not args``),
    and the span still shows the rows."""
    with pymysql_conn.cursor() as cur:
        cur.execute("INSERT INTO pm_items VALUES (1, 'a'), (2, 'b')")
    seen_rowcount: list[int] = []

    def rows(cur: Any) -> Iterator[tuple[str, int]]:
        for row in (("x", 1), ("y", 2)):
            seen_rowcount.append(cur.rowcount)  # -1 until PyMySQL has run a statement
            yield row

    with traced.trace() as got, pymysql_conn.cursor() as cur:
        assert cur.executemany("UPDATE pm_items SET name = %s WHERE id = %s", iter(())) == 0
        with pytest.raises(StopIteration):  # PyMySQL's INSERT path takes a first row
            cur.executemany("INSERT INTO pm_items VALUES (%s, %s)", iter(()))
    with traced.trace() as got2, pymysql_conn.cursor() as cur:
        assert cur.executemany("UPDATE pm_items SET name = %s WHERE id = %s", rows(cur)) == 2
    assert seen_rowcount == [-1, 1]
    assert [e.error for e in got.exits] == [False, True]
    assert "db.sql.parameters" not in got.exits[0].tags
    assert only(got2).tags["db.sql.parameters"] == "[[x,1],[y,2]]"


def test_pymysql_database_of_each_connection(
    traced: Traced, pymysql_conn: Any, mariadb_server: ServerInfo
) -> None:
    """``db.instance`` is worked out once per connection (the database it connected to, or
    the one ``select_db`` switched to: see the test below) and never shared between two."""
    import pymysql

    s = mariadb_server
    other = pymysql.connect(
        host=s.host, port=s.port, user=s.user, password=s.password, database="information_schema"
    )
    try:
        with traced.trace() as got, pymysql_conn.cursor() as a, other.cursor() as b:
            for cur in (a, b, a, b):
                cur.execute("SELECT 1")
    finally:
        other.close()
    dbs = [e.tags["db.instance"] for e in got.exits]
    assert dbs == [s.database, "information_schema"] * 2
    assert {e.peer for e in got.exits} == {f"{s.host}:{s.port}"}


def test_mysqlclient_calls_errors_and_outside(traced: Traced, mariadb_server: ServerInfo) -> None:
    import MySQLdb

    s = mariadb_server
    conn = MySQLdb.connect(host=s.host, port=s.port, user=s.user, password=s.password, database=s.database)
    try:
        with traced.trace() as got:
            cur = conn.cursor()
            cur.execute("SELECT %s * 2", (21,))
            assert cur.fetchone() == (42,)
            cur.executemany("SELECT %s", [(1,), (2,)])
            with pytest.raises(MySQLdb.ProgrammingError):
                cur.execute("SELECT * FROM no_such_table")
        assert [e.op for e in got.exits] == [
            "Mysql/MysqlClient/execute",
            "Mysql/MysqlClient/executemany",
            "Mysql/MysqlClient/execute",
        ]
        _check_shape(got.exits[0], s, got.exits[0].op, Component.MYSQLCLIENT, "SELECT %s * 2")
        assert [e.error for e in got.exits] == [False, False, True]
        with traced.untraced():
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
    finally:
        conn.close()


def test_aiomysql_calls_errors_and_outside(traced: Traced, mariadb_server: ServerInfo) -> None:
    import aiomysql
    import pymysql

    s = mariadb_server

    async def main() -> None:
        conn = await aiomysql.connect(
            host=s.host, port=s.port, user=s.user, password=s.password, db=s.database, autocommit=True
        )
        try:
            with traced.trace() as got:
                async with conn.cursor() as cur:
                    await cur.execute("SELECT %s + 2", (40,))
                    assert await cur.fetchone() == (42,)
                    await cur.executemany("SELECT %s", [(1,), (2,)])
                    with pytest.raises(pymysql.err.ProgrammingError):
                        await cur.execute("SELECT * FROM no_such_table")
                async with conn.cursor(aiomysql.DictCursor) as cur:
                    with pytest.raises(asyncio.TimeoutError):  # cancellation reaches the app as it would
                        await asyncio.wait_for(cur.execute("SELECT SLEEP(5)"), 0.3)
            ops = [e.op for e in got.exits]
            assert (
                ops
                == ["Mysql/AioMysql/execute", "Mysql/AioMysql/executemany"] + ["Mysql/AioMysql/execute"] * 2
            )
            _check_shape(got.exits[0], s, ops[0], Component.MYSQL, "SELECT %s + 2")
            # The query the caller's timeout cancelled is no failed query: logged, not flagged.
            assert [e.error for e in got.exits] == [False, False, True, False]
            assert got.exits[3].logs[0]["event"] == "interrupted"
        finally:
            conn.close()
        conn = await aiomysql.connect(
            host=s.host, port=s.port, user=s.user, password=s.password, db=s.database
        )
        try:
            with traced.untraced():
                async with conn.cursor() as cur:
                    await cur.execute("SELECT 1")
                    assert await cur.fetchone() == (1,)
        finally:
            conn.close()

    asyncio.run(main())


@pytest.mark.parametrize("driver", ["pymysql", "mysqlclient", "aiomysql"])
def test_select_db_changes_the_database_of_later_spans(
    traced: Traced, mariadb_server: ServerInfo, driver: str
) -> None:
    """After ``select_db`` a connection's spans name the database it switched to (the drivers
    keep the one they connected with); a refused ``select_db`` raises the driver's error and
    changes nothing; inside or outside a trace."""
    import MySQLdb
    import pymysql

    s = mariadb_server
    refused = (pymysql.err.OperationalError, MySQLdb.OperationalError)

    def run_sync(conn: Any) -> None:
        cur = conn.cursor()
        with traced.trace() as got:
            cur.execute("SELECT 1")
            conn.select_db("information_schema")
            cur.execute("SELECT 2")
            with pytest.raises(refused):
                conn.select_db("no_such_database")
            cur.execute("SELECT 3")
        with traced.untraced():
            conn.select_db(s.database)
        with traced.trace() as again:
            cur.execute("SELECT 4")
        cur.close()
        conn.close()
        check([e.tags["db.instance"] for e in got.exits + again.exits])

    def check(dbs: list[str]) -> None:
        assert dbs == [s.database, "information_schema", "information_schema", s.database]

    login = {"host": s.host, "port": s.port, "user": s.user, "password": s.password}
    if driver == "pymysql":
        run_sync(pymysql.connect(**login, database=s.database))
    elif driver == "mysqlclient":
        run_sync(MySQLdb.connect(**login, database=s.database))
    else:
        import aiomysql

        async def main() -> None:
            conn = await aiomysql.connect(**login, db=s.database)
            cur = await conn.cursor()
            with traced.trace() as got:
                await cur.execute("SELECT 1")
                await conn.select_db("information_schema")
                await cur.execute("SELECT 2")
                with pytest.raises(refused):
                    await conn.select_db("no_such_database")
                await cur.execute("SELECT 3")
            with traced.untraced():
                await conn.select_db(s.database)
            with traced.trace() as again:
                await cur.execute("SELECT 4")
            await cur.close()
            conn.close()
            check([e.tags["db.instance"] for e in got.exits + again.exits])

        asyncio.run(main())
