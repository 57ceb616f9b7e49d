"""mysqlclient (``MySQLdb``): one exit span per cursor ``execute`` / ``executemany`` /
``callproc`` (component MysqlClient, 7013; operation ``Mysql/MysqlClient/<method>`` as the
SkyWalking Python agent names it); ``db.instance`` follows ``Connection.select_db``. Skipped
when ``MySQLdb`` is PyMySQL in disguise (``pymysql.install_as_MySQLdb()``): the PyMySQL
instrumentation covers that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument import _datastore as _ds
from swmp.instrument._patch import patch, restore
from swmp.instrument._select_db import selected
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "mysqlclient"
PEER_NAMES = ("sw_mysqlclient",)
PACKAGE = "mysqlclient"
SUPPORTED = ("1.4", "3")
TRIGGER = "MySQLdb"

_METHODS = ("execute", "executemany", "callproc")


def _where(cur: Any) -> tuple[str, str]:
    """``(peer, database)``, worked out once per connection (and database attribute)."""
    conn = cur.connection  # a weak proxy in mysqlclient
    if conn is None:
        return "", ""
    # mysqlclient >= 2.2 keeps host and database on the connection (the C part has port).
    db = getattr(conn, "database", "")
    memo = getattr(conn, _ds.WHERE, None)  # (its ``database`` then, (peer, database))
    if memo is not None and memo[0] is db:
        return memo[1]  # type: ignore[no-any-return]
    return _remember(conn, db, db)


def _remember(conn: Any, key: Any, db: Any) -> tuple[str, str]:
    """The memo: ``(the connection's database attribute then, (peer, database))``."""
    host = getattr(conn, "host", None) or "localhost"
    found = _ds.peer(host, getattr(conn, "port", 3306)), _ds.text(db or "")
    _ds.remember(conn, (key, found))
    return found


def _selected(conn: Any, db: Any) -> None:
    _remember(conn, getattr(conn, "database", ""), db)


def _base() -> Any:
    import MySQLdb  # noqa: PLC0415

    if hasattr(MySQLdb, "install_as_MySQLdb"):  # PyMySQL installed as MySQLdb
        return None
    import MySQLdb.cursors  # noqa: PLC0415 (MySQLdb/__init__ does not import it)

    return MySQLdb.cursors.BaseCursor


def install(config: Config) -> None:
    base = _base()
    if base is None:
        return
    import MySQLdb.connections  # noqa: PLC0415

    _ds.configure(config)
    # select_db is the compiled base class's: wrapped on the Python Connection class.
    patch(MySQLdb.connections.Connection, "select_db", selected(_selected), inherited=True)
    for m in _METHODS:
        patch(
            base,
            m,
            _ds.cursor_method(
                m,
                "Mysql/MysqlClient/",
                Component.MYSQLCLIENT,
                "mysql",
                _where,
                many=m == "executemany",
                memo_key="database",
            ),
        )


def uninstall() -> None:
    base = _base()
    if base is None:
        return
    import MySQLdb.connections  # noqa: PLC0415

    restore(MySQLdb.connections.Connection, "select_db")
    for m in _METHODS:
        restore(base, m)
