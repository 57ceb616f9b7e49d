"""Forked children for the tests of real processes: run a function in one, reap it with a bound.

A child that raises prints its traceback and exits 1; one still running after the bound is
killed and the test fails. Use ``assert reap(fork(fn)) == 0``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable


def fork(fn: Callable[[], object]) -> int:
    """Run ``fn`` in a forked child (which exits 0, or 1 if ``fn`` raised); its pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            fn()
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    return pid


def reap(pid: int, timeout: float = 30.0) -> int:
    """The child's exit code (``-N`` if signal N ended it); AssertionError if it outlives ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"process {pid} did not finish")
