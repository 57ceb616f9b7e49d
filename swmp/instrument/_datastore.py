"""What the database and cache instrumentations share: span creation with the SkyWalking tags,
the settings they honour, and the one check that keeps calls outside a trace free.

Every wrapper is the original outside a trace (:func:`swmp.instrument._gate.gated`): no
current span means no trace to join (a data-store call never starts a trace of its own), so
the only cost is one context-variable read, made in C when the native core is built. Inside
a trace, :func:`sql_span` (here) / ``cache_span`` (:mod:`swmp.instrument._cache_span`) open
an exit span (layer Database / Cache) that the wrapper runs the driver call in; an exit span
inside an exit span is a no-op, so a library calling another instrumented one (SQLAlchemy ->
psycopg, executemany -> execute) records one span.

Settings (read at install): ``SW_PLUGIN_SQL_PARAMETERS_MAX_LENGTH`` (0: no parameters; the
SkyWalking Python agent's name and format: ``[a,b]``, cut with ``...``),
``SW_PLUGIN_CACHE_COLLECT_KEYS``. ``db.statement`` and ``cache.key`` are cut to
``SW_AGENT_TAG_VALUE_MAX_LENGTH`` like every tag.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from swmp.instrument._gate import gated, named_like
from swmp.tracing import context as _ctx
from swmp.tracing.constants import (
    TAG_DB_INSTANCE,
    TAG_DB_SQL_PARAMETERS,
    TAG_DB_STATEMENT,
    TAG_DB_TYPE,
    Layer,
)
from swmp.tracing.limits import limits
from swmp.tracing.span import NO_TAGS, NOOP, NoopSpan, Span, current_span, native_core

if TYPE_CHECKING:
    from swmp.config import Config

# The single check on every wrapped call: None outside any trace.
outside = current_span.get
log = logging.getLogger("swmp.instrument")
_reported: set[str] = set()


# On a connection or pool: its spans' peer and database, worked out once for it.
WHERE = "_swmp_where"


def remember(owner: Any, value: Any) -> None:
    """Keep ``value`` on ``owner`` as its :data:`WHERE`; an object that takes no attributes
    has it worked out on every call instead."""
    try:
        setattr(owner, WHERE, value)
    except Exception:
        pass


def failed(where: str, e: Exception) -> NoopSpan:
    """An instrumentation could not read what it needs (a driver version that changed):
    log it once per place; the call goes on without a span."""
    if where not in _reported:
        _reported.add(where)
        log.warning("swmp: %s failed (%r); calls go on without spans", where, e, exc_info=True)
    return NOOP


def guarded(start: Callable[..., Any]) -> Callable[..., Any]:
    """``start`` (which reads the driver's arguments and opens a span) made unable to fail
    the application's call: see :func:`failed`."""
    where = f"{start.__module__}.{start.__qualname__}"

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return start(*args, **kwargs)
        except Exception as e:
            return failed(where, e)

    run.__name__ = start.__name__
    run.__qualname__ = start.__qualname__
    return run


_DATABASE = Layer.DATABASE


_new_exit = _ctx.new_exit_span  # native when the span core is built: no frame of its own


class _Settings:
    params_max = 0
    collect_keys = True


settings = _Settings()


def configure(config: Config) -> None:
    settings.params_max = config.plugin_sql_parameters_max_length
    settings.collect_keys = config.plugin_cache_collect_keys


_peers: dict[tuple[Any, Any], str] = {}


def peer(host: Any, port: Any) -> str:
    """``host:port``; a Unix socket path alone; IPv6 literals bracketed. A worker talks to a
    few servers: the text of each is made once (the memo is bounded: cleared when full)."""
    try:
        return _peers[host, port]
    except (KeyError, TypeError):  # TypeError: an unhashable host (never seen; still served)
        pass
    text = _peer_text(host, port)
    try:
        if len(_peers) >= 1024:
            _peers.clear()
        _peers[host, port] = text
    except TypeError:
        pass
    return text


def _peer_text(host: Any, port: Any) -> str:
    h = host.decode() if isinstance(host, bytes) else str(host or "")
    if h.startswith("/") or port in (None, ""):
        return h
    if ":" in h and not h.startswith("["):
        h = f"[{h}]"
    return f"{h}:{port}"


def text(value: Any) -> str:
    """A statement or key as text: bytes decoded, SQL objects through ``str``; never raises."""
    if value.__class__ is str:
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    try:
        return str(value)
    except Exception:
        return "<unprintable>"


def composed_text(query: Any, context: Any) -> Any:
    """psycopg's ``sql.SQL`` / ``sql.Composed`` queries as the SQL text they stand for (their
    ``str`` is a repr); anything else as it is."""
    if query.__class__ is str or not hasattr(query, "as_string"):
        return query
    try:
        return query.as_string(context)
    except Exception:
        return query


def _values(params: Any) -> Iterable[Any]:
    if isinstance(params, dict):
        return params.values()
    if isinstance(params, (list, tuple)):
        return params
    return (params,)


def params_text(params: Any, many: bool = False) -> str:
    """Parameters as the SkyWalking Python agent tags them: ``[1,a]`` or ``[[1,a],[2,b]]``,
    cut at ``SW_PLUGIN_SQL_PARAMETERS_MAX_LENGTH`` characters with ``...`` appended."""
    limit = settings.params_max
    if not many:
        body = ",".join(text(v) for v in _values(params))
        return f"[{body[:limit]}...]" if len(body) > limit else f"[{body}]"
    parts: list[str] = []
    room = limit
    for row in params:
        room = _add_row(parts, room, row)
        if room < 0:
            break
    return f"[{','.join(parts)}]"


def _add_row(parts: list[str], room: int, row: Any) -> int:
    """Add the text of ``executemany``'s ``row`` to ``parts``, which has ``room`` characters
    left; the room left after it (below 0: full, the row cut and marked ``...``)."""
    item = f"[{','.join(text(v) for v in _values(row))}]"
    room -= len(item)
    parts.append(item if room >= 0 else f"{item[:room]}...")
    return room


# Containers of ``executemany`` rows the tag can read without taking them from the driver.
_REREADABLE = (list, tuple, range, set, frozenset, deque)


class SeenRows:
    """Stands in for an application's one-shot iterator of ``executemany`` rows (a generator,
    ``map``...): the driver takes each row from it when it would take it from the iterator,
    so rows are read as the driver sends them, none before, and the text of the first ones is
    kept for the ``db.sql.parameters`` tag, written when the call ends: only what the tag
    shows, so memory stays bounded (the rows are not copied into a list)."""

    __slots__ = ("_it", "_parts", "_room")

    def __init__(self, it: Iterator[Any]) -> None:
        self._it = it
        self._parts: list[str] = []
        self._room = settings.params_max

    def __iter__(self) -> SeenRows:
        return self

    def __next__(self) -> Any:
        row = next(self._it)
        if self._room >= 0:
            try:
                self._room = _add_row(self._parts, self._room, row)
            except Exception:  # the rows matter more than the tag
                self._room = -1
        return row

    def tag(self, span: Span | NoopSpan) -> None:
        """Tag ``span`` with the rows the driver took; none taken, no tag (as an empty list)."""
        if self._parts:
            try:
                span.tag(TAG_DB_SQL_PARAMETERS, f"[{','.join(self._parts)}]")
            except Exception:
                pass


def many_rows(rows: Any) -> tuple[Any, Any, SeenRows | None]:
    """``executemany``'s rows as ``(what the driver gets, what the span's tag reads when it
    opens, the SeenRows that tags it when the call ends)``. A one-shot iterator is handed to
    the driver as a :class:`SeenRows`, which is true, lazy and iterable as the iterator is
    (an iterator whose type has ``__len__`` or ``__bool__`` could be false: the driver tests
    that, PyMySQL's ``if not args``, so it is left as it is). Any other iterable that is not
    a plain container might be one-shot too: it goes to the driver as it is, untagged."""
    if not settings.params_max or rows is None or isinstance(rows, _REREADABLE):
        return rows, rows, None
    kind = type(rows)
    if (
        hasattr(kind, "__next__")
        and hasattr(kind, "__iter__")
        and not hasattr(kind, "__len__")
        and not hasattr(kind, "__bool__")
    ):
        seen = SeenRows(rows)
        return seen, None, seen
    return rows, None, None


def _py_sql_span(  # noqa: PLR0917 (one call per query: positional is cheaper)
    op: str,
    address: str,
    component: int,
    db_type: str,
    instance: str,
    statement: Any,
    params: Any = None,
    many: bool = False,
) -> Span | NoopSpan:
    """An exit span for one SQL call, tagged ``db.type``/``db.instance``/``db.statement``
    (and ``db.sql.parameters`` when enabled): the reference form of the native ``sql_span``
    (swmp/_native/sql.c), which hands it every call of another shape."""
    span = _new_exit(op, address, component, _DATABASE)
    if span.__class__ is Span:
        if statement.__class__ is not str:
            statement = text(statement)
        if span.tags is NO_TAGS and len(statement) <= limits.tag_value_max:
            # The common case in one list (what three span.tag calls would build): this
            # runs on every traced query.
            span.tags = [TAG_DB_TYPE, db_type, TAG_DB_INSTANCE, instance, TAG_DB_STATEMENT, statement]
        else:
            span.tag(TAG_DB_TYPE, db_type)
            span.tag(TAG_DB_INSTANCE, instance)
            span.tag(TAG_DB_STATEMENT, statement)
        if params is not None and settings.params_max:
            try:
                span.tag(TAG_DB_SQL_PARAMETERS, params_text(params, many))
            except Exception:  # an exotic parameter container: the query matters more
                pass
    return span


# sql_span(op, address, component, db_type, instance, statement, params=None, many=False):
# native when the span core is built (no Python frame per traced query).
sql_span: Callable[..., Span | NoopSpan] = _py_sql_span
if native_core is not None and hasattr(native_core, "sql_span"):
    native_core.setup_sql(
        _py_sql_span,
        Span,
        NO_TAGS,
        limits,
        settings,
        text,
        params_text,
        _DATABASE,
        TAG_DB_TYPE,
        TAG_DB_INSTANCE,
        TAG_DB_STATEMENT,
        TAG_DB_SQL_PARAMETERS,
    )
    sql_span = native_core.sql_span


_SqlCall: Any = getattr(native_core, "SqlCall", None)


def traced_execute(  # noqa: PLR0917
    orig: Callable[..., Any],
    traced: Callable[..., Any],
    op: str,
    component: int,
    db_type: str,
    conn_attr: str,
    where: Callable[[Any], tuple[str, str]] | None = None,
    key_attr: str | None = None,
    truthy: bool = False,
    awaiting: bool = False,
) -> Callable[..., Any]:
    """What a gate calls while a span is current for a cursor's ``execute(query,
    params=None)``: with the native core, ``swmp._spancore.SqlCall`` (swmp/_native/sql.c),
    which runs the usual call in its exit span without a Python frame and hands every
    other to ``traced``, the Python form; else ``traced`` itself. ``awaiting``: an async
    driver's method (``traced`` an ``async def``), whose span opens when the call is
    awaited.

    The connection is ``getattr(cursor, conn_attr)``; its ``(peer, database)`` comes from
    ``where(connection)`` (with ``key_attr``, remembered for the connection's ``key_attr``
    object seen last: one whose answer never changes), or without ``where`` from the memo
    ``traced`` keeps on it as :data:`WHERE`: the pair itself, or with ``key_attr`` ``(the
    connection's key_attr then, pair)``. ``truthy``: empty parameters are no parameters
    (``params or None``)."""
    named_like(traced, orig)  # its binding errors name the driver's method (see there)
    if _SqlCall is None:
        return traced
    return _SqlCall(  # type: ignore[no-any-return]
        orig, traced, op, component, db_type, conn_attr, where, key_attr, truthy, awaiting
    )


def cursor_method(
    method: str,
    prefix: str,
    component: int,
    db_type: str,
    where: Callable[[Any], tuple[str, str]],
    *,
    many: bool = False,
    is_async: bool = False,
    memo_key: str | None = None,
    conn_attr: str = "connection",
) -> Callable[[Any], Any]:
    """A ``patch`` wrapper factory for a DB-API cursor method ``(self, query, args)``:
    operation ``prefix + method``; ``where(cursor)`` gives ``(peer, database)``. An async
    method's wrapper returns the driver's own coroutine outside a trace. ``memo_key``: the
    connection attribute whose object the memo ``where`` keeps there was made for, so that
    ``execute`` can be native (:func:`traced_execute`), which reads the connection as
    ``getattr(cursor, conn_attr)``."""
    op = prefix + method
    default = () if method == "callproc" else None

    place = f"{prefix}{method} ({where.__module__}.{where.__qualname__})"

    def make(orig: Any) -> Any:
        # Called without parameters, the driver is too (its default, or PyMySQL's TypeError).
        async def atraced(self: Any, query: Any, args: Any = _MISSING, *rest: Any) -> Any:
            given = args is not _MISSING
            if not given:
                args = default
            shown, seen = args, None
            if many and given:
                args, shown, seen = many_rows(args)
            try:  # guarded() inlined: this runs on every traced query
                address, db = where(self)
                span = sql_span(op, address, component, db_type, db, query, shown or None, many)
            except Exception as e:
                span = failed(place, e)
            with span:
                try:
                    if rest:
                        return await orig(self, query, args, *rest)
                    return await (orig(self, query, args) if given else orig(self, query))
                finally:
                    if seen is not None:
                        seen.tag(span)

        def straced(self: Any, query: Any, args: Any = _MISSING, *rest: Any) -> Any:
            given = args is not _MISSING
            if not given:
                args = default
            shown, seen = args, None
            if many and given:
                args, shown, seen = many_rows(args)
            try:  # guarded() inlined: this runs on every traced query
                address, db = where(self)
                span = sql_span(op, address, component, db_type, db, query, shown or None, many)
            except Exception as e:
                span = failed(place, e)
            # What ``with span:`` does, spelled out: two plain method calls are cheaper.
            span.__enter__()
            try:
                # Without ``*rest`` when there is none (the usual call): no argument tuple.
                if rest:
                    result = orig(self, query, args, *rest)
                else:
                    result = orig(self, query, args) if given else orig(self, query)
            except BaseException as e:
                if seen is not None:
                    seen.tag(span)
                span.__exit__(type(e), e, e.__traceback__)
                raise
            if seen is not None:
                seen.tag(span)
            span.__exit__(None, None, None)
            return result

        traced: Callable[..., Any] = atraced if is_async else straced
        if method == "callproc":
            traced = _procname(traced)
        elif method == "execute" and memo_key is not None:
            traced = traced_execute(
                orig, traced, op, component, db_type, conn_attr, None, memo_key, True, awaiting=is_async
            )
        return gated(orig, traced)

    return make


_MISSING: Any = object()


def _procname(traced: Callable[..., Any]) -> Callable[..., Any]:
    """``callproc(procname, args=())``: the drivers' own first parameter name, so a call
    that names it binds here as it does there."""

    def callproc(self: Any, procname: Any, args: Any = _MISSING, *rest: Any) -> Any:
        return traced(self, procname, args, *rest)

    return callproc


def async_traced(
    start: Callable[[Any, tuple[Any, ...], dict[str, Any]], Span | NoopSpan], orig: Callable[..., Any]
) -> Callable[..., Any]:
    """The async method ``orig`` run inside ``start(self, args, kwargs)``'s span, opened when
    the call is awaited (the Python form :func:`traced_method` and the async clients' native
    calls fall back to). ``start`` failing is logged once: the call goes on without a span."""
    place = f"{start.__module__}.{start.__qualname__}"

    async def atraced(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            span = start(self, args, kwargs)
        except Exception as e:
            span = failed(place, e)
        with span:
            return await orig(self, *args, **kwargs)

    return atraced


def traced_method(
    start: Callable[[Any, tuple[Any, ...], dict[str, Any]], Span | NoopSpan], *, is_async: bool = False
) -> Callable[[Any], Any]:
    """A ``patch`` wrapper factory: the method runs inside ``start(self, args, kwargs)``'s span
    when called inside a trace, and is called directly otherwise. For an async method, the
    wrapper returns the driver's own coroutine outside a trace. ``start`` failing is logged
    once (see :func:`failed`): the call goes on without a span."""

    place = f"{start.__module__}.{start.__qualname__}"

    def make(orig: Any) -> Any:
        if is_async:
            return gated(orig, async_traced(start, orig))

        def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:  # opened(), inlined: this runs on every traced call
                span = start(self, args, kwargs)
            except Exception as e:
                span = failed(place, e)
            span.__enter__()  # ``with span:`` spelled out: two plain calls are cheaper
            try:
                result = orig(self, *args, **kwargs)
            except BaseException as e:
                span.__exit__(type(e), e, e.__traceback__)
                raise
            span.__exit__(None, None, None)
            return result

        return gated(orig, traced)

    return make
