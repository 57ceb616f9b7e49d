"""Kafka over SSL and SASL against the real broker, with the real reporter process.

The session's broker (tests/realpeers.py ``kafka_broker``) listens on PLAINTEXT, SSL,
SASL_SSL and SASL_PLAINTEXT with a certificate from a test CA. The reporter
(``python -m reporter_proc``) is configured only with the peer agent's
``SW_KAFKA_REPORTER_CONFIG_*`` names, through the agent's own config loader; its stderr is
captured to check what it says and that no secret is in it. Records are read back on the
PLAINTEXT listener.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import ipc
from reporter_proc.exits import EXIT_CONFIG
from swmp import config as swmp_config
from tests import test_cli_support as support
from tests.realpeers import KafkaBroker
from tests.tls_support import start_reporter

pytestmark = pytest.mark.e2e


@dataclasses.dataclass
class Run:
    proc: subprocess.Popen[bytes]
    stderr: Path
    namespace: str

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")


@pytest.fixture
def reporters(tmp_path: Path) -> Iterator[list[Run]]:
    runs: list[Run] = []
    yield runs
    for run in runs:
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(timeout=30)


def _start(
    tmp_path: Path, bootstrap: str, env: dict[str, str], runs: list[Run], *, count: int = 5
) -> tuple[Run, ipc.Arena, Any]:
    """An arena with ``count`` segments written, and a real reporter draining it to Kafka."""
    namespace = f"tls{uuid.uuid4().hex[:8]}"
    config = swmp_config.load(
        {
            "SW_AGENT_PROTOCOL": "kafka",
            "SW_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "SW_KAFKA_NAMESPACE": namespace,
            "SW_AGENT_REPORTER_SEND_TIMEOUT": "5",
            **env,
        }
    )
    settings = dataclasses.replace(
        config.to_reporter_settings(),
        retry_backoff_base_s=0.05,
        retry_backoff_max_s=0.2,
        status_interval_s=0.1,
    )
    shm = tmp_path / "shm"
    shm.mkdir(exist_ok=True)
    arena = support.make_arena(shm, meta={"service": "kafka-tls", "protocol": "kafka"})
    procs = support.Procs(tmp_path)
    writer, _ = procs.writer(arena, count=count, valid=True)
    # The writer stands for the application: the owner and its one worker, which _stop ends
    # before the reporter, as a master's shutdown does. (With this test process as the owner,
    # alive after the stop, the reporter waited out its owner grace at every stop: ~3.5 s.)
    proc, stderr = start_reporter(arena.path, settings, tmp_path, namespace, owner_pid=writer.pid)
    run = Run(proc, stderr, namespace)
    runs.append(run)
    return run, arena, procs


def _segment_keys(bootstrap: str, topic: str, want: int, timeout: float = 60.0) -> list[str]:
    from aiokafka import AIOKafkaConsumer

    async def consume() -> list[str]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            group_id=None,
        )
        await consumer.start()
        keys: list[str] = []
        deadline = time.monotonic() + timeout
        try:
            while len(keys) < want and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    keys.extend(r.key.decode() for r in records if r.key)
        finally:
            await consumer.stop()
        return keys

    return asyncio.run(consume())


def _records_in(bootstrap: str, topic: str) -> int:
    """How many records the broker holds in ``topic`` (0 when there is no such topic), from
    its offsets: "nothing arrived" is known at once, without waiting for what might come."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    async def count() -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            (found,) = await admin.describe_topics([topic])
        finally:
            await admin.close()
        if found["error_code"]:  # no such topic: nothing was ever written to it
            return 0
        parts = [TopicPartition(topic, p["partition"]) for p in found["partitions"]]
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
        await consumer.start()
        try:
            ends = await consumer.end_offsets(parts)
            starts = await consumer.beginning_offsets(parts)
            return sum(ends[tp] - starts[tp] for tp in parts)
        finally:
            await consumer.stop()

    return asyncio.run(count())


def _published(arena: ipc.Arena) -> dict[str, Any]:
    raw = arena.status.snapshot().document
    return orjson.loads(raw) if raw else {}


