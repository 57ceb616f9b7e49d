"""reporter_proc.timeouts.limited: the reporter's time limit on a send, which never loses a
cancellation (Python 3.11's asyncio.wait_for does when the cancel arrives in the loop
iteration where the awaited call completes). Both implementations are tested on whatever
Python runs the tests: asyncio.timeout (3.11+) and the asyncio.wait fallback (3.10)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from reporter_proc.timeouts import limited, limited_by_wait

Limit = Callable[[Awaitable[Any], float], Awaitable[Any]]
IMPLEMENTATIONS = [pytest.param(limited, id="limited"), pytest.param(limited_by_wait, id="fallback")]


@pytest.mark.parametrize("limit", IMPLEMENTATIONS)
def test_a_cancel_in_the_iteration_the_call_completes_is_raised(limit: Limit) -> None:
    async def main() -> tuple[asyncio.Task[Any], list[str]]:
        loop = asyncio.get_running_loop()
        entered: asyncio.Future[None] = loop.create_future()
        gate: asyncio.Future[str] = loop.create_future()
        after: list[str] = []

        async def call() -> str:
            entered.set_result(None)
            return await gate

        async def caller() -> None:
            after.append(await limit(call(), 60.0))  # reached only if the cancel was lost

        task = asyncio.create_task(caller())
        await entered
        gate.set_result("sent")
        task.cancel()
        await asyncio.wait({task})  # ends either way: caller() has nothing more to wait for
        return task, after

    task, after = asyncio.run(main())
    assert task.cancelled() and after == []


def test_python_3_11_wait_for_loses_that_cancel() -> None:
    """The defect itself, so the test above is known to set up the race it guards against."""
    import sys

    if sys.version_info >= (3, 12):
        pytest.skip("wait_for is built on asyncio.timeout from 3.12")
    with pytest.raises(AssertionError):
        test_a_cancel_in_the_iteration_the_call_completes_is_raised(asyncio.wait_for)


@pytest.mark.parametrize("limit", IMPLEMENTATIONS)
def test_result_exception_and_timeout(limit: Limit) -> None:
    async def value() -> int:
        await asyncio.sleep(0)
        return 7

    async def fails() -> None:
        await asyncio.sleep(0)
        raise OSError("down")

    cancelled: list[bool] = []

    async def hangs() -> None:
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main() -> None:
        assert await limit(value(), 60.0) == 7
        with pytest.raises(OSError, match="down"):
            await limit(fails(), 60.0)
        with pytest.raises(asyncio.TimeoutError):
            await limit(hangs(), 0.0)  # the deadline has passed: no wait on the clock

    asyncio.run(main())
    assert cancelled == [True]  # the timed-out call was cancelled, not left running


def test_the_reporter_has_no_wait_for_left() -> None:
    """Every time limit in reporter_proc goes through limited() (generated gRPC stubs aside)."""
    root = Path(__file__).resolve().parent.parent / "reporter_proc"
    found = [
        f"{path.relative_to(root)}:{n}"
        for path in root.rglob("*.py")
        if "generated" not in path.parts and path.name != "timeouts.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bwait_for\(", line)
    ]
    assert found == []
