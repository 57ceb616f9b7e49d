"""TLS to gRPC/HTTP backends: custom CA, mutual TLS, server-name override, and refusals.

The backend is the in-test collector (tests/collector.py) served over TLS with a test CA
made by ``openssl`` (tests/tls_support.py). Every refusal is checked twice: the sender
fails (or is not built at all), and the collector saw no call, so nothing went in clear.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from reporter_proc.senders import create_sender
from reporter_proc.senders.base import Sender, SendError
from reporter_proc.senders.tls import SecurityConfigError
from reporter_proc.settings import ReporterSettings
from swmp import config as swmp_config
from tests.collector import Collector
from tests.test_senders import SEGMENT, run
from tests.tls_support import SERVER_NAME, Pki, make_pki, start_reporter

TOKEN = "tls-test-token-8d1f"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _server_creds(pki: Pki, cert: str = "server", require_client: bool = False) -> grpc.ServerCredentials:
    key_pem = (pki.dir / f"{cert}.key").read_bytes()
    cert_pem = (pki.dir / f"{cert}.pem").read_bytes()
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)],
        root_certificates=pki.ca.read_bytes() if require_client else None,
        require_client_auth=require_client,
    )


def _server_ssl(pki: Pki, cert: str = "server", require_client: bool = False) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.dir / f"{cert}.pem", pki.dir / f"{cert}.key")
    if require_client:
        context.load_verify_locations(pki.ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


@pytest.fixture
def tls_collector(pki: Pki, request: pytest.FixtureRequest) -> Iterator[Collector]:
    """A collector on TLS; ``request.param`` = (certificate name, require a client certificate)."""
    cert, require_client = getattr(request, "param", ("server", False))
    collector = Collector(
        grpc_credentials=_server_creds(pki, cert, require_client),
        http_ssl=_server_ssl(pki, cert, require_client),
    )
    collector.start()
    try:
        yield collector
    finally:
        collector.stop()


def _settings(protocol: str, backend: str, **over: Any) -> ReporterSettings:
    base = ReporterSettings(protocol=protocol, backends=(backend,), send_timeout_s=5.0, authentication=TOKEN)
    return dataclasses.replace(base, **over)


def _address(collector: Collector, protocol: str) -> str:
    return collector.grpc_address if protocol == "grpc" else collector.http_address


async def _send_one(sender: Sender) -> None:
    await sender.start()
    try:
        await sender.send_segments([SEGMENT])
    finally:
        await sender.close()


PROTOCOLS = ["grpc", "http"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_custom_ca_delivers_with_the_token(tls_collector: Collector, pki: Pki, protocol: str) -> None:
    settings = _settings(protocol, _address(tls_collector, protocol), tls_ca_file=str(pki.ca))
    run(_send_one(create_sender(settings)))
    assert len(tls_collector.segments) == 1
    assert tls_collector.auth == [TOKEN]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("tls_collector", [("server", True)], indirect=True)
def test_mutual_tls(tls_collector: Collector, pki: Pki, protocol: str) -> None:
    address = _address(tls_collector, protocol)
    with_cert = _settings(
        protocol,
        address,
        tls_ca_file=str(pki.ca),
        tls_cert_file=str(pki.client),
        tls_key_file=str(pki.client_key),
    )
    run(_send_one(create_sender(with_cert)))
    assert len(tls_collector.segments) == 1

    # Without a client certificate the server ends the handshake: an error, and still TLS.
    without = _settings(protocol, address, tls_ca_file=str(pki.ca))
    with pytest.raises(SendError):
        run(_send_one(create_sender(without)))
    assert len(tls_collector.segments) == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("tls_collector", [("named", False)], indirect=True)
def test_server_name_override(tls_collector: Collector, pki: Pki, protocol: str) -> None:
    # The certificate names only collector.test; the address is 127.0.0.1.
    address = _address(tls_collector, protocol)
    with pytest.raises(SendError):
        run(_send_one(create_sender(_settings(protocol, address, tls_ca_file=str(pki.ca)))))
    assert tls_collector.segments == []
    named = _settings(protocol, address, tls_ca_file=str(pki.ca), tls_server_name=SERVER_NAME)
    run(_send_one(create_sender(named)))
    assert len(tls_collector.segments) == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wrong_ca_fails_and_is_not_downgraded(tls_collector: Collector, pki: Pki, protocol: str) -> None:
    address = _address(tls_collector, protocol)
    for trust in ({"tls_ca_file": str(pki.otherca)}, {"force_tls": True}):  # another CA; the system's
        with pytest.raises(SendError):
            run(_send_one(create_sender(_settings(protocol, address, **trust))))
    assert tls_collector.segments == [] and tls_collector.auth == []


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"force_tls": True, "backends": ("http://127.0.0.1:12800",)}, "says http:// but TLS is required"),
        ({"tls_ca_file": "CA", "backends": ("http://127.0.0.1:12800",)}, "says http:// but TLS is required"),
        ({"tls_ca_file": "/nonexistent/ca.pem"}, "cannot read the CA file"),
        ({"tls_ca_file": "KEY"}, "holds no usable CA certificate"),
        (
            {"tls_ca_file": "CA", "tls_cert_file": "CLIENT"},
            "SW_AGENT_TLS_CERT_FILE is set but SW_AGENT_TLS_KEY_FILE",
        ),
        ({"tls_key_file": "KEY"}, "SW_AGENT_TLS_KEY_FILE is set but SW_AGENT_TLS_CERT_FILE"),
        ({"tls_cert_file": "CLIENT", "tls_key_file": "OTHERKEY"}, "do not load as a certificate and its key"),
    ],
)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_tls_settings_refuse_to_build_the_sender(
    pki: Pki, protocol: str, over: dict[str, Any], message: str
) -> None:
    files = {"CA": pki.ca, "KEY": pki.client_key, "CLIENT": pki.client, "OTHERKEY": pki.server_key}
    over = {k: (str(files[v]) if isinstance(v, str) and v in files else v) for k, v in over.items()}
    settings = dataclasses.replace(_settings(protocol, "127.0.0.1:1"), **over)
    with pytest.raises(SecurityConfigError, match=message):
        create_sender(settings)


def test_plain_backend_without_tls_settings_stays_plain() -> None:
    # No TLS asked for: an http:// backend is what the operator wrote, not an error.
    sender = create_sender(_settings("http", "http://127.0.0.1:1"))
    assert sender.address == "http://127.0.0.1:1"


def test_config_passes_tls_settings_to_the_reporter(pki: Pki) -> None:
    config = swmp_config.load(
        {
            "SW_AGENT_TLS_CA_FILE": str(pki.ca),
            "SW_AGENT_TLS_CERT_FILE": str(pki.client),
            "SW_AGENT_TLS_KEY_FILE": str(pki.client_key),
            "SW_AGENT_TLS_SERVER_NAME": SERVER_NAME,
            "SW_AGENT_FORCE_TLS": "true",
        }
    )
    s = config.to_reporter_settings()
    assert (s.tls_ca_file, s.tls_cert_file, s.tls_key_file) == (
        str(pki.ca),
        str(pki.client),
        str(pki.client_key),
    )
    assert s.tls_server_name == SERVER_NAME and s.force_tls


def test_refusal_reaches_the_log_without_the_token(
    pki: Pki, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """The reporter's own start path: a SecurityConfigError is logged and exits 'configuration'."""
    from ipc import Arena
    from reporter_proc.exits import EXIT_CONFIG
    from reporter_proc.loop import Reporter
    from reporter_proc.process import _run_loop

    settings = _settings("grpc", "http://127.0.0.1:1", force_tls=True)
    arena = Arena.create(str(tmp_path / "arena"), slots=1, ring_capacity=64 * 1024, meta=b"{}")
    try:
        with caplog.at_level(logging.INFO, logger="swmp"):
            code = _run_loop(Reporter(arena, settings, mode="thread").run())
    finally:
        arena.unlink()
        arena.close()
    assert code == EXIT_CONFIG
    assert "says http:// but TLS is required" in caplog.text
    assert TOKEN not in caplog.text


