"""asyncpg: one exit span per statement sent to the server: ``execute`` (with and without
arguments), ``fetch`` / ``fetchrow`` / ``fetchval``, prepared statements, ``executemany``
and cursors (component AsyncPG, 7016; operation ``PostgreSQL/AsyncPG/bind`` as the
SkyWalking Python agent names it).

The wrapped methods are the connection protocol's ``bind_execute``, ``bind_execute_many``,
``bind`` (cursors) and ``query`` (simple queries), which every public call goes through, and
``prepare`` (``PostgreSQL/AsyncPG/prepare``: a statement not yet in the connection's cache is
parsed by the server first, and that is where most SQL errors show).
The protocol does not expose its address, so ``Connection.__init__`` is wrapped to leave
``(peer, database)`` on it; for a connection opened before the install, the first traced
call finds the protocol's connection once (see :func:`_late_where`).
"""

from __future__ import annotations

import gc
import inspect
import sys
from typing import TYPE_CHECKING, Any

from swmp.instrument import _datastore as _ds
from swmp.instrument._gate import gated
from swmp.instrument._patch import patch_all, restore_all
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from collections.abc import Callable

    from swmp.config import Config

NAME = "asyncpg"
PEER_NAMES = ("sw_asyncpg",)
PACKAGE = "asyncpg"
SUPPORTED = ("0.25", "1")
TRIGGER = "asyncpg"

_COMPONENT = Component.ASYNCPG
_OP = "PostgreSQL/AsyncPG/bind"  # the SkyWalking Python agent's name for every call


def _where_of(conn: Any) -> tuple[str, str]:
    addr = conn._addr
    address = _ds.peer(addr[0], addr[1]) if isinstance(addr, tuple) else str(addr)
    return address, conn._params.database or ""


def _init(orig: Any) -> Any:
    def __init__(
        self: Any, protocol: Any, transport: Any, loop: Any, addr: Any, *args: Any, **kwargs: Any
    ) -> None:
        orig(self, protocol, transport, loop, addr, *args, **kwargs)
        try:
            protocol._swmp_where = _where_of(self)
        except Exception:  # never fail a connection over a tag
            pass

    return __init__


def _late_where(proto: Any) -> tuple[str, str]:
    """``(peer, database)`` of a protocol whose connection was opened before the install (its
    ``__init__`` ran unwrapped): the protocol keeps its connection only in a C field, so the
    connection is found once, then kept on the protocol. First the callers' frames (every
    asyncpg call reaches the protocol from a method of the connection, its prepared statement
    or its cursor, a few frames up), then, should a later asyncpg call it otherwise, the
    objects that refer to the protocol (the connection holds it in ``_protocol``)."""
    from asyncpg.connection import Connection  # noqa: PLC0415

    def owner(obj: Any) -> Any:
        for c in (obj, getattr(obj, "_connection", None)):
            if isinstance(c, Connection) and c._protocol is proto:
                return c
        return None

    conn = None
    frame: Any = sys._getframe(1)
    for _ in range(12):
        if frame is None:
            break
        conn = owner(frame.f_locals.get("self"))
        if conn is not None:
            break
        frame = frame.f_back
    del frame
    if conn is None:
        conn = next((c for c in gc.get_referrers(proto) if owner(c) is not None), None)
    where = _where_of(conn) if conn is not None else ("", "")
    try:
        proto._swmp_where = where
    except Exception:  # a protocol that takes no attributes: looked for again next time
        pass
    return where


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], pos: int, name: str) -> Any:
    """An argument asyncpg passes by position or (newer versions) by keyword."""
    if len(args) > pos:
        return args[pos]
    return kwargs.get(name)


