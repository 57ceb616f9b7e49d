"""Core and Kafka settings: who the service is, where the backend is, how to reach it."""

from __future__ import annotations

from dataclasses import dataclass

from reporter_proc.settings import BOUNDS, TEXT, one_of, seconds
from swmp.config._declare import (
    CORE,
    KAFKA,
    KAFKA_CONFIG_PREFIX,
    PROTOCOLS,
    addresses,
    log_level,
    opt,
)


@dataclass(frozen=True)
class CoreSettings:
    """Service identity and the backend connection."""

    agent_name: str = opt("Python Service Name", "SW_AGENT_NAME", "Service name shown in SkyWalking.", CORE)
    agent_instance_name: str = opt(
        "",
        "SW_AGENT_INSTANCE_NAME",
        "Instance name prefix; each worker reports `<name>-w<slot>`. Empty: `<hostname>-<master pid>`.",
        CORE,
    )
    agent_namespace: str = opt(
        "", "SW_AGENT_NAMESPACE", "Namespace; the reported service name becomes `name|namespace`.", CORE
    )
    agent_collector_backend_services: str = opt(
        "127.0.0.1:11800",
        "SW_AGENT_COLLECTOR_BACKEND_SERVICES",
        "OAP address(es), `host:port[,host:port]` (11800 gRPC, 12800 HTTP); Kafka ignores it.",
        CORE,
        check=addresses,
    )
    agent_protocol: str = opt(
        "grpc",
        "SW_AGENT_PROTOCOL",
        "Transport to the backend: `grpc`, `http` or `kafka`.",
        CORE,
        check=one_of(PROTOCOLS),
    )
    agent_authentication: str = opt(
        "",
        "SW_AGENT_AUTHENTICATION",
        "Authentication token sent to the OAP (gRPC metadata): printable ASCII.",
        CORE,
        check=TEXT["authentication"],
    )
    agent_force_tls: bool = opt(
        False,
        "SW_AGENT_FORCE_TLS",
        "Use TLS to the gRPC/HTTP backend (system CAs unless SW_AGENT_TLS_CA_FILE).",
        CORE,
    )
    agent_logging_level: str = opt(
        "INFO",
        "SW_AGENT_LOGGING_LEVEL",
        "Level set on the agent's own loggers (`swmp`, `ipc`) when it starts, however it is started; "
        "the reporter process and thread inherit it. swmp adds no handler: the application's logging "
        "configuration (or Python's last-resort stderr output, WARNING and above) shows the records.",
        CORE,
        check=log_level,
    )
    agent_collector_heartbeat_period: float = opt(
        30.0,
        "SW_AGENT_COLLECTOR_HEARTBEAT_PERIOD",
        "Seconds between instance keep-alives (1 to 86400).",
        CORE,
        # Narrower than the reporter's keepalive_interval_s bound (50 ms, its tick): the
        # reporter's tests ping fast, a user's setting need not.
        check=seconds(1),
    )
    agent_collector_properties_report_period_factor: int = opt(
        10,
        "SW_AGENT_COLLECTOR_PROPERTIES_REPORT_PERIOD_FACTOR",
        "Instance properties are re-sent every `factor` keep-alives.",
        CORE,
        check=BOUNDS["properties_every_n_keepalives"],
    )
    agent_instance_properties_json: str = opt(
        "",
        "SW_AGENT_INSTANCE_PROPERTIES_JSON",
        'Extra instance properties as a JSON object, e.g. `{"k": "v"}`.',
        CORE,
    )


@dataclass(frozen=True)
class KafkaSettings:
    """The Kafka transport (``SW_AGENT_PROTOCOL=kafka``)."""

    kafka_bootstrap_servers: str = opt(
        "localhost:9092",
        "SW_KAFKA_BOOTSTRAP_SERVERS",
        "Kafka brokers, `host:port[,host:port]`.",
        KAFKA,
        check=addresses,
    )
    kafka_namespace: str = opt(
        "",
        "SW_KAFKA_NAMESPACE",
        "Prefix (`<namespace>-`) for the topic names, as the OAP's SW_NAMESPACE.",
        KAFKA,
    )
    kafka_topic_management: str = opt(
        "skywalking-managements",
        "SW_KAFKA_TOPIC_MANAGEMENT",
        "Topic for instance properties and pings.",
        KAFKA,
        aliases=("SW_KAFKA_REPORTER_TOPIC_MANAGEMENT",),
    )
    kafka_topic_segment: str = opt(
        "skywalking-segments",
        "SW_KAFKA_TOPIC_SEGMENT",
        "Topic for trace segments.",
        KAFKA,
        aliases=("SW_KAFKA_REPORTER_TOPIC_SEGMENT",),
    )
    kafka_topic_log: str = opt(
        "skywalking-logs",
        "SW_KAFKA_TOPIC_LOG",
        "Topic for logs.",
        KAFKA,
        aliases=("SW_KAFKA_REPORTER_TOPIC_LOG",),
    )
    kafka_topic_meter: str = opt(
        "skywalking-meters",
        "SW_KAFKA_TOPIC_METER",
        "Topic for meters.",
        KAFKA,
        aliases=("SW_KAFKA_REPORTER_TOPIC_METER",),
    )
    kafka_reporter_config: dict[str, str] = opt(  # noqa: RUF009 (a default_factory field)
        {},
        "SW_KAFKA_REPORTER_CONFIG_*",
        "Producer options: `SW_KAFKA_REPORTER_CONFIG_<KEY>=value` sets `<key>` (e.g. `..._ACKS=all`, "
        "`..._COMPRESSION_TYPE=gzip`); keyword: a dict. Keys are read in any case, `.` and `-` as `_` "
        "(`compression.type` is `compression_type`), the same for every key including the codec; "
        "codec `none` is no compression, as in Kafka.",
        KAFKA,
        prefix=KAFKA_CONFIG_PREFIX,
    )
