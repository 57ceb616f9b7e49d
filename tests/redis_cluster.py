"""A real Redis Cluster for tests: three masters (no replicas) on free 127.0.0.1 ports, made
from the ``redis-server`` binary with the runner of ``tests/daemons.py`` and joined by
``redis-cli --cluster create``. Each node's cluster bus gets its own free port
(``cluster-port``, Redis 7) rather than the default port + 10000, which may not exist above
55535. The fixture waits until every node reports ``cluster_state:ok`` (polled, no fixed
sleep) and stops every node by pid, also when the set-up fails half-way.

    def test_x(redis_cluster: ClusterInfo) -> None:
        rc = redis.cluster.RedisCluster(host=redis_cluster.host, port=redis_cluster.ports[0])
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.daemons import (
    REDIS_ARGS,
    REDIS_SERVER,
    Daemon,
    DaemonError,
    _need,
    free_port,
    server_env,
    start_with_retry,
    talk,
)

REDIS_CLI = "/usr/bin/redis-cli"
MASTERS = 3


@dataclass(frozen=True)
class ClusterInfo:
    host: str
    ports: tuple[int, ...]

    @property
    def nodes(self) -> list[str]:
        return [f"{self.host}:{p}" for p in self.ports]


def _node(port: int) -> Daemon:
    return Daemon(
        "redis-cluster",
        [
            REDIS_SERVER,
            "--port",
            "{port}",
            "--cluster-port",
            str(free_port()),
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "{dir}/nodes.conf",
            "--cluster-node-timeout",
            "5000",
            *REDIS_ARGS,
        ],
        port=port,
        user="redis",
    )


def cluster_state(port: int) -> str:
    """The ``cluster_state`` field of the node's CLUSTER INFO ("" if it does not answer)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"CLUSTER INFO\r\n")
            got = b""
            while b"cluster_state:" not in got or not got.endswith(b"\r\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
    except OSError:
        return ""
    for line in got.decode(errors="replace").splitlines():
        if line.startswith("cluster_state:"):
            return line.partition(":")[2]
    return ""


def start_cluster(nodes: list[Daemon], timeout: float = 60.0) -> ClusterInfo:
    """Start the nodes (appended to ``nodes`` as they start: the caller stops them), join them
    into one cluster and wait until each of them says the cluster is ok."""
    _need(REDIS_SERVER)
    _need(REDIS_CLI)
    for _ in range(MASTERS):
        nodes.append(start_with_retry(_node, lambda d: talk(d.port, b"PING\r\n", b"+PONG")))
    addresses = [f"127.0.0.1:{d.port}" for d in nodes]
    create = subprocess.run(
        [REDIS_CLI, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
        env=server_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if create.returncode != 0:
        out = (create.stdout + create.stderr).decode(errors="replace")
        raise DaemonError(f"redis-cli --cluster create failed ({create.returncode}):\n{out[-3000:]}")
    deadline = time.monotonic() + timeout
    while not all(cluster_state(d.port) == "ok" for d in nodes):
        if time.monotonic() > deadline:
            tails = "\n".join(d.log_tail(1000) for d in nodes)
            raise DaemonError(f"the Redis cluster is not ok after {timeout:.0f} s:\n{tails}")
        for d in nodes:
            if not d.alive():
                raise DaemonError(f"a cluster node exited:\n{d.log_tail()}")
        time.sleep(0.05)
    return ClusterInfo("127.0.0.1", tuple(d.port for d in nodes))


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterInfo]:
    nodes: list[Daemon] = []
    try:
        yield start_cluster(nodes)
    finally:
        for d in nodes:
            d.stop()
