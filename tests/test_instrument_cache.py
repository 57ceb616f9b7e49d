"""Cache clients against a real Redis, a real 3-master Redis Cluster and memcached
(tests/daemons.py, tests/redis_cluster.py): redis-py (sync and asyncio, pipelines,
transactions, commands run at once while WATCHing, Pub/Sub publish, RedisCluster) and
pymemcache record one exit span per command or pipeline, leave results and errors as they
are, and nothing outside a trace."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from reporter_proc import records as R
from swmp.tracing import Component, Layer
from swmp.tracing.context import new_local_span
from tests.daemons import ServerInfo
from tests.datastore_support import Traced, only, start_traced, stop_traced, traced
from tests.redis_cluster import ClusterInfo, redis_cluster

__all__ = ["redis_cluster", "traced"]


@pytest.fixture()
def r(traced: Traced, redis_server: ServerInfo) -> Iterator[Any]:
    import redis

    client = redis.Redis(host=redis_server.host, port=redis_server.port, db=3)
    yield client
    client.close()


def test_redis_commands(traced: Traced, r: Any, redis_server: ServerInfo) -> None:
    with traced.trace() as got:
        assert r.set("rk:1", "v") is True
        assert r.get("rk:1") == b"v"
        assert r.ping() is True
    assert [e.op for e in got.exits] == ["Redis/SET", "Redis/GET", "Redis/PING"]
    s, g, p = got.exits
    assert s.peer == f"127.0.0.1:{redis_server.port}"
    assert (s.component, s.layer) == (Component.REDIS, Layer.CACHE)
    assert s.tags == {"cache.type": "Redis", "cache.cmd": "SET", "cache.op": "write", "cache.key": "rk:1",
                      "db.instance": "3"}  # fmt: skip
    assert (g.tags["cache.op"], g.tags["cache.key"]) == ("read", "rk:1")
    assert "cache.op" not in p.tags and "cache.key" not in p.tags


def test_redis_error_reaches_the_app_unchanged(traced: Traced, r: Any) -> None:
    import redis

    r.set("rk:str", "not a number")
    with traced.trace() as got, pytest.raises(redis.ResponseError, match="not an integer"):
        r.incr("rk:str")
    e = only(got)
    assert e.error and e.op == "Redis/INCRBY"  # redis-py sends INCR as INCRBY
    assert e.logs[0]["error.kind"] == "ResponseError"


def test_redis_pipeline_and_transaction_are_one_span_each(traced: Traced, r: Any) -> None:
    with traced.trace() as got:
        with r.pipeline() as pipe:  # transaction=True by default: MULTI/EXEC
            assert pipe.set("rk:p", 1).incr("rk:p").get("rk:p").execute() == [True, 2, b"2"]
        pipe = r.pipeline(transaction=False)
        pipe.get("rk:p")
        pipe.exists("rk:p")
        assert pipe.execute() == [b"2", 1]
        assert r.pipeline().execute() == []  # nothing queued: no round trip, no span
    tx, plain = got.exits
    assert tx.op == "Redis/MULTI"
    assert tx.tags["cache.cmd"] == "SET INCRBY GET"
    assert tx.tags["cache.op"] == "write"
    assert tx.tags["cache.key"] == "rk:p rk:p rk:p"
    assert plain.op == "Redis/PIPELINE"
    assert (plain.tags["cache.cmd"], plain.tags["cache.op"]) == ("GET EXISTS", "read")


def test_redis_commands_a_watching_pipeline_runs_at_once(
    traced: Traced, r: Any, redis_server: ServerInfo
) -> None:
    """After WATCH a pipeline sends each command immediately (not at execute): each is a
    command span like the client's; the MULTI block is still one span."""
    import redis

    r.set("rk:w", 5)
    r.set("rk:wstr", "text")
    with traced.trace() as got:
        with r.pipeline() as pipe:
            assert pipe.watch("rk:w") is True
            current = int(pipe.get("rk:w"))
            pipe.multi()
            pipe.set("rk:w", current + 1)
            assert pipe.execute() == [True]
        with r.pipeline() as pipe:  # an error of a command run at once reaches the app as is
            pipe.watch("rk:wstr")
            with pytest.raises(redis.ResponseError, match="not an integer"):
                pipe.incr("rk:wstr")
            assert pipe.unwatch() is True
        with r.pipeline() as pipe:  # the watched key changes: EXEC fails with WatchError
            pipe.watch("rk:w")
            r.set("rk:w", 0)
            pipe.multi()
            pipe.incr("rk:w")
            with pytest.raises(redis.WatchError):
                pipe.execute()
    assert r.get("rk:w") == b"0"
    ops = [e.op for e in got.exits]
    assert ops == ["Redis/WATCH", "Redis/GET", "Redis/MULTI", "Redis/WATCH", "Redis/INCRBY", "Redis/UNWATCH",
                   "Redis/WATCH", "Redis/SET", "Redis/MULTI"]  # fmt: skip
    assert [e.error for e in got.exits] == [False] * 4 + [True] + [False] * 3 + [True]
    watch, get, multi = got.exits[:3]
    for e in (watch, get, multi):
        assert e.peer == f"127.0.0.1:{redis_server.port}"
        assert (e.component, e.layer) == (Component.REDIS, Layer.CACHE)
    assert get.tags == {"cache.type": "Redis", "cache.cmd": "GET", "cache.op": "read", "cache.key": "rk:w",
                        "db.instance": "3"}  # fmt: skip
    assert watch.tags == {"cache.type": "Redis", "cache.cmd": "WATCH", "cache.key": "rk:w",
                          "db.instance": "3"}  # fmt: skip
    assert (multi.tags["cache.cmd"], multi.tags["cache.key"]) == ("SET", "rk:w")
    assert got.exits[4].logs[0]["error.kind"] == "ResponseError"
    assert got.exits[8].logs[0]["error.kind"] == "WatchError"


