"""redis-py commands whose arguments carry a secret record no ``cache.key``: AUTH (password,
user name), HELLO ... AUTH, MIGRATE ... AUTH / AUTH2, CONFIG SET masterauth, ACL SETUSER
>password; alone and in pipelines, sync (a name seen before runs in C, swmp/_native/cache.c),
asyncio and RedisCluster, against a real Redis. No record the agent reports holds the secret
or the user name; ordinary commands keep their key."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from swmp.instrument._cache_commands import key_allowed
from tests.daemons import ServerInfo
from tests.datastore_support import Got, Traced, traced
from tests.redis_cluster import ClusterInfo, redis_cluster

__all__ = ["redis_cluster", "traced"]

SECRET = "s3cr3t-of-swmp"
USER = "swmp-secret-user"


def _nothing_reported_has_the_secret(t: Traced) -> None:
    payloads = [bytes(p) for _, p in list(t.sink.records)]
    assert payloads
    assert not [p for p in payloads if SECRET.encode() in p or USER.encode() in p]


def _keys(got: Got) -> list[tuple[str, str | None]]:
    return [(e.tags["cache.cmd"], e.tags.get("cache.key")) for e in got.exits]


@pytest.fixture()
def admin(traced: Traced, redis_server: ServerInfo) -> Iterator[Any]:
    """A client that can make the user the commands authenticate as, and undoes what they set."""
    import redis

    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    yield client
    with traced.untraced():
        client.config_set("masterauth", "")
        client.acl_deluser(USER)
    client.close()


def _setuser(admin: Any) -> None:
    assert admin.acl_setuser(USER, enabled=True, passwords=[f"+{SECRET}"], keys=["*"], commands=["+@all"])


def test_redis_commands_with_secrets_record_no_key(
    traced: Traced, admin: Any, redis_server: ServerInfo
) -> None:
    import redis

    client = redis.Redis(host=redis_server.host, port=redis_server.port, db=3)
    try:
        with traced.trace() as got:
            _setuser(admin)
            for _ in range(2):  # the second time the names are known: the native path's
                assert client.auth(SECRET, username=USER) is True
                assert client.auth(SECRET, USER) is True
                client.execute_command("HELLO", 2, "AUTH", USER, SECRET)
                assert admin.config_set("masterauth", SECRET) is True
                assert admin.execute_command("CONFIG", "SET", "masterauth", SECRET)
                assert (
                    admin.migrate(redis_server.host, redis_server.port, ["rk:none"], 4, 1000, auth=SECRET)
                    == b"NOKEY"
                )
                migrate2 = (
                    "MIGRATE",
                    redis_server.host,
                    redis_server.port,
                    "",
                    4,
                    1000,
                    "AUTH2",
                    USER,
                    SECRET,
                )
                assert admin.execute_command(*migrate2, "KEYS", "rk:none") == b"NOKEY"
            pipe = client.pipeline(transaction=False)
            assert pipe.auth(SECRET, username=USER).get("rk:s").execute() == [True, None]
            assert client.get("rk:s") is None
        secret_cmds = ["ACL SETUSER"] + [
            "AUTH",
            "AUTH",
            "HELLO",
            "CONFIG SET",
            "CONFIG",
            "MIGRATE",
            "MIGRATE",
        ] * 2
        assert _keys(got) == [(c, None) for c in secret_cmds] + [("AUTH GET", "rk:s"), ("GET", "rk:s")]
    finally:
        client.close()
    _nothing_reported_has_the_secret(traced)


def test_redis_asyncio_commands_with_secrets_record_no_key(
    traced: Traced, admin: Any, redis_server: ServerInfo
) -> None:
    import redis.asyncio as aredis

    async def main() -> Got:
        client = aredis.Redis(host=redis_server.host, port=redis_server.port)
        try:
            with traced.trace() as got:
                for _ in range(2):  # known names: within.c's lazy awaitable
                    assert await client.auth(SECRET, username=USER) is True
                    assert await client.config_set("masterauth", SECRET) is True
                async with client.pipeline() as pipe:
                    pipe.auth(SECRET, username=USER).get("rk:as")
                    assert await pipe.execute() == [True, None]
            return got
        finally:
            await client.aclose()

    _setuser(admin)
    got = asyncio.run(main())
    assert _keys(got) == [("AUTH", None), ("CONFIG SET", None)] * 2 + [("AUTH GET", "rk:as")]
    _nothing_reported_has_the_secret(traced)


def test_redis_cluster_commands_with_secrets_record_no_key(
    traced: Traced, redis_cluster: ClusterInfo
) -> None:
    from redis.cluster import RedisCluster

    rc = RedisCluster(host=redis_cluster.host, port=redis_cluster.ports[0])
    try:
        with traced.trace() as got:
            rc.config_set("masterauth", SECRET)
            pipe = rc.pipeline()
            pipe.get("ck:s").execute_command("CONFIG SET", "masterauth", SECRET)
            assert pipe.execute() == [None, True]
        assert _keys(got) == [("CONFIG SET", None), ("GET CONFIG SET", "ck:s")]
        _nothing_reported_has_the_secret(traced)
    finally:
        with traced.untraced():
            rc.config_set("masterauth", "")
        rc.close()


_NO_KEY = ("AUTH", "HELLO", "MIGRATE", "CONFIG SET", "CONFIG", "ACL SETUSER", "SENTINEL SET", "MODULE LOADEX")


@pytest.mark.parametrize("cmd", [*_NO_KEY, "GET", "AUTHX", "CLIENT SETNAME"])
def test_which_commands_keep_their_key(cmd: str) -> None:
    assert key_allowed(cmd) is (cmd not in _NO_KEY)
