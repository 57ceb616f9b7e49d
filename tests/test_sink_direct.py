"""The native span core writes a segment around ``ProcessSink.write`` when that would only
hand it to the ring writer (``_spancore.set_direct_sink``; swmp/_sink.py), and through it in
every other case: the first write (which claims the ring), a process whose pid the sink has
not seen (a fork), a sink without a ring, a subclass with its own ``write``.

Real arenas in a temporary directory, real forks; Python calls of ``write`` counted with
``sys.setprofile``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import orjson
import pytest

from ipc import Arena
from reporter_proc import records as R
from swmp import _runtime, _sink, lifecycle, tracing
from swmp._arena_sink import ArenaSink
from swmp.config import load
from swmp.tracing.context import new_entry_span
from swmp.tracing.identity import identity
from swmp.tracing.span import NATIVE

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native span core is not built")


@pytest.fixture
def arena(tmp_path: Path) -> Iterator[Arena]:
    before = (identity.service, identity.instance)
    tracing.configure(load({}, agent_log_reporter_active=False, agent_meter_reporter_active=False))
    a = Arena.create(str(tmp_path / "t.arena"), slots=4, ring_capacity=1 << 16)
    yield a
    _sink.set_sink(None)
    a.close()
    identity.set(*before)


def sink_for(arena: Arena) -> ArenaSink:
    # owner_pid: our parent, so this process is never taken for a prefork master.
    return ArenaSink(arena, "svc", "base", owner_pid=os.getppid())


def python_writes(ops: list[str]) -> int:
    """Trace one request per name in ``ops``; how many times a sink's Python ``write`` ran."""
    calls = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal calls
        code = frame.f_code
        if event == "call" and code.co_name == "write" and code.co_filename in (_runtime.__file__, __file__):
            calls += 1

    sys.setprofile(profile)
    try:
        for op in ops:
            with new_entry_span(op):
                pass
    finally:
        sys.setprofile(None)
    return calls


def operations(arena: Arena, slot: int) -> list[str]:
    out = []
    for rtype, payload in arena.reader(slot).read(1000):
        if rtype == R.SEGMENT:
            out.append(orjson.loads(payload)[R.SEG_SPANS][0][R.SPAN_OPERATION])
    return out


def test_once_bound_segments_go_straight_to_the_ring(arena: Arena) -> None:
    sink = sink_for(arena)
    _sink.set_sink(sink)
    ops = [f"/op{i}" for i in range(6)]
    assert python_writes(ops) == 1  # the first claims the ring and names the process
    assert sink.slot == 0
    assert operations(arena, 0) == ops  # all of them, in order, stamped with the name
    assert python_writes(["/more"]) == 0
    assert operations(arena, 0)[-1:] == ["/more"]


def test_a_sink_without_a_ring_is_asked_every_time(arena: Arena) -> None:
    sink = sink_for(arena)
    _sink.set_sink(sink)
    python_writes(["/claim"])
    writer = sink._writer
    sink._writer = None  # as a process that found no free slot has it
    try:
        assert python_writes(["/a", "/b"]) == 2
    finally:
        sink._writer = writer


def test_a_subclass_with_its_own_write_is_always_called(arena: Arena) -> None:
    seen: list[int] = []

    class Counting(ArenaSink):
        def write(self, rtype: int, payload: bytes) -> bool:
            seen.append(rtype)
            return super().write(rtype, payload)

    sink = Counting(arena, "svc", "base", owner_pid=os.getppid())
    _sink.set_sink(sink)
    assert python_writes(["/a", "/b", "/c"]) >= 3
    assert seen.count(R.SEGMENT) == 3
    assert operations(arena, 0) == ["/a", "/b", "/c"]


def test_a_forked_child_is_noticed_by_write_then_goes_straight(arena: Arena) -> None:
    sink = sink_for(arena)
    _sink.set_sink(sink)
    python_writes(["/parent"])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            lifecycle.declare_server_worker()  # a worker, as a server's hook says
            calls = python_writes(["/c1", "/c2", "/c3"])
            os.write(w, f"{calls} {sink.slot}".encode())
        finally:
            os._exit(0)
    os.close(w)
    answer = os.read(r, 100).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert answer == "1 1"  # one write call (the child's claim), then around it; its own slot
    assert operations(arena, 1) == ["/c1", "/c2", "/c3"]
    assert python_writes(["/parent again"]) == 0  # the parent is still bound to slot 0
    assert operations(arena, 0) == ["/parent", "/parent again"]


def test_a_writer_whose_write_was_replaced_is_called_as_it_is_now(arena: Arena) -> None:
    """The direct path calls the ring writer's ``write`` slot as it is at each segment: the
    native Writer's method while the slot is the process's, the refusing function once the
    writer was disabled (its slot released), whose drop is counted as the span core's."""
    sink = sink_for(arena)
    _sink.set_sink(sink)
    python_writes(["/claim"])
    writer = sink._writer
    assert writer is not None
    before = tracing.stats.segments_dropped
    assert python_writes(["/kept"]) == 0 and operations(arena, 0) == ["/claim", "/kept"]
    writer._disable("released its slot")
    refuse, asked = writer.write, []

    def counted(rtype: int, payload: bytes) -> bool:
        asked.append(rtype)
        return refuse(rtype, payload)

    writer.write = counted
    python_writes(["/refused"])
    assert asked == [R.SEGMENT]
    assert operations(arena, 0) == ["/claim", "/kept"]  # nothing more went in
    assert tracing.stats.segments_dropped == before + 1


def test_a_full_ring_drops_through_the_direct_path_and_counts(arena: Arena) -> None:
    """The native writer's answer (False: the ring is full) is taken as a drop."""
    sink = sink_for(arena)
    _sink.set_sink(sink)
    python_writes(["/claim"])
    before = tracing.stats.segments_dropped
    written = 0
    while tracing.stats.segments_dropped == before:
        python_writes([f"/fill{written}"])
        written += 1
        assert written < 10_000, "a 64 KiB ring never filled"
    assert arena.ring_stats(0).dropped_records >= 1
    assert len(operations(arena, 0)) == written  # the claim and all but the dropped one


@pytest.mark.parametrize("before", [0, 41, 2**30, 2**63 - 2, 2**63 - 1, 2**64, -1])
def test_the_written_count_goes_up_by_one_from_any_int(arena: Arena, before: int) -> None:
    """The native emit adds one to ``stats.segments_written`` in C while it fits a C integer
    and as Python adds otherwise: the same ints either way."""
    _sink.set_sink(sink_for(arena))
    python_writes(["/claim"])
    kept = tracing.stats.segments_written
    tracing.stats.segments_written = before
    try:
        python_writes(["/counted"])
        assert tracing.stats.segments_written == before + 1
        assert type(tracing.stats.segments_written) is int
    finally:
        tracing.stats.segments_written = kept
