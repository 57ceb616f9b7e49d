"""``SW_SAMPLE_N_PER_3_SECS``: at most N new traces per 3-second window, per process.

No background thread (the peer agent runs one per process to reset its counter): the window
is rolled lazily by the first decision after it expires. Only traces that start here are
sampled; a request carrying an ``sw8`` header follows its caller's decision, as in the
SkyWalking agents, so a trace is never cut in the middle.
"""

from __future__ import annotations

import time

WINDOW_S = 3.0


class Sampler:
    __slots__ = ("_count", "_window_end", "n")

    def __init__(self, n: int = 0) -> None:
        self.n = n
        self._count = 0
        self._window_end = 0.0

    def allow(self) -> bool:
        n = self.n
        if n <= 0:
            return True
        now = time.monotonic()
        if now >= self._window_end:
            self._window_end = now + WINDOW_S
            self._count = 0
        if self._count < n:
            self._count += 1
            return True
        return False


sampler = Sampler()
