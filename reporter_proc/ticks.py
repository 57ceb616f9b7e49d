"""One clock for the reporter's periodic work: every timer wakes on a shared grid.

Why: a wake-up of an otherwise idle process costs 100-300 us of CPU on a virtual machine
(the epoll return, a turn of the event loop, cold caches), however little it then does.
The reporter has several periodic jobs (the intake's pass, the status heartbeat, instance
keep-alives, profile-task polls, spool replay checks). Each sleeping for its own interval
from its own start, they woke separately: 7.5 times a second in an idle application,
measured. Sleeping until the next multiple of the period on the event loop's clock instead
makes jobs whose periods divide each other fire in the same turn of the loop: an idle
reporter wakes once a second.
"""

from __future__ import annotations

import asyncio
import math

__all__ = ["IDLE_CHECK_S", "next_tick", "sleep_until", "until_next_tick"]

# The period of checks that need no promptness (is there a spool file to replay?).
IDLE_CHECK_S = 1.0


def next_tick(now: float, period: float) -> float:
    """The first multiple of ``period`` after ``now`` (the same float for every caller)."""
    return (math.floor(now / period) + 1) * period


async def sleep_until(when: float) -> None:
    """Sleep until ``when`` on the running loop's clock.

    A timer at ``when`` itself (``call_at``), not ``asyncio.sleep(when - now)``: the relative
    form reads the clock twice, so two jobs waiting for the same tick got deadlines apart by
    however long each was preempted between the reads, and under load woke in separate
    turns of the loop (separate wake-ups), defeating the shared grid."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    timer = loop.call_at(when, _wake, done)
    try:
        await done
    finally:
        timer.cancel()


def _wake(done: asyncio.Future[None]) -> None:
    if not done.done():  # cancelled while the timer was already due
        done.set_result(None)


async def until_next_tick(period: float) -> None:
    """Sleep until the next multiple of ``period`` on the running loop's clock."""
    await sleep_until(next_tick(asyncio.get_running_loop().time(), period))
