"""Code written for the Apache SkyWalking Python agent, running on swmp.

The module paths mirror that agent's, under ``swmp.compat``: replace ``skywalking`` with
``swmp.compat`` in the imports and the code runs unchanged (docs/migrating.md)::

    from swmp.compat import Component, Layer           # from skywalking import ...
    from swmp.compat.decorators import trace, runnable  # from skywalking.decorators import ...
    from swmp.compat.trace.context import get_context   # from skywalking.trace.context import ...
    from swmp.compat.trace.tags import Tag              # from skywalking.trace.tags import ...

Same names, signatures and enum values; underneath, swmp's spans (``swmp.tracing``). What is
not offered: the agent's internals (``skywalking.agent``, its ``config`` module: configure
swmp with the same ``SW_*`` variables instead).
"""

from __future__ import annotations

from enum import Enum


class Component(Enum):
    """SkyWalking component ids, named as in the SkyWalking Python agent."""

    Unknown = 0
    General = 7000
    Flask = 7001
    Requests = 7002
    PyMysql = 7003
    Django = 7004
    Tornado = 7005
    Redis = 7
    MongoDB = 9
    PostgreSQL = 22
    KafkaProducer = 40
    KafkaConsumer = 41
    RabbitmqProducer = 52
    RabbitmqConsumer = 53
    PulsarProducer = 73
    PulsarConsumer = 74
    Elasticsearch = 47
    HBase = 94
    Neo4j = 112
    Urllib3 = 7006
    Sanic = 7007
    AioHttp = 7008
    Pyramid = 7009
    Psycopg = 7010
    Celery = 7011
    Falcon = 7012
    MysqlClient = 7013
    FastAPI = 7014
    Bottle = 7015
    AsyncPG = 7016
    AIORedis = 7017
    Websockets = 7018
    HTTPX = 7019
    Grpc = 23


class Layer(Enum):
    Unknown = 0
    Database = 1
    RPCFramework = 2
    Http = 3
    MQ = 4
    Cache = 5


class Kind(Enum):
    Local = 0
    Entry = 1
    Exit = 2

    @property
    def is_local(self) -> bool:
        return self == Kind.Local

    @property
    def is_entry(self) -> bool:
        return self == Kind.Entry

    @property
    def is_exit(self) -> bool:
        return self == Kind.Exit


def number(value: object, default: int = 0) -> int:
    """An enum member or a plain int, as the int swmp's spans store."""
    if isinstance(value, Enum):
        value = value.value
    return value if isinstance(value, int) else default


__all__ = ["Component", "Kind", "Layer"]
