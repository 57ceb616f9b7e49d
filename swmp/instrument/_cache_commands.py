"""Redis and memcached command names by effect: the ``cache.op`` tag (``read`` / ``write``) the
OAP's cache read and write metrics group by, and the first tags of a cache span per command.
"""

from __future__ import annotations

from swmp.tracing.constants import TAG_CACHE_CMD, TAG_CACHE_OP, TAG_CACHE_TYPE

__all__ = [
    "READ_COMMANDS",
    "SECRET_ARGUMENT_COMMANDS",
    "WRITE_COMMANDS",
    "cache_head",
    "cache_op",
    "key_allowed",
]

# Redis commands by effect (cache.op), for the OAP's cache read/write metrics. Commands in
# neither set (PING, PUBLISH, EXPIRE, pipelines of mixed kinds...) get no cache.op.
_READ = (
    "GET MGET GETRANGE GETBIT STRLEN EXISTS TTL PTTL TYPE KEYS SCAN HGET HMGET HGETALL HKEYS HVALS HLEN "
    "HEXISTS HSCAN HSTRLEN HRANDFIELD LINDEX LLEN LRANGE LPOS SCARD SISMEMBER SMISMEMBER SMEMBERS "
    "SRANDMEMBER SSCAN SINTER SUNION SDIFF ZCARD ZCOUNT ZLEXCOUNT ZSCORE ZMSCORE ZRANK ZREVRANK ZRANGE "
    "ZRANGEBYLEX ZRANGEBYSCORE ZREVRANGE ZREVRANGEBYLEX ZREVRANGEBYSCORE ZSCAN XRANGE XREVRANGE XREAD "
    "XLEN GETEX GETDEL BLPOP BRPOP LPOP RPOP SPOP ZPOPMIN ZPOPMAX "
    "get gets gat gats get_many get_multi gets_many"  # memcached
)
_WRITE = (
    "SET SETEX PSETEX SETNX SETRANGE SETBIT MSET MSETNX GETSET APPEND INCR INCRBY INCRBYFLOAT DECR "
    "DECRBY DEL UNLINK EXPIRE PEXPIRE EXPIREAT PEXPIREAT PERSIST RENAME RENAMENX HSET HSETNX HMSET HDEL "
    "HINCRBY HINCRBYFLOAT LPUSH LPUSHX RPUSH RPUSHX LINSERT LSET LREM LTRIM RPOPLPUSH LMOVE BRPOPLPUSH "
    "SADD SREM SMOVE SINTERSTORE SUNIONSTORE SDIFFSTORE ZADD ZINCRBY ZREM ZREMRANGEBYLEX ZREMRANGEBYRANK "
    "ZREMRANGEBYSCORE ZINTERSTORE ZUNIONSTORE XADD XDEL XTRIM FLUSHDB FLUSHALL "
    "set add replace append prepend cas delete incr decr touch set_many set_multi delete_many "
    "delete_multi flush_all"  # memcached
)
READ_COMMANDS = frozenset(_READ.split())
WRITE_COMMANDS = frozenset(_WRITE.split())


# Redis commands whose arguments can carry a secret: AUTH's password (and user name), HELLO's
# AUTH user password, MIGRATE's AUTH / AUTH2, CONFIG SET requirepass / masterauth, ACL SETUSER's
# >password, SENTINEL SET auth-pass, MODULE LOADEX's CONFIG values. Their first argument is not
# a key, and none of their arguments may become cache.key. By the command's first word:
# redis-py names subcommands "CONFIG SET", "ACL SETUSER".
SECRET_ARGUMENT_COMMANDS = frozenset({"AUTH", "HELLO", "MIGRATE", "CONFIG", "ACL", "SENTINEL", "MODULE"})


def key_allowed(cmd: str) -> bool:
    """Whether an argument of the (upper-case) Redis command ``cmd`` may be its cache.key."""
    return cmd.partition(" ")[0] not in SECRET_ARGUMENT_COMMANDS


def cache_op(cmd: str) -> str:
    """``"read"``, ``"write"`` or ``""`` for a Redis or memcached command name."""
    if cmd in READ_COMMANDS:
        return "read"
    if cmd in WRITE_COMMANDS:
        return "write"
    upper = cmd.upper()
    return "read" if upper in READ_COMMANDS else "write" if upper in WRITE_COMMANDS else ""


_heads: dict[tuple[str, str], tuple[str, ...]] = {}


def cache_head(cache_type: str, cmd: str) -> tuple[str, ...]:
    """The first tags of a cache span for one command: ``cache.type``, ``cache.cmd`` and (for
    a read or write command) ``cache.op``, made once per command (bounded memo)."""
    try:
        return _heads[cache_type, cmd]
    except KeyError:
        pass
    k = cache_op(cmd)
    head: tuple[str, ...] = (TAG_CACHE_TYPE, cache_type, TAG_CACHE_CMD, cmd)
    if k:
        head += (TAG_CACHE_OP, k)
    if len(_heads) >= 1024:
        _heads.clear()
    _heads[cache_type, cmd] = head
    return head
