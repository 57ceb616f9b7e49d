"""The native ``CacheCall`` (swmp/_native/cache.c) runs a Redis or memcached command as the
Python wrappers of swmp/instrument/redis.py and pymemcache.py do: the same calls reach the
client, the same results and exceptions reach the caller, the same segments are recorded.
Each case runs through the wrapper the instrumentation installs (native) and through the
one it installs without the native core (Python), on clients shaped like redis-py's and
pymemcache's that record what they are given, so that every call shape and failure can be
provoked. The real clients against the real servers: test_instrument_cache.py."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from swmp import _sink
from swmp.instrument import _cache_span
from swmp.instrument import _datastore as ds
from swmp.instrument import pymemcache as memcache_instr
from swmp.instrument import redis as redis_instr
from swmp.tracing.context import new_entry_span
from swmp.tracing.limits import limits
from swmp.tracing.span import NATIVE, current_span, native_core
from tests.native_forms import compare_forms, recording, segments

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with recording() as memory:
        yield memory


class Pool:
    def __init__(self, db: int = 3) -> None:
        self.connection_kwargs = {"host": "cache.local", "port": 6380, "db": db}


class Redis:
    """redis-py's shape: ``execute_command(*args, **options)`` on a client with a pool."""

    def __init__(self) -> None:
        self.connection_pool = Pool()
        self.calls: list[Any] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        seen = current_span.get()
        self.calls.append((args, options, None if seen is None else seen.op))
        if args and args[0] == "FAIL":
            raise ValueError("server says no")
        if args and args[0] == "INTERRUPT":
            raise KeyboardInterrupt
        return ("reply", args)


class Memcache:
    """pymemcache's shape: ``Client.get(key, default=None)`` with a ``server`` address."""

    def __init__(self, server: Any = ("mc.local", 11211)) -> None:
        self.server = server
        self.calls: list[Any] = []

    def get(self, key: Any, default: Any = None, *rest: Any, **kw: Any) -> Any:
        seen = current_span.get()
        self.calls.append((key, default, rest, kw, None if seen is None else seen.op))
        if key == "FAIL":
            raise OSError("connection reset")
        return ("value", key)


def _forms(make: Callable[[], Any]) -> tuple[Any, Any]:
    """(native, Python) wrappers, the Python one made as without the native core."""
    native = make()
    saved = _cache_span._CacheCall
    _cache_span._CacheCall = None
    try:
        python = make()
    finally:
        _cache_span._CacheCall = saved
    return native, python


REDIS_CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("GET", "user:1"), {"keys": ["user:1"]}),
    (("SET", "user:1", "v"), {}),
    (("PING",), {}),
    (("MGET", "a", "b"), {"keys": ["a", "b"]}),
    (("GET", b"bytes-key"), {}),
    (("GET", None), {}),
    (("GET", 42), {}),
    (("GET", "k" * 3000), {}),
    (("EXPIRE", "k", 10), {}),
    ((b"GET", "k"), {}),
    (("FAIL", "k"), {}),
    (("INTERRUPT",), {}),
    ((), {}),
]
MEMCACHE_CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("user:1",), {}),
    (("user:1", "fallback"), {}),
    ((b"bytes-key",), {}),
    ((["a", "b"],), {}),
    (("k" * 3000,), {}),
    (("FAIL",), {}),
    ((), {"key": "by-keyword"}),
    (("user:1",), {"default": 0}),
]


@pytest.mark.parametrize("collect_keys", [True, False])
@pytest.mark.parametrize("tag_limit", [2048, 4])
def test_redis_command_matches_the_python_form(
    sink: _sink.MemorySink, collect_keys: bool, tag_limit: int
) -> None:
    ds.settings.collect_keys = collect_keys
    limits.tag_value_max = tag_limit
    native, python = _forms(lambda: redis_instr._command(Redis.execute_command))
    compare_forms(native, python, Redis, REDIS_CALLS, sink)


