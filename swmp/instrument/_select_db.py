"""A MySQL connection's ``select_db``, noted for its spans' ``db.instance``.

PyMySQL, aiomysql and mysqlclient keep the database they connected with in their own
attributes whatever ``select_db`` switched to; their spans name the database from a memo
per connection (``_datastore.WHERE``), which the wrapped ``select_db`` updates through the
driver module's own function (the module that reads the memo is the one that writes it).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from swmp.instrument._datastore import failed


def selected(note: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
    """A patch factory for ``select_db``, sync or async like the original: once it returned,
    ``note(connection, database)`` (the driver module's, which knows its memo's layout).
    The driver's result or exception is the caller's, unchanged."""

    def noted(conn: Any, db: Any) -> None:
        try:
            note(conn, db)
        except Exception as e:
            failed("select_db", e)

    def make(orig: Any) -> Any:
        if inspect.iscoroutinefunction(orig):

            async def select_db_async(self: Any, db: Any) -> Any:
                result = await orig(self, db)
                noted(self, db)
                return result

            return select_db_async

        def select_db(self: Any, db: Any) -> Any:
            result = orig(self, db)
            noted(self, db)
            return result

        return select_db

    return make