# -- Kafka security settings (the broker tests are in test_kafka_tls.py) -------------------------
def _kafka(**extra: str) -> ReporterSettings:
    return ReporterSettings(protocol="kafka", kafka_extra=extra)


def test_kafka_security_from_the_peer_names(pki: Pki) -> None:
    from reporter_proc.senders.kafka_sender import kafka_security, producer_kwargs

    settings = _kafka(
        security_protocol="sasl_ssl",
        ssl_cafile=str(pki.ca),
        ssl_check_hostname="False",
        sasl_mechanism="scram-sha-512",
        sasl_plain_username="agent",
        sasl_plain_password="12345",  # numeric: must stay a string
        linger_ms="5",
    )
    sec = kafka_security(settings)
    assert sec["security_protocol"] == "SASL_SSL" and sec["sasl_mechanism"] == "SCRAM-SHA-512"
    assert sec["sasl_plain_password"] == "12345"
    context = sec["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and not context.check_hostname
    assert producer_kwargs(settings) == {"linger_ms": 5}  # security keys are not passed twice
    assert kafka_security(_kafka()) == {"security_protocol": "PLAINTEXT"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"security_protocol": "TLS"}, "is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
        ({"ssl_cafile": "CA"}, "ssl_cafile set but security_protocol is PLAINTEXT"),
        ({"security_protocol": "SASL_PLAINTEXT", "ssl_cafile": "CA", "sasl_plain_username": "u",
          "sasl_plain_password": "p"}, "ssl_cafile set but security_protocol is SASL_PLAINTEXT"),
        ({"sasl_plain_username": "u", "sasl_plain_password": "p"}, "set but security_protocol is PLAINTEXT"),
        ({"security_protocol": "SASL_SSL", "sasl_plain_username": "u"}, "needs sasl_plain_username and"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "MD5", "sasl_plain_username": "u",
          "sasl_plain_password": "p"}, "sasl_mechanism 'MD5' is not one of"),
        ({"security_protocol": "SSL", "ssl_capath": "/etc/ssl"}, "unsupported Kafka security setting"),
        ({"security_protocol": "SSL", "ssl_cafile": "/nonexistent"}, "cannot read the CA file (ssl_cafile)"),
        ({"security_protocol": "SSL", "ssl_certfile": "CLIENT"}, "ssl_certfile is set but ssl_keyfile"),
        ({"security_protocol": "SSL", "ssl_check_hostname": "maybe"}, "is not true or false"),
    ],
)  # fmt: skip
def test_kafka_security_refuses_what_it_cannot_honour(pki: Pki, extra: dict[str, str], message: str) -> None:
    from reporter_proc.senders.kafka_sender import KafkaSender

    files = {"CA": str(pki.ca), "CLIENT": str(pki.client)}
    extra = {k: files.get(v, v) for k, v in extra.items()}
    with pytest.raises(SecurityConfigError, match=re.escape(message)):
        KafkaSender(_kafka(**extra))
    with pytest.raises(SecurityConfigError):
        create_sender(_kafka(**extra))


