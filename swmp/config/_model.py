"""The agent's configuration as one object, composed of its sections, and the list of its
settings as data (for the loader and the doc generator).

Each section is a frozen dataclass in its own module (``_core``, ``_tracing``, ``_plugins``,
``_reporter``); :class:`Config` inherits them all. Dataclasses collect inherited fields from
the last base to the first, so the bases are listed in reverse: the fields, and therefore
``docs/configuration.md``, keep the order core, kafka, tracing, plugins, logs, meters,
profiling, reporter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reporter_proc.settings import ReporterSettings, kafka_key
from swmp.config._core import CoreSettings, KafkaSettings
from swmp.config._plugins import PluginSettings
from swmp.config._reporter import ReporterProcessSettings
from swmp.config._tracing import LogSettings, MeterSettings, ProfileSettings, TraceSettings


def split_list(raw: str) -> tuple[str, ...]:
    """A comma-separated value as a tuple of its non-empty, stripped items."""
    return tuple(p.strip() for p in raw.split(",") if p.strip())


@dataclass(frozen=True)
class Config(
    ReporterProcessSettings,
    ProfileSettings,
    MeterSettings,
    LogSettings,
    PluginSettings,
    TraceSettings,
    KafkaSettings,
    CoreSettings,
):
    """The agent's configuration. Build it with :func:`swmp.config.load` (environment + keywords)."""

    @property
    def service_name(self) -> str:
        """The reported service name: ``name|namespace`` when a namespace is set (as the peer agent)."""
        return f"{self.agent_name}|{self.agent_namespace}" if self.agent_namespace else self.agent_name

    @property
    def backends(self) -> tuple[str, ...]:
        return split_list(self.agent_collector_backend_services)

    def kafka_topic(self, topic: str) -> str:
        return f"{self.kafka_namespace}-{topic}" if self.kafka_namespace else topic

    def to_reporter_settings(self) -> ReporterSettings:
        # compression_type is the producer's own argument, not an extra one; it is found with
        # the sender's key normalisation, so COMPRESSION_TYPE or compression.type count too.
        options = self.kafka_reporter_config
        extra = {k: v for k, v in options.items() if kafka_key(k) != "compression_type"}
        codecs = [v for k, v in options.items() if kafka_key(k) == "compression_type"]
        return ReporterSettings(
            service=self.service_name,
            namespace=self.agent_namespace,
            protocol=self.agent_protocol,
            backends=self.backends,
            authentication=self.agent_authentication,
            force_tls=self.agent_force_tls,
            tls_ca_file=self.agent_tls_ca_file,
            tls_cert_file=self.agent_tls_cert_file,
            tls_key_file=self.agent_tls_key_file,
            tls_server_name=self.agent_tls_server_name,
            kafka_bootstrap_servers=split_list(self.kafka_bootstrap_servers),
            kafka_namespace=self.kafka_namespace,
            kafka_topic_segment=self.kafka_topic_segment,
            kafka_topic_log=self.kafka_topic_log,
            kafka_topic_meter=self.kafka_topic_meter,
            kafka_topic_management=self.kafka_topic_management,
            # aiokafka knows the codecs in lower case only (gzip, snappy, lz4, zstd).
            kafka_compression=codecs[-1].strip().lower() if codecs else "",
            kafka_extra=extra,
            batch_max_records=self.agent_reporter_batch_size,
            batch_max_bytes=self.agent_reporter_batch_max_bytes,
            flush_interval_s=self.agent_reporter_flush_interval,
            keepalive_interval_s=self.agent_collector_heartbeat_period,
            properties_every_n_keepalives=self.agent_collector_properties_report_period_factor,
            send_timeout_s=self.agent_reporter_send_timeout,
            max_pending_bytes=self.agent_reporter_max_pending_bytes,
            shutdown_deadline_s=self.agent_reporter_shutdown_timeout,
            # The HTTP receiver has no meter or profiling endpoints; Kafka has no profiling.
            profile_enabled=self.agent_profile_active and self.agent_protocol not in ("http", "kafka"),
            profile_task_interval_s=self.agent_collector_get_profile_task_interval,
            meter_enabled=self.agent_meter_reporter_active and self.agent_protocol != "http",
            log_enabled=self.agent_log_reporter_active,
            spool_dir=self.agent_spool_dir,
            spool_max_bytes=self.agent_spool_max_bytes,
        )


@dataclass(frozen=True)
class Setting:
    """One declared setting, as the loader and the doc generator see it."""

    name: str
    env: str
    type_name: str
    default: Any
    doc: str
    section: str
    aliases: tuple[str, ...]
    prefix: str
    check: Callable[[Any], str | None] | None


def _type_name(f: dataclasses.Field[Any]) -> str:
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return {"tuple[str, ...]": "list", "dict[str, str]": "map"}.get(t, t)


def settings() -> tuple[Setting, ...]:
    """Every declared setting, in declaration order."""
    out = []
    for f in dataclasses.fields(Config):
        m = f.metadata
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        out.append(
            Setting(
                name=f.name,
                env=m["env"],
                type_name=_type_name(f),
                default=default,
                doc=m["doc"],
                section=m["section"],
                aliases=m["aliases"],
                prefix=m["prefix"],
                check=m["check"],
            )
        )
    return tuple(out)


def env_to_kwarg(env: str) -> str:
    """``SW_AGENT_NAME`` -> ``agent_name``: the documented mapping to keyword arguments."""
    return env[3:].lower() if env.startswith("SW_") else env.lower()
