"""The OAP GraphQL client the e2e tests use lives in the product now (``swmp traces --oap``
uses it too): :mod:`swmp.traceview.oap`. Re-exported here for the tests that import it."""

from swmp.traceview.oap import (
    BasicTrace,
    GraphQLError,
    Instance,
    LogRecord,
    MqeResult,
    OapGraphQL,
    Ref,
    Service,
    Span,
    SpanLog,
    duration,
    entity,
    wait_for,
)

__all__ = [
    "BasicTrace",
    "GraphQLError",
    "Instance",
    "LogRecord",
    "MqeResult",
    "OapGraphQL",
    "Ref",
    "Service",
    "Span",
    "SpanLog",
    "duration",
    "entity",
    "wait_for",
]