def test_redis_asyncio_watching_pipeline(traced: Traced, redis_server: ServerInfo) -> None:
    import redis.asyncio as aredis

    async def main() -> None:
        client = aredis.Redis(host=redis_server.host, port=redis_server.port, db=2)
        try:
            await client.set("rk:aw", 7)
            with traced.trace() as got:
                async with client.pipeline() as pipe:
                    await pipe.watch("rk:aw")
                    current = int(await pipe.get("rk:aw"))
                    pipe.multi()
                    pipe.set("rk:aw", current * 2)
                    assert await pipe.execute() == [True]
            assert [e.op for e in got.exits] == ["Redis/WATCH", "Redis/GET", "Redis/MULTI"]
            assert got.exits[1].tags == {"cache.type": "Redis", "cache.cmd": "GET", "cache.op": "read",
                                         "cache.key": "rk:aw", "db.instance": "2"}  # fmt: skip
            assert got.exits[1].peer == f"127.0.0.1:{redis_server.port}"
            assert await client.get("rk:aw") == b"14"
            with traced.untraced():
                async with client.pipeline() as pipe:
                    await pipe.watch("rk:aw")
                    assert await pipe.get("rk:aw") == b"14"
        finally:
            await client.aclose()

    asyncio.run(main())


def test_redis_publish(traced: Traced, r: Any) -> None:
    sub = r.pubsub()
    sub.subscribe("rk:chan")
    assert sub.get_message(timeout=5)["type"] == "subscribe"
    with traced.trace() as got:
        assert r.publish("rk:chan", "hello") == 1
    msg = sub.get_message(timeout=5)
    sub.close()
    assert msg["data"] == b"hello"
    e = only(got)
    assert (e.op, e.tags["cache.key"]) == ("Redis/PUBLISH", "rk:chan")


