"""Real backends for end-to-end tests: a Kafka broker and SkyWalking OAP servers.

The servers are the upstream Java programs, started by ``scripts/realpeers/start_*.sh`` on
127.0.0.1 with free ports picked here. Fixtures are session-scoped and lazy: a run that
selects no e2e test starts nothing. Every server started is stopped by pid at session end
(pytest finalizer, plus atexit as a second line), and the launchers get this process's pid
as REALPEERS_OWNER_PID so a watchdog stops the JVM even if pytest itself is killed.

Tests share one OAP per kind for the whole session, so each test must use its own service
names (see :func:`unique_name`) and look only at its own data. Use the fixtures by name
only: importing a fixture function into a test module defines a second fixture, and with
it a second server per session. Import the types (``KafkaBroker``, ``OapServer``) freely.

Fixtures (registered by ``tests/conftest.py``):
  ``kafka_broker``    KafkaBroker: ``.bootstrap`` "127.0.0.1:PORT", ``.pid``, ``.run_dir``;
                      secured listeners of the same broker: ``.ssl_bootstrap`` (mutual TLS:
                      a client certificate of ``.pki`` is required), ``.sasl_ssl_bootstrap``,
                      ``.sasl_plaintext_bootstrap`` (server certificate from ``.pki``, a
                      tests.tls_support.Pki; SASL user ``.sasl_user`` / ``.sasl_password``
                      for PLAIN and SCRAM-SHA-256/512)
  ``oap_server``      OapServer: ``.grpc`` "127.0.0.1:P", ``.rest``, ``.graphql``, ``.pid``,
                      ``.run_dir``, ``.query`` (an OapGraphQL client)
  ``oap_with_kafka``  OapServer whose Kafka fetcher consumes from ``kafka_broker``
                      (``.kafka_bootstrap``, ``.namespace``)

Missing Java (or Maven with an empty jar cache) makes these fixtures FAIL, not skip: CI
must never pass by silently skipping the end-to-end tests.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.oap_graphql import OapGraphQL
from tests.tls_support import KEYSTORE_PASSWORD, Pki, make_pki

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts" / "realpeers"
CACHE = Path(os.environ.get("REALPEERS_CACHE", Path.home() / ".cache" / "realpeers"))
KAFKA_VERSION = os.environ.get("KAFKA_VERSION", "3.9.1")
# A second, plain broker for what only Kafka 4 serves (KIP-932 share groups); the suite's main
# broker stays on 3.9, the line most deployments still run.
KAFKA4_VERSION = os.environ.get("KAFKA4_VERSION", "4.2.1")
OAP_VERSION = os.environ.get("OAP_VERSION", "10.1.0")
# Launch attempts: a port found free can be taken by someone else before the JVM binds it.
_ATTEMPTS = 3
_PORT_IN_USE = 3  # exit status of the launchers for "port already in use"


class PeerStartError(RuntimeError):
    """A launcher failed; the message carries the tail of its output."""


@dataclass
class KafkaBroker:
    bootstrap: str
    port: int
    controller_port: int
    pid: int
    run_dir: Path
    startup_s: float = 0.0
    ssl_bootstrap: str = ""
    sasl_ssl_bootstrap: str = ""
    sasl_plaintext_bootstrap: str = ""
    pki: Pki | None = None
    sasl_user: str = "swmp-agent"
    sasl_password: str = "swmp-test-sasl-password"

    def stop(self) -> None:
        stop_pid_file(self.run_dir / "kafka.pid")


@dataclass
class OapServer:
    grpc: str
    rest: str
    graphql: str
    pid: int
    run_dir: Path
    kafka_bootstrap: str | None = None
    namespace: str = ""
    startup_s: float = 0.0
    query: OapGraphQL = field(init=False, repr=False)
    # The UTC day it started on: its H2 storage has one table per day and creates only the
    # day it started on, so past midnight it refuses every write ("Table ..._<day> not found").
    day: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Started today, it has no table for yesterday: windows stay inside today.
        self.query = OapGraphQL(self.graphql, within_day=True)
        self.day = _utc_day()

    def take_over(self, other: OapServer) -> None:
        """Become ``other`` (a fresh OAP), so the tests' session object stays the same."""
        for name in ("grpc", "rest", "graphql", "pid", "run_dir", "startup_s", "query", "day"):
            setattr(self, name, getattr(other, name))

    @property
    def log_file(self) -> Path:
        return self.run_dir / "oap.log"

    def stop(self) -> None:
        stop_pid_file(self.run_dir / "oap.pid")


