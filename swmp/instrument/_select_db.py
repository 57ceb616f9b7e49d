"""A MySQL connection's ``select_db``, noted for its spans' ``db.instance``.

PyMySQL, aiomysql and mysqlclient keep the database they connected with in their own
attributes whatever ``select_db`` switched to; their spans name the database from a memo
per connection (``_datastore.WHERE``), which the wrapped ``select_db`` updates.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from swmp.instrument._datastore import failed, remember, text


def selected(key_attr: str, address: Callable[[Any], str]) -> Callable[[Any], Any]:
    """A patch factory for ``select_db``, sync or async like the original: once it returned,
    the memo is ``(the connection's key_attr, (address(connection), the new database))``.
    The driver's result or exception is the caller's, unchanged."""

    def note(conn: Any, db: Any) -> None:
        try:
            remember(conn, (getattr(conn, key_attr, None), (address(conn), text(db or ""))))
        except Exception as e:
            failed("select_db", e)

    def make(orig: Any) -> Any:
        if inspect.iscoroutinefunction(orig):

            async def select_db_async(self: Any, db: Any) -> Any:
                result = await orig(self, db)
                note(self, db)
                return result

            return select_db_async

        def select_db(self: Any, db: Any) -> Any:
            result = orig(self, db)
            note(self, db)
            return result

        return select_db

    return make
