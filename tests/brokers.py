"""A real RabbitMQ broker for tests: Debian's ``rabbitmq-server``, one per test session.

Built on the runner of ``tests/daemons.py``. The package's system service is not used: the
fixture starts a private node on 127.0.0.1 in its own temporary directory, with its own
Mnesia and log directories, node name, AMQP port, Erlang distribution port and its own
``epmd`` on a free port, so several test sessions (other worktrees) run brokers side by
side without sharing an ``epmd``, a node name or a port. RabbitMQ 3.10 runs as root, so no
system user is needed. Readiness is a real AMQP login (``guest``/``guest``, which the
broker allows on loopback), never a fixed sleep.

Processes and shutdown: ``epmd`` is a daemon of its own (started by us, so its pid is known
and it does not linger as Erlang's auto-started ``epmd -daemon`` would), then the
``rabbitmq-server`` wrapper script, which runs the Erlang VM (``beam.smp``) as its child
and stops it on SIGTERM. The VM's pid comes from ``RABBITMQ_PID_FILE``. Stopping sends
SIGTERM to the wrapper, then to the VM if it is somehow still there (KILL after a grace
period), then stops ``epmd``: those pids and nothing else, also after a failed start.

Fixture (registered by ``tests/conftest.py``):
  ``rabbitmq``  RabbitMQBroker: ``.host``, ``.port``, ``.url`` ("amqp://guest:guest@127.0.0.1:P/"),
                ``.pid`` (the Erlang VM), ``.dir`` (``log/`` holds the broker's own log)

Tests share the broker: each test declares its own queues and exchanges (``unique_name``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.daemons import Daemon, DaemonError, free_port, start_with_retry

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
EPMD = "/usr/bin/epmd"
_READY_TIMEOUT_S = 90.0
_STOP_GRACE_S = 20.0


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class RabbitDaemon(Daemon):
    """The ``rabbitmq-server`` wrapper plus the ``epmd`` it registers with."""

    def __init__(self, port: int) -> None:
        self.epmd = Daemon("epmd", [EPMD, "-port", "{port}", "-address", "127.0.0.1"], port=free_port())
        dist_port = free_port()
        super().__init__("rabbitmq", [RABBITMQ_SERVER], port=port, stop_timeout=_STOP_GRACE_S)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))},
            "HOME": str(self.dir),  # the Erlang cookie goes here, not into root's home
            "RABBITMQ_NODENAME": f"swmp-test-{port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "ERL_EPMD_PORT": str(self.epmd.port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_PID_FILE": str(self.dir / "beam.pid"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.dir / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(self.dir / "plugins-expand"),
        }

    def prepare(self) -> None:
        """Write the node's configuration and start its ``epmd``."""
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            "loopback_users.guest = true\n"
            # A busy shared test box must not make the broker block publishers.
            "disk_free_limit.absolute = 1MB\n"
            "vm_memory_high_watermark.relative = 0.8\n"
        )
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")  # keeps /etc/rabbitmq/rabbitmq-env.conf out
        self.epmd.start(lambda d: _listening(d.port), timeout=15.0)

    @property
    def vm_pid(self) -> int | None:
        try:
            return int((self.dir / "beam.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self, keep_dir: bool = False) -> None:
        vm = self.vm_pid  # read before the directory goes
        super().stop(keep_dir=True)
        if vm is not None and _alive(vm):  # the wrapper was killed before it could stop the VM
            with contextlib.suppress(ProcessLookupError):
                os.kill(vm, signal.SIGTERM)
            if not _wait_gone(vm, _STOP_GRACE_S):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(vm, signal.SIGKILL)
                _wait_gone(vm, 5.0)
        self.epmd.stop(keep_dir=keep_dir)
        super().stop(keep_dir=keep_dir)  # removes the directory now that nothing writes to it

    def log_tail(self, chars: int = 3000) -> str:
        logs = sorted((self.dir / "log").glob("*.log"))
        broker_log = logs[0].read_text(errors="replace")[-chars:] if logs else ""
        return f"{super().log_tail(chars)}\n--- broker log\n{broker_log}"


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1.0):
        return True
    return False


def amqp_login(port: int) -> bool:
    """A full AMQP connection (protocol handshake and login) to 127.0.0.1:port succeeds."""
    import pika

    params = pika.ConnectionParameters(
        "127.0.0.1",
        port,
        credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1,
        socket_timeout=2,
        blocked_connection_timeout=2,
    )
    try:
        pika.BlockingConnection(params).close()
    except Exception:
        return False
    return True


def _ready(d: Daemon) -> bool:
    if not _listening(d.port):  # cheap check first: pika logs every refused connection
        return False
    return amqp_login(d.port)


def start_rabbitmq() -> RabbitDaemon:
    """A private RabbitMQ node on free ports; raises DaemonError if it never accepts a login."""
    for path in (RABBITMQ_SERVER, EPMD):
        if not Path(path).exists():
            raise DaemonError(f"{path} is missing: run scripts/test_setup.sh (rabbitmq-server)")

    def setup(d: Daemon) -> None:
        assert isinstance(d, RabbitDaemon)
        d.prepare()

    d = start_with_retry(RabbitDaemon, _ready, timeout=_READY_TIMEOUT_S, setup=setup)
    assert isinstance(d, RabbitDaemon)
    return d


@dataclass(frozen=True)
class RabbitMQBroker:
    host: str
    port: int
    pid: int
    dir: Path
    startup_s: float

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/"


@pytest.fixture(scope="session")
def rabbitmq(request: pytest.FixtureRequest) -> Iterator[RabbitMQBroker]:
    t0 = time.monotonic()
    d = start_rabbitmq()
    try:
        broker = RabbitMQBroker("127.0.0.1", d.port, d.vm_pid or d.pid, d.dir, time.monotonic() - t0)
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(
                    f"[brokers] rabbitmq {broker.host}:{broker.port} pid={broker.pid} "
                    f"ready in {broker.startup_s:.1f}s"
                )
        yield broker
    finally:
        d.stop()