def _utc_day() -> str:
    return time.strftime("%Y%m%d", time.gmtime())


def unique_name(prefix: str = "swmp-test") -> str:
    """A service name no other test in this session (or earlier ones) will use."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free a moment ago (all bound at once, then released)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def check_tools(cache_entry: str) -> None:
    """Fail (never skip) with a clear message if the launchers cannot work here."""
    if shutil.which("java") is None:
        pytest.fail(
            "e2e: `java` not found. Install Java 17 (`apt-get install -y openjdk-17-jre-headless`) "
            "or run `bash scripts/test_setup.sh`.",
            pytrace=False,
        )
    if not (CACHE / cache_entry / "libs" / ".complete").exists() and shutil.which("mvn") is None:
        pytest.fail(
            f"e2e: jars for {cache_entry} are not cached in {CACHE} and `mvn` is not installed. "
            "Run `bash scripts/test_setup.sh` (installs Maven and pre-fetches the jars).",
            pytrace=False,
        )


def _run_launcher(script: str, env: dict[str, str], run_dir: Path) -> tuple[int, str]:
    run_dir.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **env, "RUN_DIR": str(run_dir), "REALPEERS_OWNER_PID": str(os.getpid())}
    proc = subprocess.run(
        ["bash", str(SCRIPTS / script)],
        env=full_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    (run_dir / "launcher.log").write_text(proc.stdout + proc.stderr)
    return proc.returncode, proc.stderr + proc.stdout


def _pid_from(run_dir: Path, name: str) -> int:
    return int((run_dir / name).read_text().strip())


def stop_pid_file(pid_file: Path) -> None:
    """Stop the process named in ``pid_file`` (TERM, then KILL): that pid and nothing else."""
    if pid_file.exists():
        subprocess.run(
            ["bash", str(SCRIPTS / "stop_pid.sh"), str(pid_file)], check=False, capture_output=True
        )


def start_kafka(run_dir: Path, version: str = KAFKA_VERSION, secured: bool = True) -> KafkaBroker:
    """Start a single-node broker on free ports; raise PeerStartError if it does not come up.

    Besides PLAINTEXT it listens (``secured``) with SSL, SASL_SSL and SASL_PLAINTEXT (a test CA
    made here).
    """
    check_tools(f"kafka-{version}")
    pki = make_pki(run_dir / "pki") if secured else None
    user, password = KafkaBroker.sasl_user, KafkaBroker.sasl_password
    out = ""
    for attempt in range(_ATTEMPTS):
        port, cport, ssl_port, sasl_ssl_port, sasl_port = free_ports(5)
        attempt_dir = run_dir / f"try{attempt}" if attempt else run_dir
        t0 = time.monotonic()
        env = {"KAFKA_VERSION": version, "KAFKA_PORT": str(port), "KAFKA_CONTROLLER_PORT": str(cport)}
        if pki is not None:
            env |= {
                "KAFKA_SSL_PORT": str(ssl_port),
                "KAFKA_SASL_SSL_PORT": str(sasl_ssl_port),
                "KAFKA_SASL_PLAINTEXT_PORT": str(sasl_port),
                "KAFKA_KEYSTORE": str(pki.server_p12),
                "KAFKA_KEYSTORE_PASSWORD": KEYSTORE_PASSWORD,
                "KAFKA_SASL_USER": user,
                "KAFKA_SASL_PASSWORD": password,
                "KAFKA_SSL_CLIENT_CA": str(pki.ca),
            }
        rc, out = _run_launcher("start_kafka.sh", env, attempt_dir)
        if rc == 0:
            broker = KafkaBroker(
                bootstrap=f"127.0.0.1:{port}",
                port=port,
                controller_port=cport,
                pid=_pid_from(attempt_dir, "kafka.pid"),
                run_dir=attempt_dir,
                startup_s=time.monotonic() - t0,
            )
            if pki is not None:
                broker.ssl_bootstrap = f"127.0.0.1:{ssl_port}"
                broker.sasl_ssl_bootstrap = f"127.0.0.1:{sasl_ssl_port}"
                broker.sasl_plaintext_bootstrap = f"127.0.0.1:{sasl_port}"
                broker.pki = pki
            return broker
        stop_pid_file(attempt_dir / "kafka.pid")
        if rc != _PORT_IN_USE:
            break
    raise PeerStartError(f"start_kafka.sh failed:\n{out[-3000:]}")


def start_oap(run_dir: Path, kafka_bootstrap: str | None = None, namespace: str = "") -> OapServer:
    """Start an OAP on free ports (with its Kafka fetcher if ``kafka_bootstrap`` is given)."""
    check_tools(f"oap-{OAP_VERSION}")
    out = ""
    for attempt in range(_ATTEMPTS):
        grpc_port, rest_port = free_ports(2)
        attempt_dir = run_dir / f"try{attempt}" if attempt else run_dir
        env = {"OAP_GRPC_PORT": str(grpc_port), "OAP_REST_PORT": str(rest_port), "OAP_NAMESPACE": namespace}
        if kafka_bootstrap:
            env["OAP_KAFKA_BOOTSTRAP"] = kafka_bootstrap
        t0 = time.monotonic()
        rc, out = _run_launcher("start_oap.sh", env, attempt_dir)
        if rc == 0:
            server = OapServer(
                grpc=f"127.0.0.1:{grpc_port}",
                rest=f"http://127.0.0.1:{rest_port}",
                graphql=f"http://127.0.0.1:{rest_port}/graphql",
                pid=_pid_from(attempt_dir, "oap.pid"),
                run_dir=attempt_dir,
                kafka_bootstrap=kafka_bootstrap,
                namespace=namespace,
            )
            if kafka_bootstrap:
                _wait_kafka_consumer(server)
            server.startup_s = time.monotonic() - t0
            return server
        stop_pid_file(attempt_dir / "oap.pid")
        if rc != _PORT_IN_USE:
            break
    raise PeerStartError(f"start_oap.sh failed:\n{out[-3000:]}")


# The OAP answers queries before its Kafka consumer has joined its group, and that consumer
# starts at the END of each partition (auto.offset.reset=latest): a message produced
# before the consumer has fixed its position would be skipped. Waiting until the OAP log
# shows a position for every agent topic removes that race for tests.
_AGENT_TOPICS = ("segments", "logs", "meters", "managements")


def _wait_kafka_consumer(server: OapServer, timeout: float = 120.0) -> None:
    prefix = f"{server.namespace}-" if server.namespace else ""
    wanted = [
        re.compile(rf"(Resetting|Setting) offset for partition {re.escape(prefix)}skywalking-{t}-0\b")
        for t in _AGENT_TOPICS
    ]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = server.log_file.read_text(errors="replace") if server.log_file.exists() else ""
        if all(w.search(text) for w in wanted):
            return
        try:
            os.kill(server.pid, 0)
        except ProcessLookupError:
            raise PeerStartError(f"OAP {server.pid} died; see {server.log_file}") from None
        time.sleep(0.2)
    server.stop()
    raise PeerStartError(
        f"the OAP's Kafka consumer never positioned itself on {_AGENT_TOPICS}; see {server.log_file}"
    )


# ---------------------------------------------------------------------------- cleanup
_lock = threading.Lock()
_started: list[Path] = []  # pid files of everything this process started


def _track(pid_file: Path) -> None:
    with _lock:
        _started.append(pid_file)


def _stop_all() -> None:
    with _lock:
        files, _started[:] = list(_started), []
    for f in reversed(files):  # OAPs before the broker they consume from
        stop_pid_file(f)


atexit.register(_stop_all)


def _report(config: pytest.Config, line: str) -> None:
    """Print past pytest's capture so start-up durations show in every run's output."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        print(line, file=sys.stderr)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)


