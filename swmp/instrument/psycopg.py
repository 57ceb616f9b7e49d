"""psycopg 3, sync and async: one exit span per ``execute`` / ``executemany`` (client-side,
server-side, raw and client-binding cursors, and ``Connection.execute``), per ``stream``
(from its first row until the rows are consumed) and per ``copy`` block (component
Psycopg, 7010; operation ``PostgreSQL/Psycopg/<method>`` as the SkyWalking Python agent
names it).

psycopg 3's cursors are Python classes: their methods are wrapped in place, so every
cursor class derived from them is covered and nothing about the objects changes.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from swmp.instrument import _datastore as _ds
from swmp.instrument._gate import gated
from swmp.instrument._lazy_span import SpanAround, span_over_async_iterator, span_over_iterator
from swmp.instrument._patch import patch_all, restore_all
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from collections.abc import Callable

    from swmp.config import Config

NAME = "psycopg"
PEER_NAMES = ("sw_psycopg",)
PACKAGE = "psycopg"
SUPPORTED = ("3.1", "4")
TRIGGER = "psycopg"

_COMPONENT = Component.PSYCOPG
# id(connection) -> (peer, dbname, a weak reference to the connection). Weak: a connection
# the application drops without closing it must be freed (and its server session ended) as
# without the agent; the reference also tells a reused id from the connection it was.
_where_cache: dict[int, tuple[str, str, Any]] = {}


def _where(conn: Any) -> tuple[str, str]:
    """``(host:port, dbname)`` of a connection (psycopg's objects take no new attributes, so
    the answer is kept here, for the connection's life)."""
    key = id(conn)
    cached = _where_cache.get(key)
    if cached is None or cached[2]() is not conn:
        try:
            info = conn.info
            peer, db = _ds.peer(info.host, info.port), info.dbname or ""
        except Exception:
            peer, db = "", ""
        try:
            ref = weakref.ref(conn)
        except TypeError:  # not a psycopg connection: not remembered
            return peer, db
        if len(_where_cache) > 4096:
            _where_cache.clear()
        cached = _where_cache[key] = (peer, db, ref)
    return cached[0], cached[1]


_PLACE = f"{__name__}._span"
_OP_EXECUTE = "PostgreSQL/Psycopg/execute"


def _span(cur: Any, method: str, query: Any, params: Any, many: bool = False) -> Any:
    try:  # guarded (see _datastore.failed): a span that cannot open never fails the query
        address, db = _where(cur._conn)
        if query.__class__ is not str:
            query = _ds.composed_text(query, cur)
        return _ds.sql_span(
            "PostgreSQL/Psycopg/" + method, address, _COMPONENT, "PostgreSQL", db, query, params, many
        )
    except Exception as e:
        return _ds.failed(_PLACE, e)


def _execute(orig: Any) -> Any:
    # execute(query, params=None, *, prepare=None, binary=None): the cursors' own names, so
    # a call by keyword binds here as it would there. Outside a trace: the original itself.
    def execute(self: Any, query: Any, params: Any = None, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            with _span(self, "execute", query, params):
                return orig(self, query, params, *args, **kwargs)
        # The usual call: no argument tuple or dict rebuilt.
        span = _span(self, "execute", query, params)
        span.__enter__()  # ``with span:`` spelled out: cheaper
        try:
            result = orig(self, query, params)
        except BaseException as e:
            span.__exit__(type(e), e, e.__traceback__)
            raise
        span.__exit__(None, None, None)
        return result

    return gated(
        orig,
        _ds.traced_execute(orig, execute, _OP_EXECUTE, _COMPONENT, "PostgreSQL", "_conn", _where, "pgconn"),
    )


def _aexecute(orig: Any) -> Any:
    async def execute(self: Any, query: Any, params: Any = None, *args: Any, **kwargs: Any) -> Any:
        with _span(self, "execute", query, params):
            return await orig(self, query, params, *args, **kwargs)

    # A str query with positional parameters: in C, the span opened when the call is
    # awaited (swmp/_native/within.c's lazy form); anything else in this Python form.
    return gated(
        orig,
        _ds.traced_execute(
            orig, execute, _OP_EXECUTE, _COMPONENT, "PostgreSQL", "_conn", _where, "pgconn", awaiting=True
        ),
    )


# executemany: a one-shot iterator of rows is read by psycopg as it would be (one row at a
# time, inside its pipeline), noted on the way for the parameters tag (_datastore.many_rows).
def _executemany(orig: Any) -> Any:
    def executemany(self: Any, query: Any, params_seq: Any, *args: Any, **kwargs: Any) -> Any:
        params_seq, shown, seen = _ds.many_rows(params_seq)
        span = _span(self, "executemany", query, shown, many=True)
        with span:
            try:
                return orig(self, query, params_seq, *args, **kwargs)
            finally:
                if seen is not None:
                    seen.tag(span)

    return gated(orig, executemany)


def _aexecutemany(orig: Any) -> Any:
    async def executemany(self: Any, query: Any, params_seq: Any, *args: Any, **kwargs: Any) -> Any:
        params_seq, shown, seen = _ds.many_rows(params_seq)
        span = _span(self, "executemany", query, shown, many=True)
        with span:
            try:
                return await orig(self, query, params_seq, *args, **kwargs)
            finally:
                if seen is not None:
                    seen.tag(span)

    return gated(orig, executemany)


def _stream(orig: Any) -> Any:
    def stream(self: Any, query: Any, params: Any = None, *args: Any, **kwargs: Any) -> Any:
        rows = orig(self, query, params, *args, **kwargs)
        return span_over_iterator(lambda: _span(self, "stream", query, params), rows)

    return gated(orig, stream)


def _astream(orig: Any) -> Any:
    def stream(self: Any, query: Any, params: Any = None, *args: Any, **kwargs: Any) -> Any:
        rows = orig(self, query, params, *args, **kwargs)
        return span_over_async_iterator(lambda: _span(self, "stream", query, params), rows)

    return gated(orig, stream)


def _copy(orig: Any) -> Any:
    def copy(self: Any, statement: Any, params: Any = None, *args: Any, **kwargs: Any) -> Any:
        cm = orig(self, statement, params, *args, **kwargs)
        return SpanAround(cm, lambda: _span(self, "copy", statement, params))

    return gated(orig, copy)


def _targets() -> list[tuple[Any, str, Callable[[Any], Any]]]:
    import psycopg  # noqa: PLC0415

    return [
        (psycopg.Cursor, "execute", _execute),
        (psycopg.ServerCursor, "execute", _execute),
        (psycopg.Cursor, "executemany", _executemany),
        (psycopg.Cursor, "stream", _stream),
        (psycopg.Cursor, "copy", _copy),
        (psycopg.AsyncCursor, "execute", _aexecute),
        (psycopg.AsyncServerCursor, "execute", _aexecute),
        (psycopg.AsyncCursor, "executemany", _aexecutemany),
        (psycopg.AsyncCursor, "stream", _astream),
        (psycopg.AsyncCursor, "copy", _copy),
    ]


def install(config: Config) -> None:
    _ds.configure(config)
    patch_all(_targets())


def uninstall() -> None:
    restore_all(_targets())
