"""Ids: unique within a process and across forked workers, with and without at-fork hooks."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from swmp.tracing import ids

N_CHILDREN = 6
IDS_PER_CHILD = 2000


def _collect_from_children(fork: object) -> list[str]:
    """Fork N children (with ``fork``), each drawing ids; read them back through a pipe."""
    ids.new_id()  # the parent has drawn ids: children must not continue its sequence
    children = []
    for _ in range(N_CHILDREN):
        r, w = os.pipe()
        pid = fork()  # type: ignore[operator]
        if pid == 0:  # child
            try:
                os.close(r)
                data = "\n".join(ids.new_id() for _ in range(IDS_PER_CHILD)).encode()
                with os.fdopen(w, "wb") as f:
                    f.write(data)
            finally:
                os._exit(0)
        os.close(w)
        children.append((pid, r))
    out: list[str] = []
    for pid, r in children:
        with os.fdopen(r, "rb") as f:
            out.extend(f.read().decode().split("\n"))
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    return out


def test_ids_unique_in_process_and_threads() -> None:
    got: list[str] = []
    lock = threading.Lock()

    def draw() -> None:
        local = [ids.new_id() for _ in range(5000)]
        with lock:
            got.extend(local)

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == len(got) == 20000


def test_ids_unique_across_os_fork() -> None:
    child_ids = _collect_from_children(os.fork)
    parent_ids = [ids.new_id() for _ in range(IDS_PER_CHILD)]
    all_ids = child_ids + parent_ids
    assert len(all_ids) == (N_CHILDREN + 1) * IDS_PER_CHILD
    assert len(set(all_ids)) == len(all_ids)
    assert len({i.rsplit(".", 1)[0] for i in child_ids}) == N_CHILDREN


# Run in a fresh interpreter: a fork that skips Python's at-fork handling is only safe in a
# process with no other thread (as uWSGI's master forks its workers). In this test run, threads
# left by earlier tests (executors, a gRPC server's poller) could hold the GIL's own mutex at
# the instant of the fork, and the child, which never re-creates it, hung on it.
_RAW_FORK_SCENARIO = """
import ctypes, json, os, sys
sys.path.insert(0, sys.argv[1])
from swmp.tracing import ids
from tests.test_tracing_ids import _collect_from_children, IDS_PER_CHILD
ids.use_pid_source(os.getpid)
libc = ctypes.CDLL(None, use_errno=True)
libc.fork.restype = ctypes.c_int
child_ids = _collect_from_children(libc.fork)
parent_ids = [ids.new_id() for _ in range(IDS_PER_CHILD)]
print(json.dumps({"children": child_ids, "parent": parent_ids}))
"""


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "fork"), reason="needs libc fork()")
def test_ids_unique_across_fork_without_python_hooks() -> None:
    """uWSGI forks workers from C: Python's at-fork hooks do not run. Without uwsgidecorators
    either, swmp.lifecycle says the hooks are not reliable and its pid source is getpid:
    the check on every id must catch the fork."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", _RAW_FORK_SCENARIO, str(root)],
        cwd=root, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    got = json.loads(done.stdout.strip().splitlines()[-1])
    all_ids = got["children"] + got["parent"]
    assert len(set(all_ids)) == len(all_ids) == (N_CHILDREN + 1) * IDS_PER_CHILD
    assert len({i.rsplit(".", 1)[0] for i in got["children"]}) == N_CHILDREN


def test_drawing_ids_and_tracing_a_request_make_no_getpid_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the fork hooks are reliable (here: no uWSGI), the steady state makes no system
    call per id or per traced request for the fork check."""
    from swmp import _sink, lifecycle
    from swmp.tracing import Component, Layer
    from swmp.tracing.context import new_entry_span, new_exit_span

    assert lifecycle.FORK_HOOKS_RELIABLE
    ids.new_id()
    calls = []
    real = os.getpid

    def counting() -> int:
        calls.append(1)
        return real()

    monkeypatch.setattr(os, "getpid", counting)
    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    try:
        for _ in range(100):
            ids.new_id()
            with (
                new_entry_span("/r", None, Component.FLASK, Layer.HTTP),
                new_exit_span("/x", "p:1", Component.REQUESTS, Layer.HTTP),
            ):
                pass
    finally:
        _sink.set_sink(None)
    assert len(sink.records) == 100
    assert calls == []


def test_an_id_is_the_prefix_and_the_next_number() -> None:
    """The same shape from the native and the pure-Python source: ``<prefix><n>``, n counting
    up by one (digits across 9 -> 10 -> 100 ... written correctly)."""
    first = ids.new_id()
    prefix = ids.process_prefix()
    start = int(first.removeprefix(prefix))
    drawn = [ids.new_id() for _ in range(1200)]
    assert all(i.startswith(prefix) for i in drawn)
    assert [int(i.removeprefix(prefix)) for i in drawn] == list(range(start + 1, start + 1201))
    assert all(i == prefix + str(int(i.removeprefix(prefix))) for i in drawn)