def _stop(run: Run, arena: ipc.Arena, procs: Any) -> None:
    try:
        procs.cleanup()  # the application first (it owns the arena), then its reporter
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)
            run.proc.wait(timeout=60)
    finally:
        procs.cleanup()
        arena.unlink()
        arena.close()


def _ca(broker: KafkaBroker) -> str:
    assert broker.pki is not None
    return str(broker.pki.ca)


def _sasl(broker: KafkaBroker, mechanism: str, password: str | None = None) -> dict[str, str]:
    return {
        "SW_KAFKA_REPORTER_CONFIG_sasl_mechanism": mechanism,
        "SW_KAFKA_REPORTER_CONFIG_sasl_plain_username": broker.sasl_user,
        "SW_KAFKA_REPORTER_CONFIG_sasl_plain_password": password or broker.sasl_password,
    }


def _ssl(b: KafkaBroker, client_cert: bool = True) -> tuple[str, dict[str, str]]:
    # The SSL listener requires a client certificate (mutual TLS).
    assert b.pki is not None
    env = {"SW_KAFKA_REPORTER_CONFIG_security_protocol": "SSL", "SW_KAFKA_REPORTER_CONFIG_ssl_cafile": _ca(b)}
    if client_cert:
        env["SW_KAFKA_REPORTER_CONFIG_ssl_certfile"] = str(b.pki.client)
        env["SW_KAFKA_REPORTER_CONFIG_ssl_keyfile"] = str(b.pki.client_key)
    return b.ssl_bootstrap, env


def _sasl_ssl(b: KafkaBroker, mechanism: str) -> tuple[str, dict[str, str]]:
    # Upper-case keys (as a shell user may write them) work as the peer's lower-case ones.
    return b.sasl_ssl_bootstrap, {
        "SW_KAFKA_REPORTER_CONFIG_SECURITY_PROTOCOL": "SASL_SSL",
        "SW_KAFKA_REPORTER_CONFIG_SSL_CAFILE": _ca(b),
        **_sasl(b, mechanism),
    }


