"""A write into a ring from inside a write of the same thread (a Python signal handler that
logs, run between two bytecodes of the write); prints what happened as JSON.

Run by tests/test_ipc_ring_native.py in a subprocess (a writer that waits for its own lock
hangs it): ``python tests/ring_reentry.py native|pure``. The outer write takes its slow
path (the first record does), whose page returner (a stand-in here) raises SIGUSR1 there;
the handler writes to the same ring.
"""

from __future__ import annotations

import json
import mmap
import signal
import sys
from typing import Any

from ipc import _layout as L
from ipc import ring_writer
from ipc.ring_reader import RingReader

CAP = 4096


class RaisingPages:
    """A page returner that raises SIGUSR1 the first time the slow path calls it."""

    stretch = CAP

    def __init__(self) -> None:
        self.armed = True

    def __call__(self, tail: int, head: int) -> None:
        if self.armed:
            self.armed = False
            signal.raise_signal(signal.SIGUSR1)  # its Python handler runs before this returns


def main(native: bool) -> dict[str, Any]:
    mm = mmap.mmap(-1, L.CONTROL_SIZE + CAP)
    status = memoryview(bytearray(L.STATUS_SIZE)).cast("Q")
    control = memoryview(mm)[: L.CONTROL_SIZE].cast("Q")
    data = memoryview(mm)[L.CONTROL_SIZE :]
    pages: Any = RaisingPages()
    write = ring_writer._make_write(
        0, control=control, data=data, status=status, wake=None, cap=CAP, pages=pages, native=native
    )
    inner: list[bool] = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: inner.append(write(1, b"from the handler")))
    outer = write(1, b"outer")
    after = write(1, b"after")
    reader = RingReader(0, control, data, mapping=mm, base=L.CONTROL_SIZE)
    read = [bytes(p).decode() for _t, p in reader.read(10)]
    reader.commit()
    return {
        "outer": outer,
        "inner": inner,
        "after": after,
        "read": read,
        "dropped": [int(control[L.C_DROPPED_RECORDS]), int(control[L.C_DROPPED_BYTES])],
        "corrupt": int(control[L.C_CORRUPT]),
        "pages_called": not pages.armed,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] == "native")))