def test_redis_asyncio(traced: Traced, redis_server: ServerInfo) -> None:
    import redis.asyncio as aredis

    async def main() -> None:
        client = aredis.Redis(host=redis_server.host, port=redis_server.port)
        try:
            with traced.trace() as got:
                assert await client.set("rk:a", "x") is True
                assert await client.get("rk:a") == b"x"
                async with client.pipeline() as pipe:
                    pipe.incr("rk:n").decr("rk:n")
                    assert await pipe.execute() == [1, 0]
                with pytest.raises(aredis.ResponseError):
                    await client.incr("rk:a")
                with pytest.raises(asyncio.TimeoutError):  # cancellation reaches the app as it would
                    await asyncio.wait_for(client.blpop(["rk:empty"], timeout=5), 0.3)
            ops = [e.op for e in got.exits]
            assert ops == ["Redis/SET", "Redis/GET", "Redis/MULTI", "Redis/INCRBY", "Redis/BLPOP"]
            # The BLPOP the caller's timeout cancelled is no failed command: logged, not flagged.
            assert [e.error for e in got.exits] == [False, False, False, True, False]
            assert got.exits[4].logs[0]["event"] == "interrupted"
            assert got.exits[2].tags["cache.cmd"] == "INCRBY DECRBY"
            assert got.exits[0].tags["db.instance"] == "0"
        finally:
            await client.aclose()
        client = aredis.Redis(host=redis_server.host, port=redis_server.port)
        try:
            with traced.untraced():
                assert await client.get("rk:a") == b"x"
        finally:
            await client.aclose()

    asyncio.run(main())


def test_redis_asyncio_commands_seen_before_run_in_c(traced: Traced, redis_server: ServerInfo) -> None:
    """Once a command's name and the pool are known, an awaited command is the native lazy
    awaitable (swmp/_native/within.c): awaited, made a task, gathered, cancelled while the
    server holds it, each with its span as the Python form records it."""
    import redis.asyncio as aredis

    from swmp.tracing.span import NATIVE

    async def main() -> None:
        client = aredis.Redis(host=redis_server.host, port=redis_server.port)
        try:
            with traced.trace() as got:
                await client.set("rk:c", "1")
                assert await client.get("rk:c") == b"1"  # both names known from here on
                call = client.get("rk:c")
                assert (type(call).__name__ == "Within") is NATIVE
                assert await call == b"1"
                task = asyncio.get_running_loop().create_task(client.set("rk:c", "2"))
                assert await task is True
                assert await asyncio.gather(client.get("rk:c"), client.get("rk:c")) == [b"2", b"2"]
                await client.blpop(["rk:none"], timeout=1)  # the name, then a cancelled wait
                with pytest.raises(asyncio.TimeoutError):  # (not the built-in one before Python 3.11)
                    await asyncio.wait_for(client.blpop(["rk:none"], timeout=5), 0.3)
            ops = [e.op for e in got.exits]
            assert (
                ops
                == ["Redis/SET", "Redis/GET", "Redis/GET", "Redis/SET"]
                + ["Redis/GET"] * 2
                + ["Redis/BLPOP"] * 2
            )
            assert [e.error for e in got.exits] == [False] * 8  # the cancelled wait: logged, not flagged
            assert got.exits[7].logs[0]["event"] == "interrupted"
            assert {e.tags["cache.key"] for e in got.exits} == {"rk:c", "rk:none"}
            assert got.exits[2].tags["cache.op"] == "read" and got.exits[3].tags["cache.op"] == "write"
        finally:
            await client.aclose()

    asyncio.run(main())


def test_redis_outside_a_trace_records_nothing(traced: Traced, r: Any) -> None:
    with traced.untraced():
        r.set("rk:o", 1)
        assert r.get("rk:o") == b"1"
        assert r.pipeline().incr("rk:o").execute() == [2]


def test_cache_keys_can_be_left_out(redis_server: ServerInfo, memcached_server: ServerInfo) -> None:
    import redis
    from pymemcache.client.base import Client

    t, _ = start_traced(plugin_cache_collect_keys=False)
    try:
        client = redis.Redis(host=redis_server.host, port=redis_server.port)
        mc = Client((memcached_server.host, memcached_server.port))
        with t.trace() as got:
            client.set("rk:secret", 1)
            client.pipeline().get("rk:secret").execute()
            mc.set("secret", b"1")
        client.close()
        mc.close()
    finally:
        stop_traced()
    assert len(got.exits) == 3
    assert all("cache.key" not in e.tags for e in got.exits)
    assert got.exits[0].tags["cache.cmd"] == "SET"


# -- RedisCluster ------------------------------------------------------------------------------
def _owner(rc: Any, key: str) -> str:
    return str(rc.get_node_from_key(key).name)


