"""redis-py, sync and ``redis.asyncio``: one exit span per command (``Redis/<COMMAND>``, as
the SkyWalking Python agent names it; Pub/Sub ``PUBLISH`` included, and the commands a
pipeline runs at once while it ``WATCH``es, ``WATCH`` itself too) and one per pipeline or
transaction execution (``Redis/PIPELINE`` or ``Redis/MULTI``, ``cache.cmd`` listing its
commands). Component Redis (7), layer Cache; tags ``cache.type``, ``cache.cmd``,
``cache.op`` (read/write), ``cache.key`` (unless ``SW_PLUGIN_CACHE_COLLECT_KEYS=false``) and
``db.instance`` (the database index).

``RedisCluster`` (sync and asyncio): one span per command, its peer the node(s) redis-py
sent it to (``;``-joined; a ``MOVED``/``ASK`` redirect it follows on its own is not seen),
the startup nodes if it never got that far; one
``Redis/PIPELINE`` span per cluster pipeline execution, its peer the startup nodes (sync:
every node the client knows, sorted); a cluster transaction is one ``Redis/MULTI`` span,
its peer the master of its keys' slot, and its ``WATCH`` and the commands it runs at once
while watching are command spans with that peer (asyncio too: see
:func:`_traced_when_awaited`).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from swmp.instrument import _cache_span
from swmp.instrument import _datastore as _ds
from swmp.instrument._cache_commands import cache_head, cache_op, key_allowed
from swmp.instrument._gate import gated
from swmp.instrument._patch import patch_all, restore_all
from swmp.tracing.constants import Component
from swmp.tracing.span import NOOP, Span

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
    cached = getattr(pool, _ds.WHERE, None)
    if cached is None:
        try:
            kw = pool.connection_kwargs
            path = kw.get("path")
            address = str(path) if path else _ds.peer(kw.get("host", "localhost"), kw.get("port", 6379))
            cached = (address, str(kw.get("db", 0)))
        except Exception:
            cached = ("", "")
        _ds.remember(pool, cached)
    return cached


def _name(cmd: Any) -> str:
    return _ds.text(cmd).upper() if cmd.__class__ is not str else cmd.upper()


# What a command name gives, made once per name: (operation, cache.cmd, head of the tags).
_commands: dict[Any, tuple[str, str, tuple[str, ...]]] = {}


def _command_info(name: Any) -> tuple[str, str, tuple[str, ...]]:
    try:
        return _commands[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name (never seen; still served)
        pass
    cmd = _name(name)
    info = ("Redis/" + cmd, cmd, cache_head("Redis", cmd))
    if not key_allowed(cmd):
        # Not memoized: the native CacheCall takes only the names in this memo and would
        # record args[1] (AUTH's password) as cache.key; these rare commands stay Python's.
        return info
    try:
        if len(_commands) >= 1024:
            _commands.clear()
        _commands[name] = info
    except TypeError:
        pass
    return info


def _key(cmd: str, args: Any) -> Any:
    """A command's cache.key: its first argument, none for a command whose arguments can
    carry a secret (``AUTH password``, ``CONFIG SET requirepass ...``: _cache_commands)."""
    return args[1] if len(args) > 1 and key_allowed(cmd) else None


def _command_start(client: Any, args: tuple[Any, ...], _: dict[str, Any]) -> Any:
    op, cmd, head = _command_info(args[0]) if args else ("Redis/", "", None)
    address, db = _where(client)
    return _cache_span.cache_span(op, address, _COMPONENT, "Redis", cmd, _key(cmd, args), db, None, head)


_COMMAND_PLACE = f"{__name__}._command_start"


def _command(orig: Any) -> Any:
    """``execute_command(*args, **options)``: ``traced_method(_command_start)``, inlined."""

    def execute_command(self: Any, *args: Any, **options: Any) -> Any:
        try:
            span = _command_start(self, args, options)
        except Exception as e:
            span = _ds.failed(_COMMAND_PLACE, e)
        span.__enter__()  # ``with span:`` spelled out: cheaper
        try:
            result = orig(self, *args, **options)
        except BaseException as e:
            span.__exit__(type(e), e, e.__traceback__)
            raise
        span.__exit__(None, None, None)
        return result

    # Outside a trace redis-py's ``execute_command(*args, keys=[...])`` goes straight to the
    # original (a Python wrapper passing ``**options`` on cost ~3,200 instructions there);
    # inside one, a command whose name and pool were seen before runs in C.
    native = _cache_span.traced_command(
        orig, execute_command, _COMPONENT, "Redis", _commands, "connection_pool", None, 2, False
    )
    return gated(orig, native)


def _acommand(orig: Any) -> Any:
    """redis.asyncio's ``execute_command``: the command's span opens when it is awaited; in
    C (within.c's lazy form) once its name and pool are known, else in Python."""
    native = _cache_span.traced_command(
        orig,
        _ds.async_traced(_command_start, orig),
        _COMPONENT,
        "Redis",
        _commands,
        "connection_pool",
        None,
        2,
        False,
        awaiting=True,
    )
    return gated(orig, native)


def _pipeline_span(pipe: Any) -> Any:
    named = [(_name(args[0]), args) for args, _ in pipe.command_stack if args]
    cmds = [cmd for cmd, _ in named]
    transaction = pipe.transaction or pipe.explicit_transaction
    kinds = {cache_op(c) for c in cmds}
    kind = "write" if "write" in kinds else "read" if kinds == {"read"} else ""
    keys = (
        " ".join(_ds.text(args[1]) for cmd, args in named if len(args) > 1 and key_allowed(cmd))
        if _ds.settings.collect_keys
        else None
    )
    address, db = _where(pipe)
    op = "Redis/MULTI" if transaction else "Redis/PIPELINE"
    return _cache_span.cache_span(op, address, _COMPONENT, "Redis", " ".join(cmds), keys or None, db, kind)


def _pipeline_start(pipe: Any, _: tuple[Any, ...], __: dict[str, Any]) -> Any:
    # An empty pipeline sends nothing: no span.
    return _pipeline_span(pipe) if pipe.command_stack else NOOP


# -- RedisCluster -------------------------------------------------------------------------------
# The node a cluster command goes to is decided inside redis-py (key slot, MOVED/ASK
# redirects, retries after a topology change): working it out beforehand would repeat that
# work. So the command's span starts with the startup nodes as its peer, and the wrapper of
# ``_execute_command(node, ...)`` (called once per node the command is sent to) puts the
# real node(s) in. ``_route`` holds ``[span, node names...]`` of the cluster span opened last
# in this context; a call whose current span is not that one (a pipeline, a span that failed
# to open) leaves everything as it is. Never reset (the wrapper has no end hook): a stale
# entry is told apart by its span, and keeps that finished span alive only until the next
# cluster command in the same context.
_route: ContextVar[list[Any] | None] = ContextVar("swmp_redis_route", default=None)
_transactions: tuple[type, ...] = ()  # the cluster pipelines' transaction strategies


def _startup(client: Any) -> str:
    nodes = client.startup_nodes
    if isinstance(nodes, dict):
        # A sync cluster pipeline holds its nodes manager's table (names -> nodes), which by
        # now also lists the nodes found at start-up: sorted, so the peer stays one text.
        return ";".join(sorted(nodes))
    return ";".join(n.name for n in nodes)


def _cluster_start(client: Any, args: tuple[Any, ...], _: dict[str, Any]) -> Any:
    cmd = _name(args[0]) if args else ""
    span = _cache_span.cache_span(
        "Redis/" + cmd, _startup(client), _COMPONENT, "Redis", cmd, _key(cmd, args), "0"
    )
    if span.__class__ is Span:
        _route.set([span])
    return span


def _routed(orig: Any) -> Any:
    """``_execute_command(node, *args)``: the node joins the peer of the command's span."""

    def method(self: Any, target_node: Any, *args: Any, **kwargs: Any) -> Any:
        span = _outside()
        if span is not None:
            route = _route.get()
            if route is not None and route[0] is span:
                try:
                    name = target_node.name
                    if name not in route:
                        route.append(name)
                        span.set_peer(";".join(route[1:]))
                except Exception:  # a node without a name: the startup nodes stay the peer
                    pass
        return orig(self, target_node, *args, **kwargs)

    return method


def _slot_node(strategy: Any, client: Any) -> str:
    """Where a cluster transaction goes: the master of the slot its keys share (redis-py
    records it as commands are added), else the startup nodes."""
    slots = getattr(strategy, "_pipeline_slots", None)
    if slots:
        try:
            return str(client.nodes_manager.get_node_from_slot(next(iter(slots))).name)
        except Exception:  # a slot no node serves yet: redis-py raises for it on its own
            pass
    return _startup(client)


def _cluster_pipeline_start(pipe: Any, _: tuple[Any, ...], __: dict[str, Any]) -> Any:
    # redis-py 6+ queues in an execution strategy; before, in the pipeline's command_stack.
    strategy = getattr(pipe, "_execution_strategy", None)
    stack = pipe.command_stack if strategy is None else strategy._command_queue
    if not stack:  # nothing queued: nothing sent
        return NOOP
    named = [(_name(c.args[0]), c.args) for c in stack if c.args]
    cmds = [cmd for cmd, _ in named]
    kinds = {cache_op(c) for c in cmds}
    kind = "write" if "write" in kinds else "read" if kinds == {"read"} else ""
    keys = (
        " ".join(_ds.text(args[1]) for cmd, args in named if len(args) > 1 and key_allowed(cmd))
        if _ds.settings.collect_keys
        else None
    )
    client = getattr(pipe, "cluster_client", pipe)  # asyncio: the pipeline holds its client
    if isinstance(strategy, _transactions):
        op, address = "Redis/MULTI", _slot_node(strategy, client)
    else:
        op, address = "Redis/PIPELINE", _startup(client)
    return _cache_span.cache_span(op, address, _COMPONENT, "Redis", " ".join(cmds), keys or None, "0", kind)


def _cluster_immediate_start(strategy: Any, args: tuple[Any, ...], _: dict[str, Any]) -> Any:
    """A cluster transaction's WATCH and the commands it runs at once while watching."""
    cmd = _name(args[0]) if args else ""
    address = _slot_node(strategy, getattr(strategy._pipe, "cluster_client", strategy._pipe))
    return _cache_span.cache_span("Redis/" + cmd, address, _COMPONENT, "Redis", cmd, _key(cmd, args), "0")


_IMMEDIATE_PLACE = f"{__name__}._cluster_immediate_start"


def _traced_when_awaited(orig: Any) -> Any:
    """The asyncio cluster transaction's ``_immediate_execute_command`` (its WATCH, UNWATCH and
    the commands it runs at once while watching), traced from inside its coroutine.

    Where the caller's context is lost: redis-py (6.2 to 8.1 and its main branch) has the
    sync ``TransactionStrategy.execute_command`` (behind ``watch()``, ``unwatch()`` and every
    command method of the pipeline) run ``asyncio.run(self._execute_command(...))`` in a new
    ``threading.Thread``, whose context is empty. That coroutine works out the slot and then
    *returns* ``self._immediate_execute_command(...)`` unawaited: the coroutine object is
    made in the helper thread but handed back to ``watch()`` / the application, which await
    it in the caller's own task. The usual async wrapper decides when it is called, i.e. in
    the helper thread, and saw no trace.

    This wrapper decides when its coroutine starts running, which is where it is awaited:
    the caller's task and context, so the span is a child of the caller's current span, in
    its trace. Nothing has to be captured and carried across the thread (which redis-py
    gives no way to do), no thread or loop of redis-py's is touched, and redis-py's own
    coroutine is awaited as it is: results, exceptions and cancellation unchanged. Should a
    later redis-py await it inside its thread instead, the check finds no trace there and
    the command goes untraced (never a wrong parent)."""

    async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _outside() is None:
            return await orig(self, *args, **kwargs)
        try:
            span = _cluster_immediate_start(self, args, kwargs)
        except Exception as e:
            span = _ds.failed(_IMMEDIATE_PLACE, e)
        with span:
            return await orig(self, *args, **kwargs)

    return method


def _cluster_targets() -> list[tuple[Any, str, Callable[[Any], Any]]]:
    """The cluster clients this redis-py has: sync since 4.1, asyncio since 4.3,
    transactions (execution strategies) since 6."""
    global _transactions
    import importlib  # noqa: PLC0415

    targets: list[tuple[Any, str, Callable[[Any], Any]]] = []
    transactions = []
    for name, is_async in (("redis.cluster", False), ("redis.asyncio.cluster", True)):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        targets += [
            (mod.RedisCluster, "execute_command", _ds.traced_method(_cluster_start, is_async=is_async)),
            (mod.RedisCluster, "_execute_command", _routed),
            (mod.ClusterPipeline, "execute", _ds.traced_method(_cluster_pipeline_start, is_async=is_async)),
        ]
        strategy = getattr(mod, "TransactionStrategy", None)
        if strategy is not None:
            transactions.append(strategy)
            immediate = _traced_when_awaited if is_async else _ds.traced_method(_cluster_immediate_start)
            targets.append((strategy, "_immediate_execute_command", immediate))
    _transactions = tuple(transactions)
    return targets


def _targets() -> list[tuple[Any, str, Callable[[Any], Any]]]:
    import redis.asyncio.client as aclient  # noqa: PLC0415
    from redis import client  # noqa: PLC0415

    return [
        (client.Redis, "execute_command", _command),
        (client.Pipeline, "execute", _ds.traced_method(_pipeline_start)),
        # While it WATCHes, a pipeline sends each command at once through this method (not
        # execute_command, which it overrides to queue): a command span like the client's.
        (client.Pipeline, "immediate_execute_command", _command),
        (aclient.Redis, "execute_command", _acommand),
        (aclient.Pipeline, "execute", _ds.traced_method(_pipeline_start, is_async=True)),
        (aclient.Pipeline, "immediate_execute_command", _acommand),
        *_cluster_targets(),
    ]


def install(config: Config) -> None:
    _ds.configure(config)
    patch_all(_targets())


def uninstall() -> None:
    restore_all(_targets())
