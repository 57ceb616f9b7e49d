"""redis-py, sync and ``redis.asyncio``: one exit span per command (``Redis/<COMMAND>``, as
the SkyWalking Python agent names it; Pub/Sub ``PUBLISH`` included) and one per pipeline or
transaction execution (``Redis/PIPELINE`` or ``Redis/MULTI``, ``cache.cmd`` listing its
commands). Component Redis (7), layer Cache; tags ``cache.type``, ``cache.cmd``,
``cache.op`` (read/write), ``cache.key`` (unless ``SW_PLUGIN_CACHE_COLLECT_KEYS=false``) and
``db.instance`` (the database index).

Not covered: ``RedisCluster``, and commands a pipeline runs at once while it ``WATCH``es.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument import _datastore as _ds
from swmp.instrument._patch import patch_all, restore_all
from swmp.tracing.constants import Component
from swmp.tracing.span import NOOP

if TYPE_CHECKING:
    from collections.abc import Callable

    from swmp.config import Config

NAME = "redis"
PEER_NAMES = ("sw_redis",)
PACKAGE = "redis"
SUPPORTED = ("4.0", "9")
TRIGGER = "redis"

_COMPONENT = Component.REDIS
_outside = _ds.outside


def _where(client: Any) -> tuple[str, str]:
    """``(peer, db index)`` from the client's pool, worked out once per pool."""
    pool = client.connection_pool
    cached = getattr(pool, "_swmp_where", None)
    if cached is None:
        try:
            kw = pool.connection_kwargs
            path = kw.get("path")
            address = str(path) if path else _ds.peer(kw.get("host", "localhost"), kw.get("port", 6379))
            cached = (address, str(kw.get("db", 0)))
        except Exception:
            cached = ("", "")
        try:
            pool._swmp_where = cached
        except Exception:  # a pool that takes no attributes: work it out every time
            pass
    return cached


def _name(cmd: Any) -> str:
    return _ds.text(cmd).upper() if cmd.__class__ is not str else cmd.upper()


def _command_span(client: Any, args: tuple[Any, ...]) -> Any:
    cmd = _name(args[0]) if args else ""
    address, db = _where(client)
    return _ds.cache_span(
        "Redis/" + cmd, address, _COMPONENT, "Redis", cmd, args[1] if len(args) > 1 else None, db
    )


def _pipeline_span(pipe: Any) -> Any:
    stack = pipe.command_stack
    cmds = [_name(args[0]) for args, _ in stack if args]
    transaction = pipe.transaction or pipe.explicit_transaction
    kinds = {_ds.cache_op(c) for c in cmds}
    kind = "write" if "write" in kinds else "read" if kinds == {"read"} else ""
    keys = (
        " ".join(_ds.text(args[1]) for args, _ in stack if len(args) > 1)
        if _ds.settings.collect_keys
        else None
    )
    address, db = _where(pipe)
    op = "Redis/MULTI" if transaction else "Redis/PIPELINE"
    return _ds.cache_span(op, address, _COMPONENT, "Redis", " ".join(cmds), keys or None, db, kind)


def _command_start(client: Any, args: tuple[Any, ...], _: dict[str, Any]) -> Any:
    return _command_span(client, args)


def _pipeline_start(pipe: Any, _: tuple[Any, ...], __: dict[str, Any]) -> Any:
    # An empty pipeline sends nothing: no span.
    return _pipeline_span(pipe) if pipe.command_stack else NOOP


def _targets() -> list[tuple[Any, str, Callable[[Any], Any]]]:
    import redis.asyncio.client as aclient  # noqa: PLC0415
    from redis import client  # noqa: PLC0415

    return [
        (client.Redis, "execute_command", _ds.traced_method(_command_start)),
        (client.Pipeline, "execute", _ds.traced_method(_pipeline_start)),
        (aclient.Redis, "execute_command", _ds.traced_method(_command_start, is_async=True)),
        (aclient.Pipeline, "execute", _ds.traced_method(_pipeline_start, is_async=True)),
    ]


def install(config: Config) -> None:
    _ds.configure(config)
    patch_all(_targets())


def uninstall() -> None:
    restore_all(_targets())
