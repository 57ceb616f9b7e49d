"""Profiling across ``os.fork()``: a request being profiled forks (``subprocess`` with
``preexec_fn``, a ``multiprocessing`` fork, a plain ``os.fork`` in request code) while the
sampler thread holds that segment's lock. Real forks; the child is waited for with a bound
and killed, not waited on forever, when it hangs."""

from __future__ import annotations

import importlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from ipc import Arena
from reporter_proc import records as R
from swmp import _sink, profiling, tracing
from swmp.config import load
from swmp.profiling import sampler as sampler_module
from swmp.profiling.gate import gate
from swmp.profiling.sampler import Profiled, Sampler, StackSource
from swmp.tracing.context import new_entry_span
from tests.test_profiling import post, request, task

# swmp.profiling re-exports the gate object under the module's name
gate_module = importlib.import_module("swmp.profiling.gate")
CHILD_BOUND_S = 30.0  # a child that has not exited by then is stuck (it needs milliseconds)


@pytest.fixture()
def arena(tmp_path: Any) -> Iterator[Arena]:
    a = Arena.create(str(tmp_path / "f.arena"), slots=2, ring_capacity=65536)
    try:
        yield a
    finally:
        a.close()
        a.unlink()


@pytest.fixture()
def sink(arena: Arena, monkeypatch: pytest.MonkeyPatch) -> Iterator[_sink.MemorySink]:
    """Profiling installed as the agent installs it (its fork hook in ``swmp.lifecycle``)."""
    monkeypatch.setattr(sampler_module, "LINGER_S", 0.05)
    s = _sink.MemorySink()
    _sink.set_sink(s)
    tracing.configure(load({}))
    gate.reset_after_fork()
    profiling.install(load({"SW_AGENT_PROFILE_DURATION": "10"}))
    gate.attach(arena.board)
    yield s
    profiling.uninstall()
    _sink.set_sink(None)
    deadline = time.monotonic() + 5
    while gate.sampler_alive and time.monotonic() < deadline:
        time.sleep(0.01)


class HeldAtFork:
    """A stack source whose first call blocks, inside the snapshot (under the segment's lock),
    until the test has forked: the sampler thread holds the lock at the fork, for sure."""

    def __init__(self) -> None:
        self.holding = threading.Event()
        self.release = threading.Event()
        self.used = False

    def source_for(self, real: StackSource) -> StackSource:
        def source(depth: int) -> list[str]:
            if not self.used:
                self.used = True
                self.holding.set()
                self.release.wait(CHILD_BOUND_S)
            return real(depth)

        return source


def wait_child(pid: int) -> int:
    """The child's exit status; kills it and fails when it does not exit within the bound."""
    deadline = time.monotonic() + CHILD_BOUND_S
    while time.monotonic() < deadline:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child did not exit within {CHILD_BOUND_S:.0f} s (blocked finishing its span)")


def stacks_of(depth: int) -> list[str]:
    return ["x.f:1"]


def snapshots(sink: _sink.MemorySink) -> list[list[Any]]:
    return [orjson.loads(p) for t, p in sink.records if t == R.PROFILE_SNAPSHOT]


def test_a_request_that_forks_while_its_segment_is_sampled(
    arena: Arena, sink: _sink.MemorySink, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldAtFork()
    real_source = gate_module.current_stack_source
    monkeypatch.setattr(gate_module, "current_stack_source", lambda: held.source_for(real_source()))
    post(arena, task())
    r, w = os.pipe()
    span = new_entry_span("/slow")
    span.__enter__()
    item = span.segment.profile
    assert item is not None
    assert held.holding.wait(CHILD_BOUND_S), "the sampler never took a snapshot"
    pid = os.fork()  # the sampler thread is inside item.sample(), holding item.lock
    if pid == 0:  # pragma: no cover (the child reports through the pipe and its exit status)
        code = 3
        try:
            os.close(r)
            parent_segment = span.segment.segment_id
            before = len(snapshots(sink))
            span.__exit__(None, None, None)  # the request goes on and ends in the child
            # The parent's profiling state is gone: no sampler, no task counts, no board
            # until this process binds; the parent's segment is not sampled here.
            clean = gate.sampler is None and gate.started == {} and gate.board is None
            # The child's copy of the parent's segment is done with: sampling it (were anything
            # to try) dumps nothing, and it wakes no sampler of the parent.
            dropped = item.stopped and item.wake is None and not item.sample(time.monotonic() + 3600)
            mine = [s for s in snapshots(sink)[before:] if s[R.SNAP_SEGMENT_ID] == parent_segment]
            # Bound as a worker, the child profiles its own requests with its own sampler.
            gate.attach(arena.board)
            request("/slow", 0.1)
            own = [s for s in snapshots(sink)[before:] if s[R.SNAP_SEGMENT_ID] != parent_segment]
            os.write(
                w,
                orjson.dumps(
                    {"clean": clean, "dropped": dropped, "parent_snapshots": len(mine), "own": len(own)}
                ),
            )
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    held.release.set()
    try:
        code = wait_child(pid)
        with os.fdopen(r, "rb") as f:
            got = f.read()
    finally:
        span.__exit__(None, None, None)
    assert code == 0, got
    result = orjson.loads(got)
    assert result["clean"] and result["dropped"] and result["parent_snapshots"] == 0, result
    assert result["own"] >= 1, result
    # The parent went on sampling its own segment up to its end.
    assert any(s[R.SNAP_SEGMENT_ID] == span.segment.segment_id for s in snapshots(sink))


def test_the_parents_segments_are_dropped_in_the_child_without_their_locks() -> None:
    """Whatever the sampler held at the fork, the child's copy of each segment has a free lock
    of its own, is stopped (never sampled there) and wakes no sampler of the parent."""
    now = time.monotonic()
    items = [
        Profiled(task(), f"s{i}", stacks_of, started_mono=now, depth=5, max_profile_s=60) for i in (1, 2)
    ]
    sampler = Sampler()
    sampler._active = list(items)
    for p in items:
        p.wake = sampler._wake.set
    items[0].lock.acquire()  # as the sampler thread holds it mid-snapshot
    sampler._lock.acquire()  # and the sampler's own lock, e.g. pruning its list
    old_lock = items[0].lock
    sampler.forget_after_fork()
    for p in items:
        assert p.stopped and p.wake is None and not p.lock.locked()
        p.stop()  # returns at once
    assert items[0].lock is not old_lock
    assert sampler._active == [] and sampler._thread is None and not sampler._lock.locked()