def test_redis_cluster_commands_and_pipeline(traced: Traced, redis_cluster: ClusterInfo) -> None:
    """One span per command, its peer the master that owns the key's slot; a command sent to
    every master lists them; a cluster pipeline is one span, its peer the startup nodes."""
    import redis
    from redis.cluster import RedisCluster

    rc = RedisCluster(host=redis_cluster.host, port=redis_cluster.ports[0])
    try:
        keys = [f"ck:{i}" for i in range(12)]
        owners = {_owner(rc, k) for k in keys}
        assert len(owners) == 3, "the keys should land on every master"
        rc.set("ck:str", "text")
        with traced.trace() as got:
            for k in keys:
                assert rc.set(k, k) is True
            assert rc.get("ck:0") == b"ck:0"
            with pytest.raises(redis.ResponseError, match="not an integer"):
                rc.incr("ck:str")
            assert rc.dbsize(target_nodes=RedisCluster.PRIMARIES) >= 13  # every master, summed
            pipe = rc.pipeline()
            pipe.set("ck:p", 1).incr("ck:p").get("ck:1")
            assert pipe.execute() == [True, 2, b"ck:1"]
            assert rc.pipeline().execute() == []  # nothing queued: no span
        ops = [e.op for e in got.exits]
        assert ops == ["Redis/SET"] * 12 + ["Redis/GET", "Redis/INCRBY", "Redis/DBSIZE", "Redis/PIPELINE"]
        for k, e in zip(keys, got.exits, strict=False):
            assert e.peer == _owner(rc, k)
            assert e.tags == {"cache.type": "Redis", "cache.cmd": "SET", "cache.op": "write", "cache.key": k,
                              "db.instance": "0"}  # fmt: skip
            assert (e.component, e.layer, e.error) == (Component.REDIS, Layer.CACHE, False)
        get, incr, dbsize, pipeline = got.exits[12:]
        assert (get.peer, get.tags["cache.op"]) == (_owner(rc, "ck:0"), "read")
        assert incr.error and incr.peer == _owner(rc, "ck:str")
        assert incr.logs[0]["error.kind"] == "ResponseError"
        assert sorted(dbsize.peer.split(";")) == sorted(redis_cluster.nodes)
        # A sync cluster pipeline knows only its nodes manager's table: the start-up node given plus
        # those it found (here every master), sorted.
        assert pipeline.peer == ";".join(sorted(redis_cluster.nodes))
        assert pipeline.tags == {"cache.type": "Redis", "cache.cmd": "SET INCRBY GET", "cache.op": "write",
                                 "cache.key": "ck:p ck:p ck:1", "db.instance": "0"}  # fmt: skip
        with traced.untraced():
            assert rc.get("ck:1") == b"ck:1"
            assert rc.pipeline().get("ck:1").execute() == [b"ck:1"]
    finally:
        rc.close()


def test_redis_cluster_asyncio(traced: Traced, redis_cluster: ClusterInfo) -> None:
    import redis
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    async def main() -> None:
        startup = [ClusterNode(redis_cluster.host, p) for p in redis_cluster.ports[1:]]
        rc = RedisCluster(startup_nodes=startup)
        try:
            await rc.initialize()
            await rc.set("ack:str", "text")
            with traced.trace() as got:
                assert await rc.set("ack:1", "x") is True
                assert await rc.get("ack:1") == b"x"
                with pytest.raises(redis.ResponseError):
                    await rc.incr("ack:str")
                assert await rc.dbsize(target_nodes=RedisCluster.PRIMARIES) >= 2
                async with rc.pipeline() as pipe:
                    pipe.get("ack:1").exists("ack:1")
                    assert await pipe.execute() == [b"x", 1]
            ops = [e.op for e in got.exits]
            assert ops == ["Redis/SET", "Redis/GET", "Redis/INCRBY", "Redis/DBSIZE", "Redis/PIPELINE"]
            s, g, i, d, p = got.exits
            assert s.peer == g.peer == _owner(rc, "ack:1")
            assert s.tags == {"cache.type": "Redis", "cache.cmd": "SET", "cache.op": "write",
                              "cache.key": "ack:1", "db.instance": "0"}  # fmt: skip
            assert i.error and i.peer == _owner(rc, "ack:str")
            assert sorted(d.peer.split(";")) == sorted(redis_cluster.nodes)
            assert p.peer == ";".join(redis_cluster.nodes[1:])
            assert (p.tags["cache.cmd"], p.tags["cache.op"]) == ("GET EXISTS", "read")
            assert [e.error for e in got.exits] == [False, False, True, False, False]
            with traced.untraced():
                assert await rc.get("ack:1") == b"x"
        finally:
            await rc.aclose()

    asyncio.run(main())


