"""One clock for the reporter's periodic work: every timer wakes on a shared grid.

Why: a wake-up of an otherwise idle process costs 100-300 us of CPU on a virtual machine
(the epoll return, a turn of the event loop, cold caches), however little it then does.
The reporter has several periodic jobs (the intake's pass, the status heartbeat, instance
keep-alives, profile-task polls, spool replay checks). Each sleeping for its own interval
from its own start, they woke separately: 7.5 times a second in an idle application,
measured. Sleeping until the next multiple of the period on the event loop's clock instead
makes jobs whose periods divide each other fire in the same turn of the loop: an idle
reporter wakes once a second.

Jobs due at the same instant also share one timer (:func:`wake_at`): the event loop's
timer for each of them (its handle, heap push and pop, cancel) was ~15 Python calls a job
per tick, a fifth of an idle tick's calls once the rings were scanned cheaply.
"""

from __future__ import annotations

import asyncio
import math
import threading
import weakref

__all__ = ["IDLE_CHECK_S", "forget_wake", "next_tick", "sleep_until", "until_next_tick", "wake_at"]

# The period of checks that need no promptness (is there a spool file to replay?).
IDLE_CHECK_S = 1.0


def next_tick(now: float, period: float) -> float:
    """The first multiple of ``period`` after ``now`` (the same float for every caller)."""
    return (math.floor(now / period) + 1) * period


class _Due:
    """The futures resolved at one deadline of one loop, and the loop's timer for them."""

    __slots__ = ("timer", "waiters")

    def __init__(self, timer: asyncio.TimerHandle | None, waiter: asyncio.Future[None]) -> None:
        self.timer = timer
        self.waiters = [waiter]


# Per loop: {deadline: _Due}. Used on the loop's own thread only (the reporter thread and an
# application's loop are different loops); the lock covers adding a loop's table.
_Table = dict[float, _Due]
_tables: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Table] = weakref.WeakKeyDictionary()
_tables_lock = threading.Lock()


def wake_at(when: float, fut: asyncio.Future[None]) -> None:
    """Resolve ``fut`` (with None, unless it is done by then) at ``when`` on its loop's
    clock, with the timer of every other future due at the same ``when``. A future that
    stops waiting before (resolved by someone else, cancelled) must be given to
    :func:`forget_wake`, or the timer stays armed for it."""
    loop = fut.get_loop()
    table = _tables.get(loop)
    if table is None:
        with _tables_lock:
            table = _tables.setdefault(loop, {})
    due = table.get(when)
    if due is None:
        due = table[when] = _Due(None, fut)
        due.timer = loop.call_at(when, _fire, table, when)
    else:
        due.waiters.append(fut)


def forget_wake(when: float, fut: asyncio.Future[None]) -> None:
    """``fut`` no longer waits for ``when`` (nothing to do once its timer fired)."""
    table = _tables.get(fut.get_loop())
    due = table.get(when) if table is not None else None
    if table is None or due is None or fut not in due.waiters:
        return
    due.waiters.remove(fut)
    if not due.waiters:  # the last one: no timer for nobody
        del table[when]
        if due.timer is not None:
            due.timer.cancel()


def _fire(table: _Table, when: float) -> None:
    due = table.pop(when, None)
    if due is not None:
        for fut in due.waiters:
            if not fut.done():  # cancelled while the timer was already due
                fut.set_result(None)


async def sleep_until(when: float) -> None:
    """Sleep until ``when`` on the running loop's clock.

    A timer at ``when`` itself (``call_at``, shared: :func:`wake_at`), not
    ``asyncio.sleep(when - now)``: the relative form reads the clock twice, so two jobs
    waiting for the same tick got deadlines apart by however long each was preempted
    between the reads, and under load woke in separate turns of the loop (separate
    wake-ups), defeating the shared grid."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wake_at(when, done)
    try:
        await done
    finally:
        if not done.done() or done.cancelled():  # not woken by the timer: it may be armed still
            forget_wake(when, done)


async def until_next_tick(period: float) -> None:
    """Sleep until the next multiple of ``period`` on the running loop's clock."""
    await sleep_until(next_tick(asyncio.get_running_loop().time(), period))
