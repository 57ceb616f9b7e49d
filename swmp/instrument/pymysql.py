"""PyMySQL: one exit span per ``Cursor.execute`` / ``executemany`` / ``callproc``, every
cursor class included (component PyMysql, 7003; operation ``Mysql/PyMsql/<method>``, the
SkyWalking Python agent's spelling, so its dashboards and alarms keep matching).
``executemany`` that PyMySQL splits into several ``execute`` calls is one span.
``db.instance`` follows ``Connection.select_db``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument import _datastore as _ds
from swmp.instrument._patch import patch, restore
from swmp.instrument._select_db import selected
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "pymysql"
PEER_NAMES = ("sw_pymysql",)
PACKAGE = "PyMySQL"
SUPPORTED = ("0.10", "3")
TRIGGER = "pymysql"

_METHODS = ("execute", "executemany", "callproc")


def where(cur: Any) -> tuple[str, str]:
    """``(peer, database)`` of a PyMySQL-style cursor (PyMySQL and aiomysql share it),
    worked out once per connection: the address does not change, the database (bytes in
    PyMySQL) is the ``db`` it connected with until ``select_db`` (noted by
    :data:`select_db`) or the application sets another ``db``."""
    conn = cur.connection
    if conn is None:
        return "", ""
    db = conn.db
    memo = getattr(conn, _ds.WHERE, None)  # (its ``db`` then, (peer, database))
    if memo is not None and memo[0] is db:
        return memo[1]  # type: ignore[no-any-return]
    return _remember(conn, db, db)


def _remember(conn: Any, key: Any, db: Any) -> tuple[str, str]:
    """The memo: ``(the connection's db then, (peer, database))``."""
    found = address(conn), _ds.text(db or "")
    _ds.remember(conn, (key, found))
    return found


def address(conn: Any) -> str:
    sock = getattr(conn, "unix_socket", None)
    return _ds.peer(conn.host, conn.port) if not sock else str(sock)


def _selected(conn: Any, db: Any) -> None:
    _remember(conn, conn.db, db)


# PyMySQL's and aiomysql's Connection.select_db: the memo names the database switched to.
select_db = selected(_selected)


def install(config: Config) -> None:
    from pymysql.connections import Connection  # noqa: PLC0415
    from pymysql.cursors import Cursor  # noqa: PLC0415

    _ds.configure(config)
    patch(Connection, "select_db", select_db)
    for m in _METHODS:
        patch(
            Cursor,
            m,
            _ds.cursor_method(
                m, "Mysql/PyMsql/", Component.PYMYSQL, "mysql", where, many=m == "executemany", memo_key="db"
            ),
        )


def uninstall() -> None:
    from pymysql.connections import Connection  # noqa: PLC0415
    from pymysql.cursors import Cursor  # noqa: PLC0415

    restore(Connection, "select_db")

    for m in _METHODS:
        restore(Cursor, m)
