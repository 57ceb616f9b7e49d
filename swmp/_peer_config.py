"""The environment variables the Apache SkyWalking Python agent reads, and what swmp makes of them.

A deployment that switches agents keeps its environment. Every variable swmp declares
(``swmp.config``) works as before; the ones it does not declare have no effect, and
:func:`unsupported` names the ones that are set so that the configuration loader can say
so, once, in one log line, instead of ignoring them silently. docs/migrating.md is the
human-readable form of this table (a test keeps the two in step).

Which of them swmp supports is computed from its own declarations, not listed here, so a
setting added to ``swmp.config`` later is recognised at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# Every SW_* variable of the peer agent's config module (version 1.2), with why swmp has no
# equivalent when it has none. Prefix families (SW_KAFKA_REPORTER_CONFIG_*) are declared
# in swmp.config and not repeated here.
PEER_VARIABLES: dict[str, str] = {
    "SW_AGENT_COLLECTOR_BACKEND_SERVICES": "",
    "SW_AGENT_PROTOCOL": "",
    "SW_AGENT_NAME": "",
    "SW_AGENT_INSTANCE_NAME": "",
    "SW_AGENT_NAMESPACE": "",
    "SW_KAFKA_BOOTSTRAP_SERVERS": "",
    "SW_KAFKA_NAMESPACE": "",
    "SW_KAFKA_TOPIC_MANAGEMENT": "",
    "SW_KAFKA_TOPIC_SEGMENT": "",
    "SW_KAFKA_TOPIC_LOG": "",
    "SW_KAFKA_TOPIC_METER": "",
    "SW_KAFKA_REPORTER_CUSTOM_CONFIGURATIONS": (
        "unused by the peer agent too: set SW_KAFKA_REPORTER_CONFIG_<KEY>"
    ),
    "SW_AGENT_FORCE_TLS": "",
    "SW_AGENT_AUTHENTICATION": "",
    "SW_AGENT_LOGGING_LEVEL": "",
    "SW_AGENT_COLLECTOR_HEARTBEAT_PERIOD": "",
    "SW_AGENT_COLLECTOR_PROPERTIES_REPORT_PERIOD_FACTOR": "",
    "SW_AGENT_INSTANCE_PROPERTIES_JSON": "",
    "SW_AGENT_EXPERIMENTAL_FORK_SUPPORT": "not needed: swmp is built for fork (one ring per worker)",
    "SW_AGENT_QUEUE_TIMEOUT": "no queue to wait on: a full ring drops and counts, never blocks",
    "SW_AGENT_ASYNCIO_ENHANCEMENT": "the reporter always runs asyncio clients, in its own process",
    "SW_AGENT_SW_PYTHON_BOOTSTRAP_PROPAGATE": (
        "`swmp run` starts the agent in every Python interpreter it runs"
    ),
    "SW_AGENT_SW_PYTHON_CLI_DEBUG_ENABLED": (
        "use SW_AGENT_LOGGING_LEVEL=DEBUG (SWMP_RUN_VERBOSE=1: the loader)"
    ),
    "SW_AGENT_TRACE_REPORTER_MAX_BUFFER_SIZE": "buffers are sized in bytes: SW_AGENT_RING_SIZE",
    "SW_AGENT_TRACE_IGNORE_PATH": "",
    "SW_AGENT_IGNORE_SUFFIX": "",
    "SW_CORRELATION_ELEMENT_MAX_NUMBER": "",
    "SW_CORRELATION_VALUE_MAX_LENGTH": "",
    "SW_AGENT_PROFILE_ACTIVE": "",
    "SW_AGENT_COLLECTOR_GET_PROFILE_TASK_INTERVAL": "",
    "SW_AGENT_PROFILE_MAX_PARALLEL": "",
    "SW_AGENT_PROFILE_DURATION": "",
    "SW_AGENT_PROFILE_DUMP_MAX_STACK_DEPTH": "",
    "SW_AGENT_PROFILE_SNAPSHOT_TRANSPORT_BUFFER_SIZE": (
        "snapshots travel through the worker's ring: the ring is the buffer"
    ),
    "SW_AGENT_LOG_REPORTER_ACTIVE": "",
    "SW_AGENT_LOG_REPORTER_SAFE_MODE": "",
    "SW_AGENT_LOG_REPORTER_MAX_BUFFER_SIZE": "buffers are sized in bytes: SW_AGENT_RING_SIZE",
    "SW_AGENT_LOG_REPORTER_LEVEL": "",
    "SW_AGENT_LOG_REPORTER_IGNORE_FILTER": "",
    "SW_AGENT_LOG_REPORTER_FORMATTED": "",
    "SW_AGENT_LOG_REPORTER_LAYOUT": "",
    "SW_AGENT_CAUSE_EXCEPTION_DEPTH": "",
    "SW_AGENT_METER_REPORTER_ACTIVE": "",
    "SW_AGENT_METER_REPORTER_MAX_BUFFER_SIZE": "buffers are sized in bytes: SW_AGENT_RING_SIZE",
    "SW_AGENT_METER_REPORTER_PERIOD": "",
    "SW_AGENT_PVM_METER_REPORTER_ACTIVE": "",
    "SW_AGENT_DISABLE_PLUGINS": "",
    "SW_PLUGIN_HTTP_HTTP_PARAMS_LENGTH_THRESHOLD": "",
    "SW_PLUGIN_HTTP_IGNORE_METHOD": "",
    "SW_PLUGIN_SQL_PARAMETERS_MAX_LENGTH": "no SQL parameter collection in swmp",
    "SW_PLUGIN_PYMONGO_TRACE_PARAMETERS": "no pymongo instrumentation in swmp",
    "SW_PLUGIN_PYMONGO_PARAMETERS_MAX_LENGTH": "no pymongo instrumentation in swmp",
    "SW_PLUGIN_ELASTICSEARCH_TRACE_DSL": "no Elasticsearch instrumentation in swmp",
    "SW_PLUGIN_FLASK_COLLECT_HTTP_PARAMS": "",
    "SW_PLUGIN_SANIC_COLLECT_HTTP_PARAMS": "no Sanic parameter collection in swmp",
    "SW_PLUGIN_DJANGO_COLLECT_HTTP_PARAMS": "",
    "SW_PLUGIN_FASTAPI_COLLECT_HTTP_PARAMS": "",
    "SW_PLUGIN_BOTTLE_COLLECT_HTTP_PARAMS": "no Bottle parameter collection in swmp",
    "SW_PLUGIN_CELERY_PARAMETERS_LENGTH": "no Celery parameter collection in swmp",
    "SW_PLUGIN_GRPC_IGNORED_METHODS": "no gRPC server/client instrumentation setting in swmp",
    "SW_SAMPLE_N_PER_3_SECS": "",
}


def unsupported(environ: Mapping[str, str], declared: Iterable[str]) -> list[str]:
    """The peer agent's variables set in ``environ`` that are not among swmp's ``declared``
    names (variables and aliases), sorted."""
    known = set(declared)
    return sorted(v for v in PEER_VARIABLES if v in environ and v not in known)