def test_redis_cluster_transactions(traced: Traced, redis_cluster: ClusterInfo) -> None:
    """A cluster transaction goes to the master of its keys' slot: its MULTI span and (sync)
    the WATCH and the commands run at once while watching name that node (asyncio: see
    test_redis_cluster_asyncio_transaction_watch)."""
    import redis
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    rc = RedisCluster(host=redis_cluster.host, port=redis_cluster.ports[0])
    try:
        rc.set("{ct}a", 3)
        owner = _owner(rc, "{ct}a")
        with traced.trace() as got:
            with rc.pipeline(transaction=True) as pipe:
                pipe.watch("{ct}a")  # the sync ClusterPipeline's watch() returns None
                current = int(pipe.get("{ct}a"))
                pipe.multi()
                pipe.set("{ct}a", current + 1).incr("{ct}b")
                assert pipe.execute()[1] == 1  # SET: b"OK" here (redis-py 8.1 skips its callback)
            with rc.pipeline(transaction=True) as pipe:  # the watched key changes
                pipe.watch("{ct}a")
                rc.set("{ct}a", 0)
                pipe.multi()
                pipe.incr("{ct}a")
                with pytest.raises(redis.WatchError):
                    pipe.execute()
        ops = [e.op for e in got.exits]
        assert ops == ["Redis/WATCH", "Redis/GET", "Redis/MULTI", "Redis/WATCH", "Redis/SET", "Redis/MULTI"]
        assert [e.peer for e in got.exits] == [owner] * 6
        assert [e.error for e in got.exits] == [False] * 5 + [True]
        watch, get, multi = got.exits[:3]
        assert watch.tags == {"cache.type": "Redis", "cache.cmd": "WATCH", "cache.key": "{ct}a",
                              "db.instance": "0"}  # fmt: skip
        assert get.tags == {"cache.type": "Redis", "cache.cmd": "GET", "cache.op": "read",
                            "cache.key": "{ct}a", "db.instance": "0"}  # fmt: skip
        assert (multi.tags["cache.cmd"], multi.tags["cache.key"]) == ("SET INCRBY", "{ct}a {ct}b")
    finally:
        rc.close()

    async def main() -> None:
        arc = AsyncRedisCluster(host=redis_cluster.host, port=redis_cluster.ports[0])
        try:
            await arc.initialize()
            with traced.trace() as got:
                async with arc.pipeline(transaction=True) as pipe:
                    pipe.set("{ct}c", 1).incr("{ct}c")
                    assert (await pipe.execute())[1] == 2
            e = only(got)
            assert (e.op, e.peer, e.tags["cache.cmd"]) == ("Redis/MULTI", _owner(arc, "{ct}c"), "SET INCRBY")
        finally:
            await arc.aclose()

    asyncio.run(main())


def _trace_ids(traced: Traced) -> set[str]:
    """The trace ids of the segments the last ``traced.trace()`` block recorded."""
    records = traced.sink.records
    return {orjson.loads(payload)[R.SEG_TRACE_ID] for rtype, payload in records if rtype == R.SEGMENT}