CASES = {
    "ssl": _ssl,
    "sasl_ssl-scram": lambda b: _sasl_ssl(b, "SCRAM-SHA-256"),
    "sasl_ssl-plain": lambda b: _sasl_ssl(b, "PLAIN"),
    "sasl_plaintext-scram512": lambda b: (
        b.sasl_plaintext_bootstrap,
        {"SW_KAFKA_REPORTER_CONFIG_security_protocol": "SASL_PLAINTEXT", **_sasl(b, "SCRAM-SHA-512")},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_records_reach_the_topic(
    kafka_broker: KafkaBroker, tmp_path: Path, reporters: list[Run], case: str
) -> None:
    bootstrap, env = CASES[case](kafka_broker)
    run, arena, procs = _start(tmp_path, bootstrap, env, reporters)
    try:
        keys = _segment_keys(kafka_broker.bootstrap, f"{run.namespace}-skywalking-segments", 5)
        assert len(set(keys)) == 5, run.log()
        assert run.proc.poll() is None, run.log()
    finally:
        _stop(run, arena, procs)
    assert kafka_broker.sasl_password not in run.log()
    # What the refusal tests count to find nothing sees these records (on the plain listener).
    assert _records_in(kafka_broker.bootstrap, f"{run.namespace}-skywalking-segments") >= 5


def test_wrong_password_is_refused_with_a_reason_and_never_sent_plain(
    kafka_broker: KafkaBroker, tmp_path: Path, reporters: list[Run]
) -> None:
    wrong = f"wrong-{uuid.uuid4().hex[:8]}"
    env = {
        "SW_KAFKA_REPORTER_CONFIG_security_protocol": "SASL_SSL",
        "SW_KAFKA_REPORTER_CONFIG_ssl_cafile": _ca(kafka_broker),
        **_sasl(kafka_broker, "SCRAM-SHA-512", wrong),
    }
    run, arena, procs = _start(tmp_path, kafka_broker.sasl_ssl_bootstrap, env, reporters)
    try:
        support.wait_for(lambda: "SASL authentication failed" in run.log(), 60, "the refusal in the log")
        support.wait_for(
            lambda: _published(arena).get("backend", {}).get("consecutive_failures", 0) >= 2,
            60,
            "failures counted in the status",
        )
        assert run.proc.poll() is None  # it keeps the records and retries with the same settings
    finally:
        _stop(run, arena, procs)
    text = run.log()
    assert text.count("refused the connection: SASL authentication failed") == 1, text  # once
    assert wrong not in text and kafka_broker.sasl_password not in text
    # Nothing reached the topic, on any listener.
    assert _records_in(kafka_broker.bootstrap, f"{run.namespace}-skywalking-segments") == 0


def test_untrusted_certificate_is_refused(
    kafka_broker: KafkaBroker, tmp_path: Path, reporters: list[Run]
) -> None:
    # No ssl_cafile: the system's CAs do not know the test CA.
    bootstrap, env = _ssl(kafka_broker)
    del env["SW_KAFKA_REPORTER_CONFIG_ssl_cafile"]
    run, arena, procs = _start(tmp_path, bootstrap, env, reporters)
    try:
        support.wait_for(lambda: "TLS handshake failed" in run.log(), 60, "the refusal in the log")
    finally:
        _stop(run, arena, procs)
    assert "CERTIFICATE_VERIFY_FAILED" in run.log()
    assert _records_in(kafka_broker.bootstrap, f"{run.namespace}-skywalking-segments") == 0


def test_missing_client_certificate_gets_nothing_through(
    kafka_broker: KafkaBroker, tmp_path: Path, reporters: list[Run]
) -> None:
    # With TLS 1.3 the broker checks the client certificate after the client's side of the
    # handshake: the client sees the connection closed, not a TLS error, so the log says only
    # "not reachable". What matters: nothing arrives, and the sender never drops TLS.
    bootstrap, env = _ssl(kafka_broker, client_cert=False)
    run, arena, procs = _start(tmp_path, bootstrap, env, reporters)
    try:
        support.wait_for(
            lambda: _published(arena).get("backend", {}).get("consecutive_failures", 0) >= 2,
            60,
            "failures counted in the status",
        )
    finally:
        _stop(run, arena, procs)
    assert _records_in(kafka_broker.bootstrap, f"{run.namespace}-skywalking-segments") == 0


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        (
            {"SW_KAFKA_REPORTER_CONFIG_security_protocol": "SSL",
             "SW_KAFKA_REPORTER_CONFIG_ssl_cafile": "/nonexistent/ca.pem"},
            "cannot read the CA file (ssl_cafile) '/nonexistent/ca.pem'",
        ),
        (
            {"SW_KAFKA_REPORTER_CONFIG_ssl_cafile": "CA"},  # TLS file, but PLAINTEXT
            "ssl_cafile set but security_protocol is PLAINTEXT",
        ),
        (
            {"SW_KAFKA_REPORTER_CONFIG_security_protocol": "SASL_SSL",
             "SW_KAFKA_REPORTER_CONFIG_ssl_cafile": "CA",
             "SW_KAFKA_REPORTER_CONFIG_sasl_plain_password": "PASSWORD"},  # no user
            "needs sasl_plain_username and sasl_plain_password",
        ),
    ],
)  # fmt: skip
def test_incomplete_security_config_stops_the_reporter(
    kafka_broker: KafkaBroker, tmp_path: Path, reporters: list[Run], env: dict[str, str], reason: str
) -> None:
    env = {
        k: {"CA": _ca(kafka_broker), "PASSWORD": kafka_broker.sasl_password}.get(v, v) for k, v in env.items()
    }
    run, arena, procs = _start(tmp_path, kafka_broker.ssl_bootstrap, env, reporters, count=2)
    try:
        assert run.proc.wait(timeout=60) == EXIT_CONFIG, run.log()
        health = support.cli("health", "--dir", str(tmp_path / "shm"), "--liveness", "--interval", "0")
        assert health.returncode == 1 and "FAIL reporter: no live reporter process" in health.stdout, (
            health.stdout
        )
    finally:
        _stop(run, arena, procs)
    text = run.log()
    assert "cannot create the 'kafka' sender" in text and reason in text, text
    assert kafka_broker.sasl_password not in text
