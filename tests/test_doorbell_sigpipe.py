"""The doorbell never kills a worker with SIGPIPE when the reporter (its reader) is gone.

Some servers set SIGPIPE back to SIG_DFL; a write into a FIFO whose last reader died then
kills the writer instead of failing with EPIPE. The check runs in a forked child that does
exactly that, with a real listener process that is killed between two rings.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ipc.wakeup import Doorbell, create_fifo, fifo_path

LISTENER = """
import sys, time
from ipc.wakeup import DoorbellListener
listener = DoorbellListener(sys.argv[1])
print("ready", flush=True)
time.sleep(60)
"""


def _ring_across_reader_death(arena_path: str) -> int:
    """In a child with SIGPIPE at SIG_DFL: ring, let the reader die, ring again. Exit status."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            listener = subprocess.Popen(
                [sys.executable, "-c", LISTENER, arena_path],
                stdout=subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": os.getcwd()},
            )
            assert listener.stdout is not None
            assert listener.stdout.readline().strip() == b"ready"
            bell = Doorbell(arena_path)
            bell()  # opens the FIFO while the reader is alive
            listener.kill()
            listener.wait()
            for _ in range(100_000):  # far more than a pipe buffer holds
                bell()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def test_a_doorbell_without_reader_never_raises_sigpipe(tmp_path: Path) -> None:
    arena_path = str(tmp_path / "x.arena")
    create_fifo(arena_path)
    status = _ring_across_reader_death(arena_path)
    assert os.WIFEXITED(status), f"the worker was killed by signal {os.WTERMSIG(status)}"
    assert os.WEXITSTATUS(status) == 0
    assert Path(fifo_path(arena_path)).exists()