def test_kafka_fallback_keeps_security_and_masks_secrets(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    """A rejected tuning option drops that option, never the SASL/SSL arguments; nothing secret is logged."""
    from reporter_proc.senders.kafka_sender import KafkaSender

    secret = "pw-0b9c2e"
    sender = KafkaSender(
        _kafka(
            acks="2",  # refused by aiokafka: the fallback kicks in
            security_protocol="SASL_SSL",
            ssl_cafile=str(pki.ca),
            sasl_plain_username="agent",
            sasl_plain_password=secret,
        )
    )

    async def body() -> Any:
        producer = sender._new_producer()
        try:
            return producer.client._security_protocol, producer.client._sasl_plain_password
        finally:
            await producer.stop()

    with caplog.at_level(logging.DEBUG):
        protocol, password = run(body())
    assert (protocol, password) == ("SASL_SSL", secret)
    assert "Kafka producer rejected" in caplog.text
    assert secret not in caplog.text


# -- the token under a real Gunicorn -------------------------------------------------------------
APP = """
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]
"""


@pytest.mark.servers
def test_token_stays_out_of_arguments_logs_and_status(pki: Pki, tmp_path: Path) -> None:
    """Gunicorn under the agent, gRPC over TLS with a token: the token reaches the collector
    and nowhere else: not in any process's arguments, the output (agent at DEBUG), or ``swmp status``."""
    import ipc
    from tests import test_cli_support as support
    from tests.agent_procs import application_processes, wait_agent_pids
    from tests.collector import free_port

    (tmp_path / "app.py").write_text(APP)
    shm = tmp_path / "shm"
    shm.mkdir()
    port = free_port()
    secret = f"tok-{os.urandom(6).hex()}"
    collector = Collector(grpc_credentials=_server_creds(pki), enable_http=False).start()
    env = support.env(
        SW_AGENT_ARENA_DIR=str(shm),
        SW_AGENT_NAME="tls-gunicorn",
        SW_AGENT_COLLECTOR_BACKEND_SERVICES=collector.grpc_address,
        SW_AGENT_AUTHENTICATION=secret,
        SW_AGENT_TLS_CA_FILE=str(pki.ca),
        SW_AGENT_LOGGING_LEVEL="DEBUG",
    )
    log_file = tmp_path / "gunicorn.log"
    with open(log_file, "wb") as log_out:
        server = subprocess.Popen(
            [sys.executable, "-m", "swmp.cli", "run", "--", "gunicorn", "-w", "2", "-b", f"127.0.0.1:{port}",
             "--control-socket", str(tmp_path / "gunicorn.ctl"), "app:app"],
            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=log_out, stderr=log_out,
        )  # fmt: skip
    family: list[int] = []
    try:
        path = support.wait_for(lambda: next(iter(ipc.discover(str(shm))), None), 60, "the agent's arena")
        with ipc.Arena.open(path) as arena:
            support.wait_for(lambda: len(arena.live_slots()) == 2, 60, "two workers")
            support.wait_for(arena.reporter_pid, 60, "the reporter")

            # Both workers announced through the reporter: every call so far went over TLS.
            try:
                support.wait_for(
                    lambda: len(collector.properties) >= 2, 60, "both workers at the TLS collector"
                )
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}; calls {dict(collector.calls)}; log:\n{log_file.read_text()[-4000:]}"
                ) from None
            agent = wait_agent_pids(path, 60)  # the supervisor: once the reporter published
            family = [p.pid for p in application_processes(server.pid, path)]
            roles = {*agent.pids(), *arena.live_slots().values()}
            assert roles <= set(family)
            assert len(family) >= 5  # master, 2 workers, supervisor, reporter
            for pid in family:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                assert secret.encode() not in cmdline, (pid, cmdline)
            status = support.cli("status", "--dir", str(shm), "--interval", "0")
            status_json = support.cli("status", "--dir", str(shm), "--interval", "0", "--json")
            assert status.returncode == 0, status.stdout + status.stderr
            everything = status.stdout + status.stderr + status_json.stdout + status_json.stderr
            assert "tls-gunicorn" in everything and secret not in everything
        assert set(collector.auth) == {secret}
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)
        for pid in family:  # anything left of the family goes too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        collector.stop()
    assert secret not in log_file.read_text(errors="replace")  # gunicorn's and the agent's output


