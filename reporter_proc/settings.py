"""What the reporter needs to know, as one plain value.

The in-application agent owns configuration (every ``SW_*`` variable is declared in
``swmp.config``) and hands the reporter this dataclass. Keeping it free of the agent's
config machinery means the reporter never imports the instrumentation side and tests can
build one in a line.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def kafka_key(raw: str) -> str:
    """A SW_KAFKA_REPORTER_CONFIG_* key as a producer argument name ("Linger.MS" -> "linger_ms").

    The one normalisation of those keys: the agent's config splits ``compression_type`` out
    with it and the Kafka sender reads the rest with it, so both see the same names.
    """
    return raw.strip().lower().replace(".", "_").replace("-", "_")


@dataclass(frozen=True)
class ReporterSettings:
    service: str = "python-service"
    namespace: str = ""
    protocol: str = "grpc"  # grpc | http | kafka
    # host:port entries; several mean fail-over, tried in order.
    backends: tuple[str, ...] = ("127.0.0.1:11800",)
    authentication: str = ""
    force_tls: bool = False
    # TLS to gRPC/HTTP backends (any of these set also means TLS; see senders/tls.py)
    tls_ca_file: str = ""  # PEM CA bundle to trust instead of the system's
    tls_cert_file: str = ""  # PEM client certificate (mTLS), with tls_key_file
    tls_key_file: str = ""
    tls_server_name: str = ""  # name the server certificate must carry (override of the host)
    # gRPC segments: False = batched collectInSync (measured cheaper on both ends, see
    # docs/performance.md); True = one long-lived client stream of `collect`.
    grpc_segment_stream: bool = False
    # Kafka (kafka_namespace overrides namespace for topic prefixes when set)
    kafka_namespace: str = ""
    kafka_bootstrap_servers: tuple[str, ...] = ("127.0.0.1:9092",)
    kafka_topic_segment: str = "skywalking-segments"
    kafka_topic_log: str = "skywalking-logs"
    kafka_topic_meter: str = "skywalking-meters"
    kafka_topic_management: str = "skywalking-managements"
    kafka_compression: str = ""  # "", gzip, snappy, lz4, zstd
    kafka_extra: dict[str, str] = field(default_factory=dict)  # SW_KAFKA_REPORTER_CONFIG_*
    # Batching and timing
    batch_max_records: int = 1000
    # A batch is sealed at this many payload bytes too: far below the OAP's 50 MiB gRPC limit.
    batch_max_bytes: int = 4 * 1024 * 1024
    # The longest a record read below saturation waits before it is sent: every open batch
    # is sent on this tick. A send costs ~1.5 ms of CPU whatever it carries (a gRPC call wakes
    # gRPC's threads), which at ordinary rates is most of the reporter's cost per request
    # (docs/performance.md), so a quiet application sends seldom...
    flush_interval_s: float = 5.0
    # ...and a busier one sooner: a batch holding this many records is sent on the next read
    # tick, where one call's cost spread over its records is small.
    send_early_records: int = 500
    # The intake's read tick below saturation (a ring a quarter full rings the doorbell and
    # is read at once): reading keeps the rings nearly empty whatever the flush interval.
    poll_interval_s: float = 1.0
    keepalive_interval_s: float = 30.0
    properties_every_n_keepalives: int = 10
    send_timeout_s: float = 10.0
    retry_max_attempts: int = 5
    retry_backoff_base_s: float = 0.5
    # Capped at 1 s: while the backend is down, the oldest batch is retried about once a
    # second, so delivery resumes within ~1 s of its return (issue 16).
    retry_backoff_max_s: float = 1.0
    max_pending_bytes: int = 64 * 1024 * 1024
    shutdown_deadline_s: float = 5.0
    # Features
    profile_enabled: bool = True
    profile_task_interval_s: float = 20.0  # SW_AGENT_COLLECTOR_GET_PROFILE_TASK_INTERVAL
    meter_enabled: bool = True
    log_enabled: bool = True
    # Spool (disk buffer during long outages); "" or "off" = off, "auto" = a private per-user
    # directory (reporter_proc.spooldir). The agent's config defaults to "auto"; this value
    # stays off so code that builds settings by hand (tests, benchmarks) opts in.
    spool_dir: str = ""
    spool_max_bytes: int = 1024 * 1024 * 1024
    spool_segment_bytes: int = 4 * 1024 * 1024  # one spool file is sealed at this size
    # Reporter process lifecycle
    supervise: bool = True  # a tiny supervisor restarts a reporter that died abnormally
    restart_backoff_base_s: float = 0.5
    restart_backoff_max_s: float = 30.0
    restart_stable_s: float = 60.0  # a reporter that ran this long resets the backoff
    status_interval_s: float = 1.0  # heartbeat + status document period (must stay <= 1 s)
    status_max_instances: int = 16  # instances listed in the status document (8 KiB cap)
    # protocol="memory" (tests, benchmarks): JSON lines of every accepted call go here
    memory_path: str = ""
    memory_fail_first: int = 0  # the memory sender fails its first N calls (retry tests)
