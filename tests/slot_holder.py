"""A real second process that holds an arena's slot until told to let it go."""

from __future__ import annotations

import os

from ipc import Arena


class SlotHolder:
    """Forks a child that claims the lowest free slot of ``arena`` and keeps it until
    :meth:`release` (or the end of the ``with`` block); the kernel frees it as the child exits."""

    def __init__(self, arena: Arena) -> None:
        self._ready_r, self._ready_w = os.pipe()
        self._go_r, self._go_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                arena.claim_slot()
                os.write(self._ready_w, b"1")
                os.read(self._go_r, 1)
            finally:
                os._exit(0)
        assert os.read(self._ready_r, 1) == b"1"

    def release(self) -> None:
        """Let the child exit (its slot is free once this returns)."""
        if self.pid:
            os.write(self._go_w, b"x")
            os.waitpid(self.pid, 0)
            self.pid = 0
            for fd in (self._ready_r, self._ready_w, self._go_r, self._go_w):
                os.close(fd)

    def __enter__(self) -> SlotHolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
