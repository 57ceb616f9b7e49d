"""pymemcache: one exit span per command of the base ``Client`` (and so of ``PooledClient``
and ``HashClient``, which delegate to it): operation ``Memcached/<command>``, component
Memcached (20; the SkyWalking Python agent has no memcached plugin), layer Cache, tags
``cache.type``, ``cache.cmd``, ``cache.op``, ``cache.key`` (the key, or the keys of a
``*_many`` call, unless ``SW_PLUGIN_CACHE_COLLECT_KEYS=false``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swmp.instrument import _cache_span
from swmp.instrument import _datastore as _ds
from swmp.instrument._cache_commands import cache_head
from swmp.instrument._gate import gated
from swmp.instrument._patch import patch, restore
from swmp.tracing.constants import Component

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "pymemcache"
PEER_NAMES: tuple[str, ...] = ()  # the SkyWalking Python agent has no memcached plugin
PACKAGE = "pymemcache"
SUPPORTED = ("3.0", "5")
TRIGGER = "pymemcache"

_COMPONENT = Component.MEMCACHED
_COMMANDS = (
    "set", "set_many", "set_multi", "add", "replace", "append", "prepend", "cas", "get", "get_many",
    "get_multi", "gets", "gets_many", "delete", "delete_many", "delete_multi", "incr", "decr", "touch",
)  # fmt: skip


_addresses: dict[Any, str] = {}


def _address(client: Any) -> str:
    server = client.server
    try:  # the client's own server tuple as the key: no tuple built per call
        return _addresses[server]
    except (KeyError, TypeError):
        pass
    address = _ds.peer(server[0], server[1]) if isinstance(server, tuple) else str(server)
    try:
        if len(_addresses) >= 1024:
            _addresses.clear()
        _addresses[server] = address
    except TypeError:  # an unhashable server: worked out every time
        pass
    return address


def _key(key: Any) -> Any:
    if isinstance(key, (str, bytes)):
        return key
    if isinstance(key, (dict, list, tuple)):  # *_many: never consume a one-shot iterable
        return " ".join(_ds.text(k) for k in key)
    return None


def _command(cmd: str) -> Any:
    op = "Memcached/" + cmd
    head = cache_head("Memcached", cmd)
    cache_span = _cache_span.cache_span
    place = f"{__name__}.{cmd}"

    def make(orig: Any) -> Any:
        # The first parameter is ``key``, or ``keys`` / ``values`` for the *_many commands,
        # and may come by name: the call goes to the client as it was given.
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if args:
                key = args[0]
            else:
                key = next((kwargs[n] for n in ("key", "keys", "values") if n in kwargs), None)
            try:  # the span may fail to open (a changed client), never the call
                server = self.server  # a (host, port) tuple or a socket path
                address = (_addresses.get(server) if server.__class__ is tuple else None) or _address(self)
                k = key if key.__class__ is str else _key(key)
                span = cache_span(op, address, _COMPONENT, "Memcached", cmd, k, "", None, head)
            except Exception as e:
                span = _ds.failed(place, e)
            span.__enter__()  # ``with span:`` spelled out: cheaper
            try:
                result = orig(self, *args, **kwargs) if kwargs or len(args) != 1 else orig(self, key)
            except BaseException as e:
                span.__exit__(type(e), e, e.__traceback__)
                raise
            span.__exit__(None, None, None)
            return result

        # Outside a trace: the original itself; inside one, a str key and a server seen
        # before run in C.
        info = (op, cmd, head)
        return gated(
            orig,
            _cache_span.traced_command(
                orig, method, _COMPONENT, "Memcached", info, "server", _addresses, 1, True
            ),
        )

    return make


def install(config: Config) -> None:
    from pymemcache.client.base import Client  # noqa: PLC0415

    _ds.configure(config)
    for cmd in _COMMANDS:
        if cmd in Client.__dict__:
            patch(Client, cmd, _command(cmd))


def uninstall() -> None:
    from pymemcache.client.base import Client  # noqa: PLC0415

    for cmd in _COMMANDS:
        restore(Client, cmd)
