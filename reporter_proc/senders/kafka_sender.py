"""Kafka transport (``aiokafka``): the OAP's Kafka fetcher reads the same protobuf messages.

Topics and keys are the ones the OAP expects (protocol notes): segments keyed by segment id,
``register-<instance>`` for instance properties, ``<instance>`` for pings and meters (one
``MeterDataCollection`` per report period), logs by their segment id (none when the log has
no trace). With a namespace every topic is ``<namespace>-<topic>``. There is no profiling
over Kafka.

The producer is created in :meth:`KafkaSender.start`. A broker that is down at start-up is
not an error: the producer is (re)started lazily by the next send, which raises
:class:`SendError` until the broker answers, so the loop retries as for any outage.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors

from reporter_proc import encode
from reporter_proc.records import LOG_SEGMENT_ID, METER_INSTANCE, SEG_SEGMENT_ID
from reporter_proc.senders._common import encode_all, first_line
from reporter_proc.senders.base import FatalSendError, Record, Sender, SendError, TooLargeError
from reporter_proc.senders.tls import (
    KAFKA_SECRET_KEYS,
    MASK,
    SecurityConfigError,
    client_context,
)
from reporter_proc.settings import ReporterSettings, kafka_key
from reporter_proc.timeouts import limited

log = logging.getLogger("swmp.reporter.kafka")


# Kafka errors that a retry cannot fix.
_FATAL = (
    kafka_errors.MessageSizeTooLargeError,
    kafka_errors.TopicAuthorizationFailedError,
    kafka_errors.ClusterAuthorizationFailedError,
    kafka_errors.InvalidTopicError,
    kafka_errors.UnsupportedVersionError,
)

# Connection failures that are about security, not reachability.
_SECURITY_ERRORS = (
    ssl.SSLError,
    kafka_errors.AuthenticationFailedError,
    kafka_errors.SaslAuthenticationFailed,
    kafka_errors.UnsupportedSaslMechanismError,
    kafka_errors.IllegalSaslStateError,
)

# Producer arguments the sender owns; SW_KAFKA_REPORTER_CONFIG_* cannot override them.
# The security ones are built by kafka_security() from the peer agent's kafka-python names.
_RESERVED = frozenset(
    {
        "self",
        "loop",
        "bootstrap_servers",
        "key_serializer",
        "value_serializer",
        "compression_type",
        "ssl_context",
        "sasl_oauth_token_provider",
    }
)

_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI")
# kafka-python's TLS options (what the peer agent passes through); aiokafka wants one SSLContext.
_SSL_KEYS = frozenset(
    {
        "ssl_cafile",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_password",
        "ssl_crlfile",
        "ssl_ciphers",
        "ssl_check_hostname",
    }
)
_SASL_KEYS = frozenset(
    {
        "sasl_mechanism",
        "sasl_plain_username",
        "sasl_plain_password",
        "sasl_kerberos_service_name",
        "sasl_kerberos_domain_name",
    }
)
SECRET_KEYS = KAFKA_SECRET_KEYS


def _convert(value: str) -> Any:
    """Environment strings to the types AIOKafkaProducer expects ("1" -> 1, "true" -> True)."""
    low = value.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _normalized(extra: dict[str, Any]) -> dict[str, Any]:
    """Keys matched case-insensitively, Java-style dots or dashes read as underscores."""
    return {kafka_key(raw): value for raw, value in extra.items()}


def masked(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A copy fit for a log line: secrets replaced, the SSL context named only."""
    return {
        k: (MASK if k in SECRET_KEYS and v else "<ssl context>" if k == "ssl_context" else v)
        for k, v in kwargs.items()
    }


def producer_kwargs(settings: ReporterSettings) -> dict[str, Any]:
    """AIOKafkaProducer keyword arguments from settings.kafka_extra (SW_KAFKA_REPORTER_CONFIG_*).

    Security options are taken by :func:`kafka_security` (which raises on a bad set);
    other unknown keys are logged and ignored rather than crashing the reporter.
    """
    accepted = set(inspect.signature(AIOKafkaProducer.__init__).parameters) - _RESERVED
    out: dict[str, Any] = {}
    for key, raw_value in _normalized(settings.kafka_extra).items():
        if key == "security_protocol" or key in _SSL_KEYS or key in _SASL_KEYS:
            continue
        if key in accepted:
            out[key] = _convert(raw_value) if isinstance(raw_value, str) else raw_value
        else:
            log.warning("ignoring Kafka producer setting %r: AIOKafkaProducer has no such option", key)
    return out


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    low = str(value).strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise SecurityConfigError(f"SW_KAFKA_REPORTER_CONFIG_{key.upper()}={value!r} is not true or false")


