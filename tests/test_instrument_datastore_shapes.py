"""Data-store drivers called in shapes they refuse: the refusal reaches the caller as without
the agent, naming the driver's method (real PostgreSQL and MariaDB)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.daemons import ServerInfo
from tests.datastore_support import start_traced, stop_traced


def _refusal(call: Callable[[], Any]) -> str:
    with pytest.raises(TypeError) as info:
        call()
    return str(info.value)


def _connect(driver: str, pg: ServerInfo, my: ServerInfo) -> Any:
    if driver == "psycopg":
        import psycopg

        return psycopg.connect(
            host=pg.host, port=pg.port, user=pg.user, password=pg.password, dbname=pg.database
        )
    module = __import__(driver)  # pymysql, MySQLdb
    return module.connect(
        host=my.host, port=my.port, user=my.user, password=my.password, database=my.database
    )


_SHAPES: dict[str, Callable[[Any], Any]] = {
    "unknown keyword": lambda cur: cur.execute("SELECT 1", foo=1),
    "no query": lambda cur: cur.execute(),
    "query twice": lambda cur: cur.execute("SELECT 1", query="SELECT 2"),
}


@pytest.mark.parametrize("shape", list(_SHAPES))
@pytest.mark.parametrize("driver", ["psycopg", "pymysql", "MySQLdb"])
def test_a_call_the_driver_refuses_names_the_drivers_method(
    postgres_server: ServerInfo, mariadb_server: ServerInfo, driver: str, shape: str
) -> None:
    """The traced form of ``execute`` took the arguments first: its TypeError named the
    agent's function (``cursor_method.<locals>.make.<locals>.straced() got an unexpected
    keyword argument``) instead of the driver's (``Cursor.execute() ...``)."""

    def call() -> str:
        conn = _connect(driver, postgres_server, mariadb_server)
        try:
            return _refusal(lambda: _SHAPES[shape](conn.cursor()))
        finally:
            conn.close()

    without = call()
    traced, _ = start_traced()
    try:
        with traced.trace():
            within = call()
    finally:
        stop_traced()
    assert within == without
    assert "execute()" in without and "<locals>" not in without


def test_a_generator_method_is_still_one_to_inspect() -> None:
    """psycopg's ``Cursor.stream`` is a generator function; its gate answered False to
    ``inspect.isgeneratorfunction`` (the coroutine and async generator kinds were carried
    over, not this one)."""
    import inspect

    import psycopg

    from swmp.instrument._gate import is_native

    if not is_native():
        pytest.skip("the Python gate is a function of its own: no generator")
    assert inspect.isgeneratorfunction(psycopg.Cursor.stream)
    start_traced()
    try:
        assert inspect.isgeneratorfunction(psycopg.Cursor.stream)
        assert inspect.isasyncgenfunction(psycopg.AsyncCursor.stream)
    finally:
        stop_traced()
