"""aiomysql: one exit span per ``Cursor.execute`` / ``executemany`` / ``callproc`` awaited,
every cursor class included (component Mysql, 5: aiomysql has no id of its own; operation
``Mysql/AioMysql/<method>``). The SkyWalking Python agent has no aiomysql plugin.
``db.instance`` follows ``Connection.select_db``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from swmp.instrument import _datastore as _ds
from swmp.instrument._patch import patch, restore
from swmp.instrument.pymysql import select_db, where
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "aiomysql"
PEER_NAMES: tuple[str, ...] = ()  # the SkyWalking Python agent has no aiomysql plugin
PACKAGE = "aiomysql"
SUPPORTED = ("0.1", "1")
TRIGGER = "aiomysql"

_METHODS = ("execute", "executemany", "callproc")


def install(config: Config) -> None:
    from aiomysql.connection import Connection  # noqa: PLC0415
    from aiomysql.cursors import Cursor  # noqa: PLC0415

    _ds.configure(config)
    patch(Connection, "select_db", select_db)
    for m in _METHODS:
        patch(
            Cursor,
            m,
            _ds.cursor_method(
                m,
                "Mysql/AioMysql/",
                Component.MYSQL,
                "mysql",
                where,
                many=m == "executemany",
                is_async=True,
                memo_key="db",
            ),
        )


def uninstall() -> None:
    from aiomysql.connection import Connection  # noqa: PLC0415
    from aiomysql.cursors import Cursor  # noqa: PLC0415

    restore(Connection, "select_db")

    for m in _METHODS:
        restore(Cursor, m)