def kafka_security(settings: ReporterSettings) -> dict[str, Any]:
    """The producer's security arguments from the peer agent's kafka-python names.

    ``security_protocol`` PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL; ``ssl_cafile``,
    ``ssl_certfile``, ``ssl_keyfile``, ``ssl_password``, ``ssl_crlfile``, ``ssl_ciphers`` and
    ``ssl_check_hostname`` become one verifying SSLContext; ``sasl_mechanism`` (PLAIN,
    SCRAM-SHA-256/512, GSSAPI) with ``sasl_plain_username``/``sasl_plain_password``.
    Anything that would leave a setting unused (TLS files with PLAINTEXT, credentials without
    SASL) or cannot work raises :class:`SecurityConfigError`: never a quiet PLAINTEXT.
    """
    extra = _normalized(settings.kafka_extra)
    unknown = sorted(k for k in extra if k.startswith(("ssl_", "sasl_")) and k not in _SSL_KEYS | _SASL_KEYS)
    if unknown:
        raise SecurityConfigError(
            f"unsupported Kafka security setting(s) {', '.join(unknown)} "
            f"(supported: security_protocol, {', '.join(sorted(_SSL_KEYS | _SASL_KEYS))})"
        )
    protocol = str(extra.get("security_protocol", "PLAINTEXT")).strip().upper()
    if protocol not in _PROTOCOLS:
        raise SecurityConfigError(
            f"Kafka security_protocol {protocol!r} is not one of {', '.join(_PROTOCOLS)}"
        )
    ssl_given = sorted(k for k in extra if k in _SSL_KEYS)
    sasl_given = sorted(k for k in extra if k in _SASL_KEYS)
    if ssl_given and "SSL" not in protocol:
        raise SecurityConfigError(
            f"Kafka {', '.join(ssl_given)} set but security_protocol is {protocol}: "
            "set SW_KAFKA_REPORTER_CONFIG_SECURITY_PROTOCOL=SSL or SASL_SSL"
        )
    if sasl_given and not protocol.startswith("SASL_"):
        raise SecurityConfigError(
            f"Kafka {', '.join(sasl_given)} set but security_protocol is {protocol}: "
            "set SW_KAFKA_REPORTER_CONFIG_SECURITY_PROTOCOL=SASL_SSL (or SASL_PLAINTEXT)"
        )
    out: dict[str, Any] = {"security_protocol": protocol}
    if "SSL" in protocol:
        out["ssl_context"] = client_context(
            ca_file=str(extra.get("ssl_cafile", "")),
            cert_file=str(extra.get("ssl_certfile", "")),
            key_file=str(extra.get("ssl_keyfile", "")),
            key_password=str(extra.get("ssl_password", "")),
            crl_file=str(extra.get("ssl_crlfile", "")),
            ciphers=str(extra.get("ssl_ciphers", "")),
            check_hostname=_flag("ssl_check_hostname", extra.get("ssl_check_hostname", True)),
            names=("ssl_cafile", "ssl_certfile", "ssl_keyfile"),
        )
    if protocol.startswith("SASL_"):
        mechanism = str(extra.get("sasl_mechanism", "PLAIN")).strip().upper()
        if mechanism not in _MECHANISMS:
            raise SecurityConfigError(
                f"Kafka sasl_mechanism {mechanism!r} is not one of {', '.join(_MECHANISMS)}"
            )
        out["sasl_mechanism"] = mechanism
        if mechanism != "GSSAPI":
            user, password = extra.get("sasl_plain_username"), extra.get("sasl_plain_password")
            if not user or not password:
                raise SecurityConfigError(
                    f"Kafka SASL {mechanism} needs sasl_plain_username and sasl_plain_password"
                )
            # Strings as given: a numeric password must not become an int.
            out["sasl_plain_username"], out["sasl_plain_password"] = str(user), str(password)
        for key in ("sasl_kerberos_service_name", "sasl_kerberos_domain_name"):
            if extra.get(key):
                out[key] = str(extra[key])
    return out


