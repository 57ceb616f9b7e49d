"""The native ring writer (ipc/_native/ringwrite.c) writes what the pure-Python one writes.

Two rings, one written through ``ipc._ringwrite.Writer`` and one through the pure-Python
closure (both built by ``ring_writer._make_write``, sharing the slow path), get the same
operations: writes of every kind (good, type 0 / 65535 / out of range / bool, oversize,
``str``, ``bytearray`` and ``memoryview`` payloads), reads and commits, and garbage stored in
the tail and head words. After every operation the writers' answers (and the readers':
what a consumer gets), the control words and, until garbage is stored in a position word,
the published bytes must be equal. Also: the build is in use, and concurrent writers
from several threads lose nothing.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, example, given, settings

from ipc import _layout as L
from ipc import ring_writer
from ipc.ring_reader import RingReader
from tests.fuzz_budget import examples
from tests.native_build import HAVE_CC, assert_current

CAP = 4096
ROOT = Path(__file__).resolve().parent.parent
native_only = pytest.mark.skipif(not ring_writer.NATIVE, reason="the native ring writer is not built")


class Ring:
    def __init__(self, native: bool) -> None:
        self.mm = mmap.mmap(-1, L.CONTROL_SIZE + CAP)
        self.status = memoryview(bytearray(L.STATUS_SIZE)).cast("Q")
        self.control = memoryview(self.mm)[: L.CONTROL_SIZE].cast("Q")
        self.data = memoryview(self.mm)[L.CONTROL_SIZE :]
        self.wakes = 0
        self.write = ring_writer._make_write(
            0, control=self.control, data=self.data, status=self.status, wake=self._wake, cap=CAP,
            native=native,
        )  # fmt: skip
        self.reader = RingReader(0, self.control, self.data, mapping=self.mm, base=L.CONTROL_SIZE)

    def _wake(self) -> None:
        self.wakes += 1

    def state(self) -> tuple[bytes, list[int], int]:
        """The published bytes (what a reader may still read: head to tail; other bytes are
        private to the writer or consumed, and the pure version's packer can leave a partial
        header at the tail when it refuses a value), the control words, the wake-ups."""
        tail, head = int(self.control[L.C_TAIL]), int(self.control[L.C_HEAD])
        published = b""
        if head <= tail <= L.POSITION_LIMIT:
            data = bytes(self.data)
            published = bytes(data[p % CAP] for p in range(max(head, tail - CAP), tail))
        return published, list(self.control[: L.C_HEAD + 8]), self.wakes


def _payload(kind: str, n: int) -> Any:
    raw = bytes(i % 251 for i in range(n))
    return {"bytes": raw, "bytearray": bytearray(raw), "memoryview": memoryview(raw), "str": "x" * n}[kind]


OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("write"),
            st.sampled_from([1, 1, 1, 7, 0, 65535, 65536, -1, 2**70, True]),
            st.sampled_from(["bytes", "bytes", "bytes", "bytearray", "memoryview", "str"]),
            st.one_of(st.integers(0, 300), st.integers(1500, 2100)),
        ),
        st.tuples(st.just("read"), st.integers(0, 5)),
        st.tuples(st.just("sleep"), st.booleans()),
        st.tuples(
            st.just("garbage"),
            st.sampled_from([L.C_TAIL, L.C_HEAD]),
            st.one_of(st.integers(0, 3 * CAP), st.integers(2**62 - 10, 2**64 - 1)),
        ),
    ),
    max_size=60,
)


@native_only
@settings(
    max_examples=int(os.environ.get("SWMP_FUZZ_EXAMPLES", examples(300))),  # more for a longer search
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(ops=OPS)
# Found by a whole-suite run: struct's pack_into wrote a refused payload's header into the pure
# ring's unpublished bytes (the native writer writes nothing), which a garbage tail then exposed.
@example(ops=[*[("write", 1, "bytes", 0)] * 3, ("write", 1, "str", 0), ("write", 0, "memoryview", 0),
              ("read", 3), ("garbage", L.C_TAIL, 48), ("read", 1)])  # fmt: skip
def test_native_and_pure_writers_leave_the_same_ring(ops: list[tuple[Any, ...]]) -> None:
    logging.getLogger("ipc").setLevel(logging.CRITICAL)
    rings = [Ring(native=True), Ring(native=False)]
    garbage = False  # once a position word is garbage, "published" bytes are not the writer's
    for op in ops:
        garbage = garbage or op[0] == "garbage"
        answers = []
        for ring in rings:
            if op[0] == "write":
                _, rtype, kind, n = op
                answers.append(ring.write(rtype, _payload(kind, n)))
            elif op[0] == "read":
                answers.append(ring.reader.read(op[1]))
                ring.reader.commit()
            elif op[0] == "sleep":
                ring.status[L.S_SLEEPING] = int(op[1])
                answers.append(None)
            else:
                ring.control[op[1]] = op[2]
                answers.append(None)
        assert answers[0] == answers[1], op
        native, pure = rings[0].state(), rings[1].state()
        assert native[1:] == pure[1:], op
        if not garbage:
            assert native[0] == pure[0], op


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler: the install falls back to pure Python")
def test_the_native_writer_is_built_and_current() -> None:
    assert ring_writer.NATIVE, "ipc._ringwrite did not build (pip install -e . builds it)"
    from ipc import _ringwrite  # type: ignore[attr-defined]

    assert_current(_ringwrite.__file__, ROOT / "ipc" / "_native" / "ringwrite.c")


@native_only
def test_threads_writing_at_once_lose_nothing() -> None:
    ring = Ring(native=True)
    per_thread, threads = 3000, 4
    got: list[bytes] = []

    def produce(k: int) -> None:
        for i in range(per_thread):
            payload = f"{k}:{i}".encode()
            while not ring.write(1, payload):
                pass  # full: the reader below makes room

    workers = [threading.Thread(target=produce, args=(k,)) for k in range(threads)]
    for t in workers:
        t.start()
    while any(t.is_alive() for t in workers) or len(got) < per_thread * threads:
        for _, payload in ring.reader.read(1000):
            got.append(payload)
        ring.reader.commit()
        if not any(t.is_alive() for t in workers) and len(got) >= per_thread * threads:
            break
    for t in workers:
        t.join()
    assert sorted(got) == sorted(f"{k}:{i}".encode() for k in range(threads) for i in range(per_thread))


@native_only
def test_no_fast_write_goes_in_while_another_thread_is_in_the_slow_path() -> None:
    """The fast path takes no lock (the GIL keeps it whole); a thread in the slow path, whose
    Python code may let the GIL go, must still keep every other writer out until it is done.
    Here the slow path sleeps (the GIL let go) while another thread writes bytes payloads
    (the fast path's kind) as fast as it can: none of them goes in during the sleep."""
    ring = Ring(native=True)
    assert ring.write(1, b"first")  # the first write sets the write limit (the slow path)
    assert [p for _, p in ring.reader.read(10)] == [b"first"]
    writer = ring.write.__self__  # type: ignore[attr-defined]
    inside, done = threading.Event(), threading.Event()
    tails: list[int] = []

    def sleeping_slow(rtype: int, payload: Any) -> bool:
        tails.append(int(ring.control[L.C_TAIL]))
        inside.set()
        done.wait(0.2)  # the GIL let go for 0.2 s: the other thread runs, and waits
        tails.append(int(ring.control[L.C_TAIL]))
        return False

    writer.set_slow(sleeping_slow)
    results: list[bool] = []

    def hammer() -> None:
        inside.wait(10)
        results.extend(ring.write(1, b"fast") for _ in range(20))
        done.set()

    other = threading.Thread(target=hammer)
    other.start()
    assert ring.write(1, memoryview(b"slow")) is False  # not bytes: the slow path
    other.join(10)
    assert tails[0] == tails[1], "a fast write went in while the slow path held the writer"
    assert results == [True] * 20  # and they all went in after it
    assert [p for _, p in ring.reader.read(100)] == [b"fast"] * 20


@pytest.mark.parametrize("kind", ["pure", pytest.param("native", marks=native_only)])
def test_a_write_from_inside_a_write_of_the_same_thread_is_dropped_not_waited_for(kind: str) -> None:
    """A signal handler that logs (log reporter on) while its thread is inside a ring write:
    the writer waited for the lock its own thread held, forever (the application hung).
    The inner record is dropped and counted; the outer one and later ones are written.
    Here the handler runs inside the slow path's page returner (tests/ring_reentry.py),
    in a subprocess, so that a writer that still waits fails the test instead of hanging it."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(ring_writer.PURE_ENV, None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "ring_reentry.py"), kind],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got == {
        "outer": True, "inner": [False], "after": True, "read": ["outer", "after"],
        "dropped": [1, len(b"from the handler")], "corrupt": 0, "pages_called": True,
    }  # fmt: skip


def test_ring_tests_pass_with_the_pure_writer() -> None:
    import subprocess
    import sys

    env = {**os.environ, "SWMP_RING_PURE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_ipc_ring.py",
         "-k", "not bench"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout


@native_only
def test_a_failed_init_gives_its_views_back() -> None:
    """A Writer whose ``__init__`` fails after taking the data buffer's view (here: a control
    buffer too small) releases it, so the mapping can still be closed, and a second
    ``__init__`` on the same object starts clean."""
    from ipc import _ringwrite  # type: ignore[attr-defined]

    mm = mmap.mmap(-1, L.CONTROL_SIZE + CAP)
    control = memoryview(mm)[: L.CONTROL_SIZE]
    data = memoryview(mm)[L.CONTROL_SIZE :]
    status = bytearray(L.STATUS_SIZE)
    writer = _ringwrite.Writer.__new__(_ringwrite.Writer)
    with pytest.raises(ValueError, match="control is too small"):
        writer.__init__(data, control[:8], status, CAP, lambda: None, lambda *a: None)
    writer.__init__(data, control, status, CAP, lambda: None, lambda *a: None)
    del writer
    control.release()
    data.release()
    mm.close()  # BufferError while any view of the mapping is still held