def test_reporter_command_line_refuses_secrets(tmp_path: Path) -> None:
    """``python -m reporter_proc --settings JSON`` would show a token to every local user (ps)."""
    from reporter_proc.process import settings_to_json
    from tests import test_cli_support as support

    for settings in (
        ReporterSettings(authentication=TOKEN),
        ReporterSettings(protocol="kafka", kafka_extra={"SASL.PLAIN.PASSWORD": TOKEN}),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "reporter_proc", "--arena", str(tmp_path / "none"),
             "--settings", settings_to_json(settings), "--no-supervise"],
            cwd=support.REPO, env=support.env(), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert proc.returncode == 78, proc.stderr
        assert "--settings holds a secret" in proc.stderr and TOKEN not in proc.stderr


def test_kafka_ciphers_and_crl_are_applied_or_refused(pki: Pki) -> None:
    from reporter_proc.senders.kafka_sender import kafka_security

    base = {"security_protocol": "SSL", "ssl_cafile": str(pki.ca)}
    context = kafka_security(_kafka(**base, ssl_ciphers="ECDHE-ECDSA-AES128-GCM-SHA256"))["ssl_context"]
    assert {c["name"] for c in context.get_ciphers() if c["protocol"] == "TLSv1.2"} == {
        "ECDHE-ECDSA-AES128-GCM-SHA256"
    }
    with pytest.raises(SecurityConfigError, match="selects no cipher"):
        kafka_security(_kafka(**base, ssl_ciphers="NO-SUCH-CIPHER"))
    with pytest.raises(SecurityConfigError, match="cannot read the CRL file"):
        kafka_security(_kafka(**base, ssl_crlfile="/nonexistent/crl.pem"))


