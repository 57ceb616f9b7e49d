"""A call with the agent's part and the same call without it, timed call by call in ABBA
order: both see the caches as the previous call left them, and drift of the machine hits
both alike (timing whole rounds of each mode moved by microseconds from run to run)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

Op = Callable[[], Any]


def alternate(
    plain: Op,
    traced: Op,
    pairs: int,
    *,
    clock: Callable[[], int] = time.perf_counter_ns,
    before: Callable[[int], None] | None = None,
    between: Callable[[int], None] | None = None,
) -> tuple[list[int], list[int]]:
    """``pairs`` calls of each, ``plain`` first in odd pairs and ``traced`` first in even
    ones; ``before(i)`` runs untimed before each call, ``between(i)`` after each pair. The
    per-call times (in ``clock`` units) of each, in the order they ran."""
    p: list[int] = []
    t: list[int] = []
    order = ((plain, p), (traced, t))
    for i in range(pairs):
        for fn, times in order if i & 1 else order[::-1]:
            if before is not None:
                before(i)
            t0 = clock()
            fn()
            times.append(clock() - t0)
        if between is not None:
            between(i)
    return p, t