def topic_names(settings: ReporterSettings) -> dict[str, str]:
    """kind -> topic, with the ``<namespace>-`` prefix when a namespace is set."""
    # SW_KAFKA_NAMESPACE only: the agent namespace (SW_AGENT_NAMESPACE) names services, not topics.
    namespace = settings.kafka_namespace
    prefix = f"{namespace}-" if namespace else ""
    return {
        "segment": prefix + settings.kafka_topic_segment,
        "log": prefix + settings.kafka_topic_log,
        "meter": prefix + settings.kafka_topic_meter,
        "management": prefix + settings.kafka_topic_management,
    }


class KafkaSender(Sender):
    name = "kafka"
    supports = frozenset({"segment", "log", "meter", "management"})

    def __init__(self, settings: ReporterSettings) -> None:
        servers = [s.strip() for s in settings.kafka_bootstrap_servers if s.strip()]
        if not servers:
            raise ValueError("no Kafka bootstrap server configured")
        self._servers = servers
        self.address = ",".join(servers)
        self.topics = topic_names(settings)
        self._timeout = settings.send_timeout_s
        self._kwargs = producer_kwargs(settings)
        # Built once, here: a bad security setting stops the sender before it ever connects.
        self._security = kafka_security(settings)
        self.security_protocol: str = self._security["security_protocol"]
        self._refusal_logged: set[str] = set()
        # "none" is Kafka's own name for no codec (the Java producer's default); aiokafka
        # wants None and refuses the string, which logged an error before falling back.
        codec = settings.kafka_compression.strip().lower()
        self._compression = codec if codec not in ("", "none") else None
        self._producer: AIOKafkaProducer | None = None
        self._starting: asyncio.Lock | None = None

    def _new_producer(self) -> AIOKafkaProducer:
        # A tuning option the producer rejects (a codec whose library is missing, a bad
        # "acks") must not stop the reporter: fall back step by step, and say so once. The
        # security arguments are in every attempt: dropping them would be a downgrade.
        attempts = [(self._compression, self._kwargs)]
        if self._compression:
            attempts.append((None, self._kwargs))
        if self._kwargs:
            attempts.append((None, {}))
        last: Exception | None = None
        for compression, extra in attempts:
            kwargs = {"request_timeout_ms": max(1000, int(self._timeout * 1000)), **extra, **self._security}
            try:
                producer = AIOKafkaProducer(
                    bootstrap_servers=self._servers, compression_type=compression, **kwargs
                )
            except Exception as exc:
                log.error(
                    "Kafka producer rejected compression=%r settings=%r: %s",
                    compression,
                    masked(extra),
                    _scrub(exc, self._security),
                )
                last = exc
                continue
            self._compression, self._kwargs = compression, extra
            # The agent's aiokafka instrumentation leaves producers with this mark alone:
            # in thread mode this producer runs inside the traced application.
            producer._swmp_internal = True
            return producer
        raise SendError(f"cannot create a Kafka producer: {_scrub(last, self._security)}")

    async def start(self) -> None:
        self._starting = asyncio.Lock()
        try:
            await self._ensure_producer()
        except SendError as exc:
            log.warning("Kafka not reachable yet (%s); will retry on the next send", exc)

    async def _ensure_producer(self) -> AIOKafkaProducer:
        if self._producer is not None:
            return self._producer
        if self._starting is None:
            raise SendError("Kafka sender not started")
        async with self._starting:
            if self._producer is None:
                producer = self._new_producer()
                try:
                    await limited(producer.start(), self._timeout)
                except asyncio.CancelledError:
                    await _stop_quietly(producer)
                    raise
                except Exception as exc:
                    await _stop_quietly(producer)
                    reason = await self._security_refusal()
                    if reason:
                        raise SendError(f"Kafka {self.address}: {reason}") from exc
                    detail = _scrub(f"{type(exc).__name__} {first_line(exc)}", self._security)
                    raise SendError(f"Kafka {self.address}: {detail}") from exc
                self._producer = producer
        return self._producer

    async def _security_refusal(self) -> str:
        """Why the broker refused us, when it was TLS or SASL ("" otherwise).

        aiokafka reports a failed bootstrap only as "Unable to bootstrap"; one direct
        connection with the same security arguments tells a wrong password or an untrusted
        certificate from a broker that is simply down. Logged at ERROR once per reason; the
        sender keeps retrying with the same settings and never tries without them.
        """
        if self.security_protocol == "PLAINTEXT":
            return ""
        from aiokafka.conn import create_conn  # noqa: PLC0415 (only on this failure path)

        host, _, port = self._servers[0].rpartition(":")
        try:
            conn = await limited(create_conn(host, int(port), **self._security), self._timeout)
        except asyncio.CancelledError:
            raise
        except _SECURITY_ERRORS as exc:
            what = "TLS handshake failed" if isinstance(exc, ssl.SSLError) else "SASL authentication failed"
            reason = _scrub(
                f"{what} ({self.security_protocol}): {type(exc).__name__} {first_line(exc)}", self._security
            )
            if reason not in self._refusal_logged:
                self._refusal_logged.add(reason)
                log.error(
                    "Kafka %s refused the connection: %s; records are kept and retried, never sent "
                    "without %s",
                    self.address,
                    reason,
                    self.security_protocol,
                )
            return reason
        except Exception:
            return ""
        conn.close()
        return ""

    async def _produce(self, topic: str, items: Sequence[tuple[bytes | None, bytes]]) -> None:
        if not items:
            return
        producer = await self._ensure_producer()
        try:
            # send() only queues (batched by the producer); the futures resolve on the broker's ack.
            futures = [await producer.send(topic, value, key=key) for key, value in items]
            await limited(asyncio.gather(*futures), self._timeout)
        except asyncio.CancelledError:
            raise
        except kafka_errors.MessageSizeTooLargeError as exc:
            raise TooLargeError(f"Kafka topic {topic}: {type(exc).__name__} {first_line(exc)}") from exc
        except _FATAL as exc:
            raise FatalSendError(f"Kafka topic {topic}: {type(exc).__name__} {first_line(exc)}") from exc
        except (kafka_errors.KafkaError, asyncio.TimeoutError, OSError) as exc:
            raise SendError(f"Kafka topic {topic}: {type(exc).__name__} {first_line(exc)}") from exc

    async def send_segments(self, records: list[Record]) -> None:
        values = encode_all(encode.segment, records)
        keys = [_key(rec[SEG_SEGMENT_ID]) for rec in records]
        await self._produce(self.topics["segment"], list(zip(keys, values, strict=True)))

    async def send_logs(self, records: list[Record]) -> None:
        values = encode_all(encode.log, records)
        keys = [_key(rec[LOG_SEGMENT_ID]) for rec in records]
        await self._produce(self.topics["log"], list(zip(keys, values, strict=True)))

    async def send_meters(self, records: list[Record]) -> None:
        values = encode_all(encode.meter_collection, records)
        keys = [_key(rec[METER_INSTANCE]) for rec in records]
        await self._produce(self.topics["meter"], list(zip(keys, values, strict=True)))

    async def report_properties(
        self, service: str, instance: str, properties: list[tuple[str, str]], layer: str = ""
    ) -> None:
        value = encode.instance_properties(service, instance, properties, layer)
        await self._produce(self.topics["management"], [(f"register-{instance}".encode(), value)])

    async def keep_alive(self, service: str, instance: str, layer: str = "") -> None:
        value = encode.instance_ping(service, instance, layer)
        await self._produce(self.topics["management"], [(_key(instance), value)])

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()  # flushes what is still queued


def _scrub(value: object, security: dict[str, Any]) -> str:
    """``str(value)`` with any secret of ``security`` blanked (error texts may echo them)."""
    text = str(value)
    for key in SECRET_KEYS:
        secret = security.get(key)
        if secret:
            text = text.replace(str(secret), MASK)
    return text


def _key(value: object) -> bytes | None:
    return value.encode() if isinstance(value, str) and value else None


async def _stop_quietly(producer: AIOKafkaProducer) -> None:
    try:
        await producer.stop()
    except Exception as exc:
        log.debug("stopping a producer that never started: %r", exc)
