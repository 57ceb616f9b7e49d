"""SkyWalking enums and component ids, as plain ints (what the record format carries).

Component ids are the ones registered in Apache SkyWalking's ``component-libraries.yml``
for Python (the same the SkyWalking Python agent reports), so the OAP shows the right
names and icons. Unknown means "use ``UNKNOWN``": the backend accepts it.
"""

from __future__ import annotations

from typing import Final

from reporter_proc import records as _r


class Kind:
    ENTRY: Final = _r.SPAN_TYPE_ENTRY
    EXIT: Final = _r.SPAN_TYPE_EXIT
    LOCAL: Final = _r.SPAN_TYPE_LOCAL


class Layer:
    UNKNOWN: Final = _r.LAYER_UNKNOWN
    DATABASE: Final = _r.LAYER_DATABASE
    RPC_FRAMEWORK: Final = _r.LAYER_RPC_FRAMEWORK
    HTTP: Final = _r.LAYER_HTTP
    MQ: Final = _r.LAYER_MQ
    CACHE: Final = _r.LAYER_CACHE
    FAAS: Final = _r.LAYER_FAAS


class Component:
    UNKNOWN: Final = 0
    MYSQL: Final = 5  # generic MySQL: aiomysql, which has no id of its own
    REDIS: Final = 7  # redis-py, sync and asyncio (the SkyWalking Python agent's sw_redis)
    MEMCACHED: Final = 20  # pymemcache (no Python-specific id)
    GRPC: Final = 23  # "GRPC": grpcio servers and clients (the SkyWalking Python agent uses it too)
    KAFKA_PRODUCER: Final = 40  # kafka-python, confluent-kafka, aiokafka
    KAFKA_CONSUMER: Final = 41
    RABBITMQ_PRODUCER: Final = 52  # pika, aiormq (and aio-pika through it)
    RABBITMQ_CONSUMER: Final = 53
    PYTHON: Final = 7000  # "Python": built-in modules (http.client, plain WSGI/ASGI, manual spans)
    FLASK: Final = 7001
    REQUESTS: Final = 7002
    PYMYSQL: Final = 7003
    DJANGO: Final = 7004
    TORNADO: Final = 7005
    URLLIB3: Final = 7006
    SANIC: Final = 7007
    AIOHTTP: Final = 7008
    PYRAMID: Final = 7009
    PSYCOPG: Final = 7010  # "Psychopg" in component-libraries.yml: psycopg2 and psycopg 3
    CELERY: Final = 7011
    FALCON: Final = 7012
    MYSQLCLIENT: Final = 7013
    FASTAPI: Final = 7014  # also used for plain Starlette, which has no id of its own
    BOTTLE: Final = 7015
    ASYNCPG: Final = 7016
    WEBSOCKETS: Final = 7018
    HTTPX: Final = 7019


# Tag keys the OAP understands (same as the SkyWalking Python agent).
TAG_HTTP_METHOD: Final = "http.method"
TAG_HTTP_URL: Final = "http.url"
TAG_HTTP_STATUS: Final = "http.status_code"
TAG_HTTP_PARAMS: Final = "http.params"
TAG_MQ_BROKER: Final = "mq.broker"
TAG_MQ_TOPIC: Final = "mq.topic"
TAG_MQ_QUEUE: Final = "mq.queue"
TAG_CELERY_PARAMETERS: Final = "celery.parameters"
TAG_DB_TYPE: Final = "db.type"
TAG_DB_INSTANCE: Final = "db.instance"
TAG_DB_STATEMENT: Final = "db.statement"
TAG_DB_SQL_PARAMETERS: Final = "db.sql.parameters"
TAG_CACHE_TYPE: Final = "cache.type"
TAG_CACHE_CMD: Final = "cache.cmd"
TAG_CACHE_OP: Final = "cache.op"
TAG_CACHE_KEY: Final = "cache.key"
TAG_HTTP_STATUS_MSG: Final = "http.status_msg"
TAG_GRPC_METHOD: Final = "grpc.method"
TAG_GRPC_URL: Final = "grpc.url"
TAG_GRPC_STATUS: Final = "grpc.status_code"