def test_redis_cluster_asyncio_transaction_watch(traced: Traced, redis_cluster: ClusterInfo) -> None:
    """An asyncio cluster transaction's WATCH and the commands it runs at once while watching
    (redis-py makes their coroutines in a helper thread, awaited by the caller) are command
    spans in the caller's trace, children of its current span, their peer the master of the
    keys' slot; their results and errors, and EXEC's WatchError, reach the caller as they are."""
    import redis
    from redis.asyncio.cluster import RedisCluster

    async def main() -> None:
        arc = RedisCluster(host=redis_cluster.host, port=redis_cluster.ports[0])
        try:
            await arc.initialize()
            await arc.set("{act}a", 3)
            await arc.set("{act}s", "text")
            owner = _owner(arc, "{act}a")
            # "handler" (span 1) is the caller's current span.
            with traced.trace() as got, new_local_span("handler"):
                async with arc.pipeline(transaction=True) as pipe:
                    assert await pipe.watch("{act}a") is None  # ClusterPipeline.watch returns nothing
                    current = int(await pipe.get("{act}a"))
                    pipe.multi()
                    pipe.set("{act}a", current + 1).incr("{act}b")
                    assert (await pipe.execute())[1] == 1
                async with arc.pipeline(transaction=True) as pipe:  # a command run at once fails
                    await pipe.watch("{act}s")
                    with pytest.raises(redis.ResponseError, match="not an integer"):
                        await pipe.incr("{act}s")
                    assert await pipe.unwatch() is None
                async with arc.pipeline(transaction=True) as pipe:  # the watched key changes
                    await pipe.watch("{act}a")
                    await arc.set("{act}a", 0)
                    pipe.multi()
                    pipe.incr("{act}a")
                    with pytest.raises(redis.WatchError) as raised:
                        await pipe.execute()
                async with arc.pipeline(transaction=True) as pipe:  # cancelled as it would be
                    await pipe.watch("{act}a")
                    with pytest.raises(asyncio.TimeoutError):
                        await asyncio.wait_for(pipe.blpop(["{act}empty"], timeout=5), 0.3)
            assert type(raised.value) is redis.WatchError
            assert str(raised.value) == "Watched variable changed."
            assert await arc.get("{act}a") == b"0"
            ops = [e.op for e in got.exits]
            assert ops == ["Redis/WATCH", "Redis/GET", "Redis/MULTI", "Redis/WATCH", "Redis/INCRBY",
                           "Redis/UNWATCH", "Redis/WATCH", "Redis/SET", "Redis/MULTI", "Redis/WATCH",
                           "Redis/BLPOP"]  # fmt: skip
            assert [e.peer for e in got.exits] == [owner] * 11  # one hash tag: one slot
            assert [e.parent_id for e in got.exits] == [1] * 11
            assert (got.segments, len(_trace_ids(traced))) == (1, 1)  # the caller's one trace
            # The BLPOP cancelled by the caller's timeout is no failed command (the span logs it).
            assert [e.error for e in got.exits] == [False] * 4 + [True] + [False] * 3 + [True, False, False]
            watch, get = got.exits[:2]
            assert (watch.component, watch.layer) == (Component.REDIS, Layer.CACHE)
            assert watch.tags == {"cache.type": "Redis", "cache.cmd": "WATCH", "cache.key": "{act}a",
                                  "db.instance": "0"}  # fmt: skip
            assert get.tags == {"cache.type": "Redis", "cache.cmd": "GET", "cache.op": "read",
                                "cache.key": "{act}a", "db.instance": "0"}  # fmt: skip
            assert got.exits[4].logs[0]["error.kind"] == "ResponseError"
            assert got.exits[8].logs[0]["error.kind"] == "WatchError"
            assert got.exits[10].logs[0]["event"] == "interrupted"
            assert got.exits[10].logs[0]["kind"] == "CancelledError"
            with traced.untraced():
                async with arc.pipeline(transaction=True) as pipe:
                    await pipe.watch("{act}a")
                    assert await pipe.get("{act}a") == b"0"
        finally:
            await arc.aclose()

    asyncio.run(main())