@pytest.mark.parametrize("collect_keys", [True, False])
@pytest.mark.parametrize("tag_limit", [2048, 4])
def test_memcached_command_matches_the_python_form(
    sink: _sink.MemorySink, collect_keys: bool, tag_limit: int
) -> None:
    ds.settings.collect_keys = collect_keys
    limits.tag_value_max = tag_limit
    native, python = _forms(lambda: memcache_instr._command("get")(Memcache.get))
    compare_forms(native, python, Memcache, MEMCACHE_CALLS, sink)
    # A socket path for a server (not a tuple): the Python form's every time.
    compare_forms(native, python, lambda: Memcache("/run/memcached.sock"), MEMCACHE_CALLS[:2], sink)


def test_the_native_path_is_taken_once_the_memos_exist(sink: _sink.MemorySink, monkeypatch: Any) -> None:
    wheres: list[Any] = []
    real = redis_instr._where
    monkeypatch.setattr(redis_instr, "_where", lambda client: wheres.append(client) or real(client))
    native = redis_instr._command(Redis.execute_command)
    client = Redis()
    with new_entry_span("/request"):
        for i in range(5):
            native(client, "GET", f"user:{i}", keys=[f"user:{i}"])
    assert len(wheres) == 1  # the fallback made the pool's memo; C used it after
    (segment,) = segments(sink.records)
    spans = segment[3][:-1]
    assert [s[2] for s in spans] == ["Redis/GET"] * 5
    assert spans[4][9] == [
        "cache.type", "Redis", "cache.cmd", "GET", "cache.op", "read",
        "cache.key", "user:4", "db.instance", "3",
    ]  # fmt: skip


def test_constructor_refuses_wrong_arguments() -> None:
    f = Redis.execute_command
    with pytest.raises(TypeError):
        native_core.CacheCall(f, 1, 7, "Redis", {}, "connection_pool", None, 2, False)
    with pytest.raises(TypeError):
        native_core.CacheCall(f, f, 7, "Redis", [], "connection_pool", None, 2, False)
    with pytest.raises(TypeError):
        native_core.CacheCall(f, f, 7, "Redis", {}, "connection_pool", [], 2, False)
    with pytest.raises(TypeError):
        native_core.CacheCall(f, f, 7, "Redis", {}, "connection_pool", None, 0, False)
    with pytest.raises(TypeError):
        native_core.CacheCall(f, f, 7, "Redis", {}, "connection_pool", None, 2, False, x=1)


def test_the_memo_emptied_during_the_call_leaves_the_span_whole(sink: _sink.MemorySink) -> None:
    """redis.py's command memo is the only owner of each ``(operation, cmd, tags)`` and is
    emptied when full; Python code run while the span is being made (here the client's pool
    property, as another thread or a finalizer could) must not free the entry under the
    native call. The tag value's finalizer tells when the entry is freed."""
    freed: list[str] = []

    class Marker(str):
        def __del__(self) -> None:
            freed.append(str(self))

    memo: dict[Any, Any] = {}
    pool = types.SimpleNamespace(_swmp_where=("cache.local:6380", "0"))

    class Client:
        @property
        def connection_pool(self) -> Any:
            memo.clear()  # what redis.py's _command_info does at 1,024 names
            freed.append("cleared")
            return pool

    def orig(self: Any, *args: Any, **options: Any) -> Any:
        return "reply"

    call = native_core.CacheCall(orig, orig, 7, "Redis", memo, "connection_pool", None, 2, False)
    memo["GET"] = ("Redis/GET", "GET", ("cache.type", Marker("Redis"), "cache.cmd", "GET"))
    with new_entry_span("/request"):
        assert call(Client(), "GET", "k") == "reply"
    assert freed[0] == "cleared"  # the entry outlived the property that dropped it
    (segment,) = segments(sink.records)
    (span,) = segment[3][:-1]
    assert span[2] == "Redis/GET"
    assert span[9][:4] == ["cache.type", "Redis", "cache.cmd", "GET"]
