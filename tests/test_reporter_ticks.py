"""The reporter's shared tick grid (reporter_proc/ticks.py) and what it buys: an idle
reporter wakes about once a second, not once per periodic job."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ipc import Arena
from reporter_proc import records as R
from reporter_proc.process import ReporterThread
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from reporter_proc.ticks import next_tick, until_next_tick
from tests.test_reporter_helpers import segment, wait_for, write_all


def test_next_tick_is_the_same_multiple_for_every_caller_within_a_period() -> None:
    assert next_tick(10.0, 1.0) == 11.0  # on a tick: the next one, never now
    assert next_tick(10.2, 1.0) == next_tick(10.9, 1.0) == 11.0
    assert next_tick(10.2, 0.25) == 10.25
    # Periods that divide each other meet: every 1 s tick is also a 0.25 s tick.
    assert next_tick(10.8, 0.25) == next_tick(10.3, 1.0) == 11.0


def test_jobs_with_dividing_periods_wake_in_the_same_turn_of_the_loop() -> None:
    async def scenario() -> list[tuple[str, int]]:
        loop = asyncio.get_running_loop()
        turns = 0
        woke: list[tuple[str, int]] = []

        def count_turns() -> None:  # re-armed every turn: counts the loop's iterations
            nonlocal turns
            turns += 1
            loop.call_soon(count_turns)

        async def job(name: str, period: float, times: int) -> None:
            for _ in range(times):
                await until_next_tick(period)
                woke.append((name, turns))

        await until_next_tick(0.2)  # start just after a shared tick
        loop.call_soon(count_turns)
        await asyncio.gather(job("fast", 0.05, 4), job("slow", 0.2, 1))
        return woke

    woke = asyncio.run(scenario())
    slow_turn = next(t for name, t in woke if name == "slow")
    # The fourth 0.05 s tick is the 0.2 s tick: both jobs ran in the same iteration.
    assert ("fast", slow_turn) in woke


def _voluntary_switches(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def test_an_idle_reporter_wakes_about_once_a_second(tmp_path: Any) -> None:
    """Default periods, spool on (its replayer used to look for files 5 times a second):
    the reporter thread's wake-ups are counted by the kernel (voluntary context switches),
    a count of what it does, not a timing. Before the shared ticks: ~7.5 a second."""
    arena = Arena.create(str(tmp_path / "idle.arena"), slots=4, ring_capacity=64 * 1024)
    settings = ReporterSettings(service="idle", spool_dir=str(tmp_path / "spool"))
    sender = MemorySender()
    handle = ReporterThread(arena.path, settings, arena=arena, sender=sender)
    handle.start()
    try:
        wait_for(lambda: handle.reporter is not None and handle.reporter.ready, 5, "reporter ready")
        write_all(arena.path, [(R.SEGMENT, segment("t-0"))])
        wait_for(lambda: len(sender.segments) == 1, 5, "the record sent on the next tick")
        native_id = handle._thread.native_id
        assert native_id is not None
        before, t0 = _voluntary_switches(native_id), time.monotonic()
        time.sleep(4.0)
        rate = (_voluntary_switches(native_id) - before) / (time.monotonic() - t0)
        assert rate < 3.0, f"{rate:.1f} wake-ups a second"
    finally:
        assert handle.stop(10)
        arena.close()
