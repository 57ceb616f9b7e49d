"""Shared pytest set-up for the whole suite.

Session fixtures for real backends (a Kafka broker, SkyWalking OAP servers) live in
``tests/realpeers.py``, data stores (PostgreSQL, MariaDB, Redis, memcached) in
``tests/daemons.py``; importing them here makes them available to every test module.
They start nothing until a test asks for them.

Defined here, one place each: the in-process fixtures that several test modules take
(``trace_sink``, ``meter_sink``, ``profiling_arena``). A module that needs another set-up
has a fixture of its own, under another name.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipc import Arena
from swmp import _sink, meters, tracing
from tests.brokers import rabbitmq
from tests.cli_fixtures import new_arena, procs, shm
from tests.daemons import mariadb_server, memcached_server, postgres_server, redis_server
from tests.native_forms import recording
from tests.realpeers import _oap_of_today, kafka4_broker, kafka_broker, oap_server, oap_with_kafka
from tests.zombies import reap_adopted, unreaped_after


def _grpc_fork_handlers_off_in_this_process() -> None:
    """gRPC core's fork handlers off in the pytest process only, where many tests use gRPC
    (in-process collectors, clients, senders) and others fork (``os.fork``, ``subprocess``
    with ``preexec_fn``) for children that never use it. With the handlers on, a fork made
    while any gRPC thread was busy left the child aborting (``Check failed:
    next_worker->state == KICKED``; after ``preexec_fn``, ``epoll_wait`` on a descriptor
    subprocess had closed) or hung: one CI run failed so (test_lifecycle), and a scratch loop
    with a busy client thread saw 12 aborts in 300 ``preexec_fn`` forks and a hang in 300
    plain ones; with them off, none in 600 and 300. gRPC reads the setting once, when it
    initializes (at import): set before anything imports grpc, then removed, so the
    processes the tests start (applications, servers, reporters) keep gRPC's default."""
    if "grpc" in sys.modules:  # too late to matter; leave gRPC as it is
        return
    had = os.environ.get("GRPC_ENABLE_FORK_SUPPORT")
    os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"
    try:
        import grpc  # after the setting, on purpose

        grpc.insecure_channel("127.0.0.1:1").close()  # gRPC initialized with the setting
    finally:
        if had is None:
            del os.environ["GRPC_ENABLE_FORK_SUPPORT"]
        else:
            os.environ["GRPC_ENABLE_FORK_SUPPORT"] = had


_grpc_fork_handlers_off_in_this_process()


# The agent spools by default into a per-user directory: tests must not leave data there for
# each other (or for the developer's own runs). Off for the suite; a child that drops the SW_*
# variables still spools into this session's own state directory, removed at exit. Tests of
# the default spool set XDG_STATE_HOME themselves.
os.environ.setdefault("SW_AGENT_SPOOL_DIR", "off")
_STATE = tempfile.mkdtemp(prefix="swmp-test-state-")
os.environ["XDG_STATE_HOME"] = _STATE
atexit.register(shutil.rmtree, _STATE, True)

__all__ = [
    "_oap_of_today",
    "kafka4_broker",
    "kafka_broker",
    "mariadb_server",
    "memcached_server",
    "new_arena",
    "oap_server",
    "oap_with_kafka",
    "postgres_server",
    "procs",
    "rabbitmq",
    "redis_server",
    "shm",
]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """After each test (and the fixtures it was the last user of): reap the orphans pytest
    adopted as a child subreaper (see tests/zombies.py)."""
    try:
        return (yield)
    finally:
        try:
            reap_adopted()
        except Exception as exc:  # the reaper's own fault must not fail every later teardown
            _reaper_failed(exc)


_REAPER_FAULTS: list[str] = []


def _reaper_failed(exc: Exception) -> None:
    if not _REAPER_FAULTS:
        print(f"\nreaping adopted zombies failed: {exc!r}", flush=True)
    _REAPER_FAULTS.append(repr(exc))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the session if zombies re-parented to pytest cannot be reaped."""
    try:
        left = unreaped_after()
    except Exception as exc:
        _reaper_failed(exc)
        left = []
    if _REAPER_FAULTS:
        print(f"\nthe zombie reaper failed {len(_REAPER_FAULTS)} times: {_REAPER_FAULTS[0]}", flush=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if left:
        print(f"\nzombie children of pytest (pid {os.getpid()}) left unreaped: {left}", flush=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def trace_sink() -> Iterator[_sink.MemorySink]:
    """:func:`tests.native_forms.recording` (a memory sink, the default tracing settings, put
    back afterwards) with the tracing counters at zero."""
    with recording() as memory:
        tracing.stats.reset()
        yield memory


@pytest.fixture
def meter_sink() -> Iterator[_sink.MemorySink]:
    """A memory sink for meter reports; no meter reporter and no meter before or after."""
    meters.stop_meter_reporter()
    meters.registry.clear()
    memory = _sink.MemorySink()
    _sink.set_sink(memory)
    try:
        yield memory
    finally:
        meters.stop_meter_reporter()
        meters.registry.clear()
        _sink.set_sink(None)


@pytest.fixture
def profiling_arena(tmp_path: Path) -> Iterator[Arena]:
    """A small arena whose task board the profiling tests post to; removed afterwards."""
    a = Arena.create(str(tmp_path / "p.arena"), slots=2, ring_capacity=65536)
    try:
        yield a
    finally:
        a.close()
        a.unlink()
