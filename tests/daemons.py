"""Real server processes for tests: a small runner plus session fixtures for data stores.

The runner starts one command in its own temporary directory, on a free 127.0.0.1 port,
optionally as a system user (``setpriv``; PostgreSQL and MariaDB refuse to run as root),
waits until a probe really talks to it, and stops it by pid (a stop signal, then KILL after
a deadline). The directory, with the server's log, is removed at stop; a server that fails
to start raises :class:`DaemonError` carrying the tail of its log. Never the system services.

Runner API (for other server kinds, e.g. RabbitMQ in its own module)::

    port = free_port()
    with Daemon("redis", [REDIS, "--port", str(port)], port=port).running(
        ready=lambda d: redis_ping(d.port)
    ) as d:
        ...  # d.port, d.pid, d.dir (owned by d.user when set), d.log_tail()

    # or without ``with``: d.start(ready=..., timeout=...); ... d.stop()
    # ``Daemon.argv`` may contain "{port}" and "{dir}", filled in at start.

``start_with_retry(make, ready)`` builds a fresh Daemon (new port) and retries when another
process took the port between ``free_port()`` and the server's bind.

Session fixtures (registered by ``tests/conftest.py``; they start nothing until asked for):
  ``postgres_server``   ServerInfo for PostgreSQL 15, database ``swmp``, user ``swmp``
  ``mariadb_server``    ServerInfo for MariaDB, database ``swmp``, user ``swmp``
  ``redis_server``      ServerInfo for Redis (no password, db 0)
  ``memcached_server``  ServerInfo for memcached
Each test module must use its own table / key names: the servers are shared by the session.
A missing binary makes a fixture FAIL, not skip.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

PG_BIN = Path("/usr/lib/postgresql/15/bin")
MARIADB_INSTALL_DB = "/usr/bin/mariadb-install-db"
MARIADBD = "/usr/sbin/mariadbd"
REDIS_SERVER = "/usr/bin/redis-server"
MEMCACHED = "/usr/bin/memcached"
SETPRIV = "/usr/bin/setpriv"

USER = "swmp"
PASSWORD = "swmp-secret"
DATABASE = "swmp"
_ATTEMPTS = 3


class DaemonError(RuntimeError):
    """A server did not start (or died); the message carries the tail of its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now (it may be taken later: retry)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def talk(port: int, send: bytes, expect: bytes, timeout: float = 1.0) -> bool:
    """Connect to 127.0.0.1:port, send ``send`` and tell whether the reply starts with ``expect``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            if send:
                s.sendall(send)
            got = b""
            while len(got) < len(expect):
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
            return got.startswith(expect)
    except OSError:
        return False


_live: dict[int, Daemon] = {}  # pid -> daemon, stopped at exit if a finalizer never ran


@atexit.register
def _stop_leftovers() -> None:
    for d in list(_live.values()):
        d.stop()


def server_env() -> dict[str, str] | None:
    """The environment of a server and its tools: this process's without its preloaded
    libraries (the sanitizer runtimes of a sanitized run of the tests, there to check the
    agent's C code; PostgreSQL's tools hang under them); None (inherited) when there are none."""
    if "LD_PRELOAD" not in os.environ:
        return None
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


class Daemon:
    """One server process in its own temporary directory."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        port: int,
        user: str | None = None,
        env: dict[str, str] | None = None,
        stop_signal: int = signal.SIGTERM,
        stop_timeout: float = 15.0,
    ) -> None:
        self.name = name
        self.port = port
        self.user = user
        self.env = server_env() if env is None else env
        self.stop_signal = stop_signal
        self.stop_timeout = stop_timeout
        self.dir = Path(tempfile.mkdtemp(prefix=f"swmp-{name}-"))
        os.chmod(self.dir, 0o755)
        if user:
            pw = pwd.getpwnam(user)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.argv = [a.format(port=port, dir=self.dir) for a in argv]
        self.log_path = self.dir / f"{name}.log"
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.popen is not None, "not started"
        return self.popen.pid

    def as_user(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run as :attr:`user` (if any), killed if this test process dies."""
        prefix = [SETPRIV, "--pdeathsig", "TERM"]
        if self.user:
            prefix += ["--reuid", self.user, "--regid", self.user, "--init-groups"]
        return [*prefix, "--", *argv]

    def run(self, argv: Sequence[str], timeout: float = 120.0) -> str:
        """Run a set-up command (e.g. ``initdb``) as :attr:`user` in :attr:`dir`; its output."""
        proc = subprocess.run(
            self.as_user(argv),
            cwd=self.dir,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        out = (proc.stdout + proc.stderr).decode(errors="replace")
        if proc.returncode != 0:
            raise DaemonError(f"{self.name}: {argv[0]} failed ({proc.returncode}):\n{out[-3000:]}")
        return out

    def start(self, ready: Callable[[Daemon], bool], timeout: float = 60.0) -> Daemon:
        """Start the server and wait until ``ready(self)`` is true; raises DaemonError."""
        with open(self.log_path, "ab") as out:
            self.popen = subprocess.Popen(
                self.as_user(self.argv),
                cwd=self.dir,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _live[self.popen.pid] = self
        deadline = time.monotonic() + timeout
        while True:
            if self.popen.poll() is not None:
                raise DaemonError(
                    f"{self.name} exited ({self.popen.returncode}) before it was ready:\n{self.log_tail()}"
                )
            if ready(self):
                return self
            if time.monotonic() > deadline:
                self.stop(keep_dir=True)
                raise DaemonError(f"{self.name} not ready after {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.05)

    @contextlib.contextmanager
    def running(self, ready: Callable[[Daemon], bool], timeout: float = 60.0) -> Iterator[Daemon]:
        try:
            yield self.start(ready, timeout)
        finally:
            self.stop()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def port_in_use_failure(self) -> bool:
        """Did the server exit because its port was taken (worth a retry on a new port)?"""
        text = self.log_tail().lower()
        return not self.alive() and ("in use" in text or "eaddrinuse" in text)

    def stop(self, keep_dir: bool = False) -> None:
        """Stop signal, KILL after ``stop_timeout``; remove the directory. Idempotent."""
        p = self.popen
        if p is not None and p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, self.stop_signal)
            try:
                p.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                p.wait(10)
        if p is not None:
            _live.pop(p.pid, None)
        if not keep_dir and not os.environ.get("SWMP_KEEP_DAEMON_DIRS"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return "(no log)"


def start_with_retry(
    make: Callable[[int], Daemon],
    ready: Callable[[Daemon], bool],
    timeout: float = 60.0,
    setup: Callable[[Daemon], None] | None = None,
) -> Daemon:
    """``make(free_port())``, optional ``setup(d)`` before start, start; retried on a port clash."""
    for attempt in range(_ATTEMPTS):
        d = make(free_port())
        try:
            if setup is not None:
                setup(d)
            return d.start(ready, timeout)
        except DaemonError:
            clash = d.port_in_use_failure()
            d.stop()
            if not clash or attempt == _ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


# -- the data stores ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerInfo:
    """Where a test finds a server; ``user``/``password``/``database`` empty where unused."""

    kind: str
    host: str
    port: int
    pid: int
    user: str = ""
    password: str = ""
    database: str = ""
    dir: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def _need(path: str | Path) -> None:
    if not Path(path).exists():
        raise DaemonError(f"{path} is missing: run scripts/test_setup.sh (Debian packages)")


def _pg_ready(d: Daemon) -> bool:
    # pg_isready opens a real connection and reads the server's answer.
    r = subprocess.run(
        [str(PG_BIN / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(d.port), "-t", "1"],
        env=d.env,
        check=False,
        capture_output=True,
    )
    return r.returncode == 0


def start_postgres() -> tuple[Daemon, ServerInfo]:
    """PostgreSQL 15 as ``postgres``: initdb, scram passwords, database and user ``swmp``."""
    _need(PG_BIN / "postgres")

    def make(port: int) -> Daemon:
        return Daemon(
            "postgres",
            [
                str(PG_BIN / "postgres"),
                "-D",
                "{dir}/data",
                "-p",
                "{port}",
                "-h",
                "127.0.0.1",
                "-k",
                "{dir}",
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "max_connections=100",
            ],
            port=port,
            user="postgres",
            stop_signal=signal.SIGINT,  # "fast" shutdown: TERM waits for every client to leave
        )

    def setup(d: Daemon) -> None:
        pwfile = d.dir / "pw"
        pwfile.write_text(PASSWORD + "\n")
        pw = pwd.getpwnam("postgres")
        os.chown(pwfile, pw.pw_uid, pw.pw_gid)
        d.run(
            [
                str(PG_BIN / "initdb"),
                "-D",
                str(d.dir / "data"),
                "-U",
                "postgres",
                "--pwfile",
                str(pwfile),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--no-sync",
            ]
        )

    d = start_with_retry(make, _pg_ready, setup=setup)
    sock = ["-h", str(d.dir), "-p", str(d.port), "-U", "postgres"]
    try:
        d.run(
            [
                str(PG_BIN / "psql"),
                *sock,
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                f"CREATE USER {USER} PASSWORD '{PASSWORD}'",
            ]
        )
        d.run([str(PG_BIN / "createdb"), *sock, "-O", USER, DATABASE])
    except Exception:
        d.stop()
        raise
    return d, ServerInfo("postgresql", "127.0.0.1", d.port, d.pid, USER, PASSWORD, DATABASE, str(d.dir))


def _mysql_ready(d: Daemon) -> bool:
    # The server's handshake packet: 3-byte length, sequence 0, protocol version 10.
    try:
        with socket.create_connection(("127.0.0.1", d.port), timeout=1.0) as s:
            head = s.recv(5)
            return len(head) == 5 and head[3] == 0 and head[4] == 10
    except OSError:
        return False


def start_mariadb() -> tuple[Daemon, ServerInfo]:
    """MariaDB as ``mysql``: mariadb-install-db, an init file creating database and user ``swmp``."""
    _need(MARIADBD)

    def make(port: int) -> Daemon:
        return Daemon(
            "mariadb",
            [
                MARIADBD,
                "--no-defaults",
                "--datadir={dir}/data",
                "--port={port}",
                "--bind-address=127.0.0.1",
                "--socket={dir}/mysqld.sock",
                "--pid-file={dir}/mysqld.pid",
                "--init-file={dir}/init.sql",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
                "--innodb-flush-log-at-trx-commit=0",
                "--skip-log-bin",
            ],
            port=port,
            user="mysql",
        )

    def setup(d: Daemon) -> None:
        (d.dir / "init.sql").write_text(
            f"CREATE DATABASE IF NOT EXISTS {DATABASE};\n"
            f"CREATE USER IF NOT EXISTS '{USER}'@'%' IDENTIFIED BY '{PASSWORD}';\n"
            f"GRANT ALL ON {DATABASE}.* TO '{USER}'@'%';\n"
        )
        d.run(
            [
                MARIADB_INSTALL_DB,
                "--no-defaults",
                f"--datadir={d.dir}/data",
                "--user=mysql",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ],
            timeout=180,
        )

    d = start_with_retry(make, _mysql_ready, setup=setup, timeout=120)
    return d, ServerInfo("mysql", "127.0.0.1", d.port, d.pid, USER, PASSWORD, DATABASE, str(d.dir))


# Every redis-server the tests start: loopback only, its own directory, no persistence, in
# the foreground (stopped by pid).
REDIS_ARGS = (
    "--bind", "127.0.0.1", "--dir", "{dir}", "--save", "", "--appendonly", "no",
    "--daemonize", "no", "--protected-mode", "no",
)  # fmt: skip


def start_redis() -> tuple[Daemon, ServerInfo]:
    _need(REDIS_SERVER)

    def make(port: int) -> Daemon:
        return Daemon("redis", [REDIS_SERVER, "--port", "{port}", *REDIS_ARGS], port=port, user="redis")

    d = start_with_retry(make, lambda d: talk(d.port, b"PING\r\n", b"+PONG"))
    return d, ServerInfo("redis", "127.0.0.1", d.port, d.pid, database="0", dir=str(d.dir))


def start_memcached() -> tuple[Daemon, ServerInfo]:
    _need(MEMCACHED)

    def make(port: int) -> Daemon:
        return Daemon(
            "memcached",
            [MEMCACHED, "-l", "127.0.0.1", "-p", "{port}", "-U", "0", "-m", "32"],
            port=port,
            user="memcache",
        )

    d = start_with_retry(make, lambda d: talk(d.port, b"version\r\n", b"VERSION "))
    return d, ServerInfo("memcached", "127.0.0.1", d.port, d.pid, dir=str(d.dir))


def _fixture(start: Callable[[], tuple[Daemon, ServerInfo]]) -> Iterator[ServerInfo]:
    d, info = start()
    try:
        yield info
    finally:
        d.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[ServerInfo]:
    yield from _fixture(start_postgres)


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[ServerInfo]:
    yield from _fixture(start_mariadb)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[ServerInfo]:
    yield from _fixture(start_redis)


@pytest.fixture(scope="session")
def memcached_server() -> Iterator[ServerInfo]:
    yield from _fixture(start_memcached)