# ---------------------------------------------------------------------------- fixtures
def _kafka_fixture(
    request: pytest.FixtureRequest, run_dir: Path, version: str, secured: bool
) -> Iterator[KafkaBroker]:
    request.addfinalizer(lambda: stop_pid_file(run_dir / "kafka.pid"))
    _track(run_dir / "kafka.pid")
    broker = start_kafka(run_dir, version, secured)
    if broker.run_dir != run_dir:
        request.addfinalizer(broker.stop)
        _track(broker.run_dir / "kafka.pid")
    _report(
        request.config,
        f"[realpeers] kafka {version} {broker.bootstrap} pid={broker.pid} ready in {broker.startup_s:.1f}s",
    )
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def kafka_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaBroker]:
    yield from _kafka_fixture(request, tmp_path_factory.mktemp("kafka"), KAFKA_VERSION, secured=True)


@pytest.fixture(scope="session")
def kafka4_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaBroker]:
    """A Kafka 4 broker (PLAINTEXT only) for share groups; started only by the tests using it."""
    yield from _kafka_fixture(request, tmp_path_factory.mktemp("kafka4"), KAFKA4_VERSION, secured=False)


def _oap_fixture(
    request: pytest.FixtureRequest, run_dir: Path, kafka: KafkaBroker | None, label: str
) -> OapServer:
    """A session's OAP: stopped when ``request`` (the session's) ends, or at exit."""
    request.addfinalizer(lambda: stop_pid_file(run_dir / "oap.pid"))
    server = _started_oap(request.config, run_dir, kafka, label)
    if server.run_dir != run_dir:
        request.addfinalizer(server.stop)
    return server