def test_real_reporter_with_a_wrong_ca_counts_and_logs_once(pki: Pki, tmp_path: Path) -> None:
    """The reporter process against a TLS collector it must not trust: every batch fails and is
    counted in the status, the failure is logged once, and the collector receives nothing."""
    import orjson

    from tests import test_cli_support as support

    collector = Collector(grpc_credentials=_server_creds(pki), enable_http=False).start()
    settings = dataclasses.replace(
        _settings("grpc", collector.grpc_address, tls_ca_file=str(pki.otherca)),
        flush_interval_s=0.02,
        status_interval_s=0.05,
        keepalive_interval_s=0.2,
        retry_max_attempts=2,
        retry_backoff_base_s=0.01,
        retry_backoff_max_s=0.05,
        send_timeout_s=2.0,
    )
    shm = tmp_path / "shm"
    shm.mkdir()
    arena = support.make_arena(shm, meta={"service": "wrong-ca"})
    procs = support.Procs(tmp_path)
    reporter, stderr = start_reporter(arena.path, settings, tmp_path, "wrong-ca")

    def status() -> dict[str, Any]:
        raw = arena.status.snapshot().document
        return orjson.loads(raw) if raw else {}

    try:
        support.wait_for(lambda: arena.reporter_pid() == reporter.pid, 30, "the reporter")
        procs.writer(arena, count=5, rate=20, valid=True)
        # No spool here and memory has room: the records are kept and retried, never sent.
        support.wait_for(
            lambda: status().get("backend", {}).get("consecutive_failures", 0) >= 6, 60, "failed sends"
        )
        backend = status()["backend"]
        assert backend["state"] != "ok" and backend["consecutive_failures"] >= 2, backend
    finally:
        reporter.send_signal(signal.SIGTERM)
        reporter.wait(timeout=60)
        procs.cleanup()
        collector.stop()
        arena.unlink()
        arena.close()
    text = stderr.read_text(errors="replace")
    ours = [line for line in text.splitlines() if " swmp.reporter" in line and "backend unavailable" in line]
    # Once while the records wait in memory, and at most once more when the stop drops them.
    assert len([line for line in ours if "kept in memory" in line]) == 1, text
    assert len([line for line in ours if "dropped" in line]) <= 1, text
    assert collector.calls == {} and collector.auth == []
    assert TOKEN not in text
