"""PyMySQL: one exit span per ``Cursor.execute`` / ``executemany`` / ``callproc``, every
cursor class included (component PyMysql, 7003; operation ``Mysql/PyMsql/<method>``, the
SkyWalking Python agent's spelling, so its dashboards and alarms keep matching).
``executemany`` that PyMySQL splits into several ``execute`` calls is one span.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument import _datastore as _ds
from swmp.instrument._patch import patch, restore
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
    worked out once per connection and database: the address does not change, the database
    only through ``select_db`` (a new ``db`` object), and PyMySQL keeps it as bytes."""
    conn = cur.connection
    if conn is None:
        return "", ""
    db = conn.db
    memo = getattr(conn, _ds.WHERE, None)  # (its ``db`` then, (peer, database))
    if memo is not None and memo[0] is db:
        return memo[1]  # type: ignore[no-any-return]
    sock = getattr(conn, "unix_socket", None)
    address = _ds.peer(conn.host, conn.port) if not sock else str(sock)
    found = address, _ds.text(db or "")
    _ds.remember(conn, (db, found))
    return found


def install(config: Config) -> None:
    from pymysql.cursors import Cursor  # noqa: PLC0415

    _ds.configure(config)
    for m in _METHODS:
        patch(
            Cursor,
            m,
            _ds.cursor_method(m, "Mysql/PyMsql/", Component.PYMYSQL, "mysql", where, many=m == "executemany"),
        )


def uninstall() -> None:
    from pymysql.cursors import Cursor  # noqa: PLC0415

    for m in _METHODS:
        restore(Cursor, m)
