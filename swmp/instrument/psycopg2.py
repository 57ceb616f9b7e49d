"""psycopg2 (and psycopg2-binary): one exit span per ``execute`` / ``executemany`` /
``callproc`` / ``copy_expert`` (component Psycopg, 7010; operation
``PostgreSQL/Psycopg/<method>`` as the SkyWalking Python agent names it).

psycopg2's connection and cursor are C types whose methods cannot be replaced, so
``psycopg2.connect`` is wrapped to build the connection from a subclass of the requested
``connection_factory`` whose ``cursor()`` hands out a subclass of the requested cursor class
with the traced methods. Subclasses keep ``isinstance`` checks, ``cursor_factory`` choices
(``RealDictCursor``...), server-side (named) cursors, iteration and context managers as
they were; connections made before the install are not traced.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument import _datastore as _ds
from swmp.instrument._gate import gated
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "psycopg2"
PEER_NAMES = ("sw_psycopg2",)
PACKAGE = "psycopg2"  # psycopg2-binary has another distribution name: no version check then
SUPPORTED = ("2.8", "3")
TRIGGER = "psycopg2"

_COMPONENT = Component.PSYCOPG
_traced: dict[type, type] = {}  # original class -> traced subclass
_saved: dict[str, Any] = {}
_CURSOR_PARAMS = ("name", "cursor_factory", "withhold", "scrollable")  # connection.cursor()'s


def _where(conn: Any) -> tuple[str, str]:
    """``(host:port, dbname)`` of a connection, computed once per connection."""
    cached = conn.__dict__.get("_swmp_where")
    if cached is None:
        try:
            info = conn.info
            cached = (_ds.peer(info.host, info.port), info.dbname or "")
        except Exception:
            cached = ("", "")
        conn.__dict__["_swmp_where"] = cached
    return cached  # type: ignore[no-any-return]


_PLACE = f"{__name__}._span"
_OP_EXECUTE = "PostgreSQL/Psycopg/execute"


def _span(cur: Any, method: str, statement: Any, params: Any, many: bool = False) -> Any:
    try:  # guarded (see _datastore.failed): a span that cannot open never fails the query
        address, db = _where(cur.connection)
        if statement.__class__ is not str:
            statement = _ds.composed_text(statement, cur)
        return _ds.sql_span(
            "PostgreSQL/Psycopg/" + method, address, _COMPONENT, "PostgreSQL", db, statement, params, many
        )
    except Exception as e:
        return _ds.failed(_PLACE, e)


def _by_name(
    args: tuple[Any, ...], kwargs: dict[str, Any], first: str, second: str
) -> tuple[Any, Any] | None:
    """The first two arguments of a call, by position or by psycopg2's names for them
    (``second`` None when not given); None when the first is given neither way."""
    if args:
        return args[0], args[1] if len(args) > 1 else kwargs.get(second)
    if first in kwargs:
        return kwargs[first], kwargs.get(second)
    return None


def _traced_cursor(base: type) -> type:
    cls = _traced.get(base)
    if cls is not None:
        return cls
    # The base class's methods, looked up once (``super().execute`` builds a super object
    # and searches the MRO on every call).
    methods: Any = base
    b_execute = methods.execute
    b_executemany = methods.executemany
    b_callproc = methods.callproc
    b_copy_expert = methods.copy_expert

    # Each passes its arguments on as it was given them (a cursor class of the application's
    # may have its own names and options), and reads the query and its parameters from them
    # by psycopg2's names; a call without the query by either is run untraced.
    def traced_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = _by_name(args, kwargs, "query", "vars")
        if given is None:
            return b_execute(self, *args, **kwargs)
        span = _span(self, "execute", *given)
        span.__enter__()  # ``with span:`` spelled out: the call every query makes
        try:
            result = b_execute(self, *args, **kwargs)
        except BaseException as e:
            span.__exit__(type(e), e, e.__traceback__)
            raise
        span.__exit__(None, None, None)
        return result

    def traced_executemany(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = _by_name(args, kwargs, "query", "vars_list")
        if given is None:
            return b_executemany(self, *args, **kwargs)
        query, vars_list = given
        # A one-shot iterator of rows is read by psycopg2 as it would be, noted on the way.
        vars_list, shown, seen = _ds.many_rows(vars_list)
        if seen is not None:
            if len(args) > 1:
                args = (args[0], vars_list, *args[2:])
            else:
                kwargs["vars_list"] = vars_list
        span = _span(self, "executemany", query, shown, many=True)
        with span:
            try:
                return b_executemany(self, *args, **kwargs)
            finally:
                if seen is not None:
                    seen.tag(span)

    def traced_callproc(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = _by_name(args, kwargs, "procname", "parameters")
        if given is None:
            return b_callproc(self, *args, **kwargs)
        with _span(self, "callproc", *given):
            return b_callproc(self, *args, **kwargs)

    def traced_copy_expert(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = _by_name(args, kwargs, "sql", "file")
        if given is None:
            return b_copy_expert(self, *args, **kwargs)
        with _span(self, "copy_expert", given[0], None):
            return b_copy_expert(self, *args, **kwargs)

    class TracedCursor(base):  # type: ignore[misc]
        # Outside a trace each is the base class's own method (the check in C, see _gate).
        execute = gated(
            b_execute,
            _ds.traced_execute(
                b_execute, traced_execute, _OP_EXECUTE, _COMPONENT, "PostgreSQL", "connection"
            ),
        )
        executemany = gated(b_executemany, traced_executemany)
        callproc = gated(b_callproc, traced_callproc)
        copy_expert = gated(b_copy_expert, traced_copy_expert)

    TracedCursor.__name__ = base.__name__
    TracedCursor.__qualname__ = base.__qualname__
    TracedCursor.__module__ = base.__module__
    _traced[base] = TracedCursor
    return TracedCursor


# Only a named cursor takes them (psycopg2 refuses them on an unnamed one).
_NAMED_ONLY = ("name", "withhold", "scrollable")


def _chosen(conn: Any, kwargs: dict[str, Any]) -> type | None:
    """The cursor class a connection class's own ``cursor()`` hands out (``conn`` bound to
    it), asked of an unnamed cursor: psycopg2 sends nothing to make or close one, while
    closing a named cursor that never ran asks the server whether a cursor of that name is
    open and closes it (the application's refcursor, see psycopg2's docs). None when it
    cannot be asked: the call is then made as given, untraced, and fails as it fails."""
    try:
        probe = conn.cursor(**{k: v for k, v in kwargs.items() if k not in _NAMED_ONLY})
        probe.close()
    except Exception:
        return None
    return type(probe)


def _traced_connection(base: type) -> type:
    cls = _traced.get(base)
    if cls is not None:
        return cls
    from psycopg2.extensions import connection as plain_connection  # noqa: PLC0415
    from psycopg2.extensions import cursor as plain_cursor  # noqa: PLC0415

    # psycopg2.extras' DictConnection, LoggingConnection... choose their default cursor class
    # in their own cursor(): ask them which, then hand out the traced subclass of it.
    own_cursor = getattr(base, "cursor", None) is not plain_connection.cursor

    class TracedConnection(base):  # type: ignore[misc]
        def cursor(self, *args: Any, **kwargs: Any) -> Any:
            # Too many arguments, or one given both by position and by name: the call as
            # given, for psycopg2's own TypeError.
            if len(args) > len(_CURSOR_PARAMS) or not kwargs.keys().isdisjoint(_CURSOR_PARAMS[: len(args)]):
                return super().cursor(*args, **kwargs)
            if args:  # psycopg2 takes every one of them by keyword too
                kwargs.update(zip(_CURSOR_PARAMS, args, strict=False))
            factory = kwargs.get("cursor_factory")
            if factory is None:
                kwargs.pop("cursor_factory", None)
                if own_cursor:
                    factory = _chosen(super(), kwargs)
                    if factory is None:
                        return super().cursor(**kwargs)
                else:
                    factory = self.cursor_factory or plain_cursor
            # psycopg2 takes any callable that makes a cursor; only a class can be subclassed
            # with the traced methods: the cursors of any other are not traced.
            if isinstance(factory, type):
                try:
                    kwargs["cursor_factory"] = _traced_cursor(factory)
                except Exception as e:
                    _ds.failed(f"{__name__}._traced_cursor", e)
            return super().cursor(**kwargs)

    TracedConnection.__name__ = base.__name__
    TracedConnection.__qualname__ = base.__qualname__
    TracedConnection.__module__ = base.__module__
    _traced[base] = TracedConnection
    return TracedConnection


def install(config: Config) -> None:
    import psycopg2  # noqa: PLC0415
    from psycopg2.extensions import connection as plain_connection  # noqa: PLC0415

    _ds.configure(config)
    if "connect" in _saved:
        return
    orig = psycopg2.connect

    def connect(
        dsn: Any = None, connection_factory: Any = None, cursor_factory: Any = None, **kwargs: Any
    ) -> Any:
        try:
            factory = _traced_connection(connection_factory or plain_connection)
        except Exception:  # a factory we cannot subclass: leave it untraced
            factory = connection_factory
        return orig(dsn, connection_factory=factory, cursor_factory=cursor_factory, **kwargs)

    connect.__wrapped__ = orig  # type: ignore[attr-defined]
    connect.__doc__ = orig.__doc__
    _saved["connect"] = orig
    psycopg2.connect = connect


def uninstall() -> None:
    import psycopg2  # noqa: PLC0415

    orig = _saved.pop("connect", None)
    if orig is not None:
        psycopg2.connect = orig
