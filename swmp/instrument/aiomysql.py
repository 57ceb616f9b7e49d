"""aiomysql: one exit span per ``Cursor.execute`` / ``executemany`` / ``callproc`` awaited,
every cursor class included (component Mysql, 5: aiomysql has no id of its own; operation
``Mysql/AioMysql/<method>``). The SkyWalking Python agent has no aiomysql plugin.
``db.instance`` follows ``Connection.select_db``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument import _datastore as _ds
from swmp.instrument._patch import patch, restore
from swmp.instrument.pymysql import select_db, where
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from collections.abc import Callable

    from swmp.config import Config

NAME = "aiomysql"
PEER_NAMES: tuple[str, ...] = ()  # the SkyWalking Python agent has no aiomysql plugin
PACKAGE = "aiomysql"
SUPPORTED = ("0.1", "1")
TRIGGER = "aiomysql"

_METHODS = ("execute", "executemany", "callproc")


def method(name: str) -> Callable[[Any], Any]:
    """The ``patch`` wrapper factory of ``Cursor.<name>``."""
    return _ds.cursor_method(
        name,
        "Mysql/AioMysql/",
        Component.MYSQL,
        "mysql",
        where,
        many=name == "executemany",
        is_async=True,
        # The fields aiomysql's ``connection`` and ``db`` properties return, read by the
        # native path without the properties' Python frames.
        memo_key="_db",
        conn_attr="_connection",
    )


def install(config: Config) -> None:
    from aiomysql.connection import Connection  # noqa: PLC0415
    from aiomysql.cursors import Cursor  # noqa: PLC0415

    _ds.configure(config)
    patch(Connection, "select_db", select_db)
    for m in _METHODS:
        patch(Cursor, m, method(m))


def uninstall() -> None:
    from aiomysql.connection import Connection  # noqa: PLC0415
    from aiomysql.cursors import Cursor  # noqa: PLC0415

    restore(Connection, "select_db")

    for m in _METHODS:
        restore(Cursor, m)