def test_redis_cluster_instrumentation_failing_never_fails_the_call(
    traced: Traced, redis_cluster: ClusterInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    from redis.cluster import RedisCluster

    import swmp.instrument.redis as instrumented

    def changed(client: Any) -> str:
        raise AttributeError("startup_nodes")

    rc = RedisCluster(host=redis_cluster.host, port=redis_cluster.ports[0])
    monkeypatch.setattr(instrumented, "_startup", changed)
    try:
        with traced.trace() as got:
            assert rc.set("ck:f", 1) is True
            assert rc.pipeline().get("ck:f").execute() == [b"1"]
        assert got.exits == []
    finally:
        rc.close()


# -- pymemcache ---------------------------------------------------------------------------------
def test_pymemcache(traced: Traced, memcached_server: ServerInfo) -> None:
    from pymemcache.client.base import Client, PooledClient
    from pymemcache.exceptions import MemcacheClientError, MemcacheIllegalInputError

    addr = (memcached_server.host, memcached_server.port)
    mc = Client(addr)
    pooled = PooledClient(addr)
    try:
        with traced.trace() as got:
            assert mc.set("mk:1", b"10") is True
            assert mc.get("mk:1") == b"10"
            assert mc.get_many(["mk:1", "mk:2"]) == {"mk:1": b"10"}
            assert mc.incr("mk:1", 5) == 15
            assert pooled.get("mk:1") == b"15"  # PooledClient delegates to Client: one span
            mc.set("mk:s", b"text")
            with pytest.raises(MemcacheClientError):
                mc.incr("mk:s", 1)
            with pytest.raises(MemcacheIllegalInputError):
                mc.get("bad key")
        ops = [e.op for e in got.exits]
        assert ops == ["Memcached/set", "Memcached/get", "Memcached/get_many", "Memcached/incr",
                       "Memcached/get", "Memcached/set", "Memcached/incr", "Memcached/get"]  # fmt: skip
        first = got.exits[0]
        assert first.peer == f"127.0.0.1:{memcached_server.port}"
        assert (first.component, first.layer) == (Component.MEMCACHED, Layer.CACHE)
        assert first.tags == {"cache.type": "Memcached", "cache.cmd": "set", "cache.op": "write",
                              "cache.key": "mk:1"}  # fmt: skip
        assert got.exits[2].tags["cache.key"] == "mk:1 mk:2"
        assert got.exits[1].tags["cache.op"] == "read"
        assert [e.error for e in got.exits] == [False] * 6 + [True, True]
        with traced.untraced():
            assert mc.get("mk:1") == b"15"
    finally:
        mc.close()
        pooled.close()


def test_pymemcache_first_argument_by_name(traced: Traced, memcached_server: ServerInfo) -> None:
    """The *_many commands name their first parameter ``values`` / ``keys``; given by name,
    the call reaches the client as without the agent, and is traced with its keys."""
    from pymemcache.client.base import Client

    mc = Client((memcached_server.host, memcached_server.port))
    try:
        with traced.trace() as got:
            assert mc.set_many(values={"kw:1": b"1", "kw:2": b"2"}) == []
            assert mc.get_many(keys=["kw:1", "kw:2"]) == {"kw:1": b"1", "kw:2": b"2"}
            assert mc.get(key="kw:1") == b"1"
            assert mc.delete_many(keys=["kw:1", "kw:2"]) is True
        assert [(e.op, e.tags.get("cache.key")) for e in got.exits] == [
            ("Memcached/set_many", "kw:1 kw:2"),
            ("Memcached/get_many", "kw:1 kw:2"),
            ("Memcached/get", "kw:1"),
            ("Memcached/delete_many", "kw:1 kw:2"),
        ]
    finally:
        mc.close()


def test_a_failing_instrumentation_never_fails_the_call(
    traced: Traced, r: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Should a driver change what the instrumentation reads, the call still runs: no span,
    one warning."""
    import swmp.instrument.redis as instrumented

    def changed(client: Any) -> tuple[str, str]:
        raise AttributeError("connection_pool")

    monkeypatch.setattr(instrumented, "_where", changed)
    with traced.trace() as got:
        assert r.set("rk:g", 1) is True
        assert r.get("rk:g") == b"1"
    assert got.exits == []
    assert len([m for m in caplog.messages if "calls go on without spans" in m]) == 1


def test_disable_plugins_by_swmp_and_peer_names(redis_server: ServerInfo) -> None:
    import psycopg  # noqa: F401
    import psycopg2  # noqa: F401
    import pymysql  # noqa: F401
    import redis

    t, status = start_traced(agent_disable_plugins=("sw_(redis|pymysql)", "psycopg*"))
    try:
        client = redis.Redis(host=redis_server.host, port=redis_server.port)
        with t.trace() as got:
            client.get("rk:off")
        client.close()
    finally:
        stop_traced()
    assert {n: status[n] for n in ("redis", "pymysql", "psycopg", "psycopg2")} == dict.fromkeys(
        ("redis", "pymysql", "psycopg", "psycopg2"), "disabled"
    )
    assert status["asyncpg"] != "disabled"
    assert got.exits == []