def _traced(
    op: str, stmt_name: str, params_name: str | None, many: bool = False, stmt_pos: int = 0
) -> Callable[[Any], Any]:
    """A wrapper for a protocol coroutine method whose argument ``stmt_name`` (at ``stmt_pos``)
    is the prepared statement state or the query text and whose second argument
    (``params_name``) holds the query's arguments."""

    def make(orig: Any) -> Any:
        def start(proto: Any, args: tuple[Any, ...], kwargs: dict[str, Any], params: Any) -> Any:
            try:  # inlined guarded(): this runs on every traced query
                address, db = getattr(proto, "_swmp_where", None) or _late_where(proto)
                stmt = args[stmt_pos] if len(args) > stmt_pos else kwargs.get(stmt_name)
                query = stmt if stmt.__class__ is str else getattr(stmt, "query", "")
                return _ds.sql_span(op, address, _COMPONENT, "PostgreSQL", db, query, params, many)
            except Exception as e:
                return _ds.failed(place, e)

        place = f"{start.__module__}.{start.__qualname__}"

        async def traced(proto: Any, *args: Any, **kwargs: Any) -> Any:
            params = _arg(args, kwargs, 1, params_name) if params_name else None
            if not many:
                with start(proto, args, kwargs, params):
                    return await orig(proto, *args, **kwargs)
            # A one-shot iterator of rows is read by asyncpg as it would be (lazily, as it
            # encodes them), noted on the way for the parameters tag.
            rows, shown, seen = _ds.many_rows(params)
            if seen is not None:
                if len(args) > 1:
                    args = (args[0], rows, *args[2:])
                else:
                    kwargs[str(params_name)] = rows
            span = start(proto, args, kwargs, shown)
            with span:
                try:
                    return await orig(proto, *args, **kwargs)
                finally:
                    if seen is not None:
                        seen.tag(span)

        return gated(orig, traced)  # outside a trace: the original itself

    return make


_BIND_EXECUTE = ("self", "state", "args", "portal_name", "limit", "return_extra", "timeout")


def _bind_execute(orig: Any) -> Any:
    """``bind_execute``, the call behind every ``fetch*`` and ``execute`` with arguments: with
    its own parameters spelled out when the protocol's are the known six (asyncpg passes
    them by keyword: a ``**kwargs`` pass-through costs ~5x what the wrapper does), else the
    generic wrapper."""
    generic = _traced(_OP, "state", "args")(orig)
    try:
        params = list(inspect.signature(orig).parameters.values())
    except (TypeError, ValueError):
        return generic
    if tuple(p.name for p in params) != _BIND_EXECUTE or any(
        p.kind is not p.POSITIONAL_OR_KEYWORD or p.default is not p.empty for p in params
    ):
        return generic
    place = f"{__name__}._traced.<locals>.make.<locals>.start"

    async def traced(  # noqa: PLR0917
        proto: Any, state: Any, args: Any, portal_name: Any, limit: Any, return_extra: Any, timeout: Any
    ) -> Any:
        try:
            address, db = getattr(proto, "_swmp_where", None) or _late_where(proto)
            query = state if state.__class__ is str else getattr(state, "query", "")
            span = _ds.sql_span(_OP, address, _COMPONENT, "PostgreSQL", db, query, args)
        except Exception as e:
            span = _ds.failed(place, e)
        with span:
            return await orig(proto, state, args, portal_name, limit, return_extra, timeout)

    return gated(orig, traced)  # outside a trace: the original itself, keywords and all


def _targets() -> list[tuple[Any, str, Callable[[Any], Any]]]:
    from asyncpg.connection import Connection  # noqa: PLC0415
    from asyncpg.protocol import Protocol  # noqa: PLC0415

    return [
        (Connection, "__init__", _init),
        (Protocol, "bind_execute", _bind_execute),
        (Protocol, "bind_execute_many", _traced(_OP, "state", "args", many=True)),
        (Protocol, "bind", _traced(_OP, "state", "args")),
        (Protocol, "query", _traced(_OP, "query", None)),
        # A statement the connection has not prepared yet is parsed first: a round trip of its
        # own, and where most SQL errors (syntax, missing tables) surface.
        (Protocol, "prepare", _traced("PostgreSQL/AsyncPG/prepare", "query", None, stmt_pos=1)),
    ]


def install(config: Config) -> None:
    _ds.configure(config)
    patch_all(_targets(), inherited=True)  # Protocol inherits them from a compiled base


def uninstall() -> None:
    restore_all(_targets())
