"""A time limit on an await that never loses a cancellation: the reporter's ``wait_for``.

``asyncio.wait_for`` before Python 3.12 runs the awaitable as a task of its own and waits
for it; when the waiting task is cancelled in the loop iteration where that inner task
finishes, wait_for sees it finished and returns its result: the cancellation is swallowed
(CPython gh-86296, fixed in 3.12 by building wait_for on ``asyncio.timeout``). The reporter
cancels its tasks at stop (the sender tasks, the keeper, the spool replayer) and each wraps
its sends in a time limit; a swallowed cancel let a task carry on to its next round (a
replayer to its next one-second tick, a sender to its next retry) and delayed the stop.

:func:`limited` is ``asyncio.timeout`` where there is one (3.11+: the awaitable runs in the
calling task, so a cancel is delivered to it like any other), and on 3.10 an
``asyncio.wait`` on the awaitable's own task, which raises a cancellation instead of
looking at the task first.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["limited"]

T = TypeVar("T")


async def limited(aw: Awaitable[T], timeout: float) -> T:
    """``await aw``, raising ``asyncio.TimeoutError`` after ``timeout`` seconds (the awaitable
    is then cancelled); a cancellation of the caller is always raised."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await aw
    return await limited_by_wait(aw, timeout)  # pragma: no cover (Python 3.10)


async def limited_by_wait(aw: Awaitable[T], timeout: float) -> T:
    """:func:`limited` without ``asyncio.timeout`` (Python 3.10; tested on every version)."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        await _cancel_and_wait(task)
        raise
    if not done:
        await _cancel_and_wait(task)
        raise asyncio.TimeoutError
    return task.result()


async def _cancel_and_wait(task: asyncio.Future[T]) -> None:
    """Cancel ``task`` and wait until it has ended (it may clean up), without consuming its
    outcome as ours: a cancellation of the caller during that wait is raised."""
    if task.done():
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" warning
        return
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()