def _started_oap(config: pytest.Config, run_dir: Path, kafka: KafkaBroker | None, label: str) -> OapServer:
    _track(run_dir / "oap.pid")
    server = start_oap(run_dir, kafka_bootstrap=kafka.bootstrap if kafka else None)
    if server.run_dir != run_dir:
        _track(server.run_dir / "oap.pid")
    _report(
        config,
        f"[realpeers] {label} grpc={server.grpc} rest={server.rest} pid={server.pid} "
        f"ready in {server.startup_s:.1f}s",
    )
    return server


@pytest.fixture(scope="session")
def oap_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OapServer]:
    server = _oap_fixture(request, tmp_path_factory.mktemp("oap"), None, "oap")
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _oap_of_today(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A session that crossed midnight (UTC) gets a fresh OAP before its next OAP test."""
    for name, kafka in (("oap_server", False), ("oap_with_kafka", True)):
        if name not in request.fixturenames:
            continue
        server: OapServer = request.getfixturevalue(name)
        if server.day == _utc_day():
            continue
        server.stop()
        broker = request.getfixturevalue("kafka_broker") if kafka else None
        # Not stopped with this test's request (the tests after it use it too): the session
        # fixture's own stop() reaches it through take_over(), and exit does otherwise.
        fresh = _started_oap(
            request.config, tmp_path_factory.mktemp("oap-next-day"), broker, f"{name} (new day)"
        )
        server.take_over(fresh)


@pytest.fixture(scope="session")
def oap_with_kafka(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, kafka_broker: KafkaBroker
) -> Iterator[OapServer]:
    server = _oap_fixture(request, tmp_path_factory.mktemp("oap-kafka"), kafka_broker, "oap+kafka")
    yield server
    server.stop()
