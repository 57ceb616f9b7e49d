"""The profiling task table: what the reporter posts on the arena's board for the workers.

The second contract between the two sides (``records`` is the first, for what workers
write): the reporter learns profile tasks from the OAP and posts the ones not yet over; a
worker reads them when the board's generation changes. Standard library and orjson only,
so a worker pays nothing for importing it.

Document: an orjson array of tasks, each positional::

    [task_id, endpoint, start_ms(int), end_ms(int), min_duration_ms(int),
     dump_period_ms(int), max_sampling_count(int)]

A worker decides by itself, with its own clock, whether a task is active now
(``start_ms <= now < end_ms``): the reporter posts a task once, not at its start and end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

T_ID: Final = 0
T_ENDPOINT: Final = 1
T_START: Final = 2
T_END: Final = 3
T_MIN_DURATION: Final = 4
T_DUMP_PERIOD: Final = 5
T_MAX_SAMPLING: Final = 6
T_LEN: Final = 7

# The OAP accepts no dump period below 10 ms (its UI offers 10, 20, 50, 100 ms); a task
# claiming less is sampled at 10 ms, which keeps a garbled task from spinning the sampler.
MIN_DUMP_PERIOD_MS: Final = 10

# A task's duration, in minutes: the OAP creates no task of less than 1 or more than 15
# (ProfileConstants; SkyWalking's Java agent checks the same bounds). The reporter refuses a
# command outside them (``profile_tasks``); SW_AGENT_PROFILE_DURATION, the longest sampling
# of one segment, is held to them too (a segment outlives no task).
MIN_DURATION_MIN: Final = 1
MAX_DURATION_MIN: Final = 15


@dataclass(frozen=True)
class BoardTask:
    task_id: str
    endpoint: str
    start_ms: int
    end_ms: int
    min_duration_ms: int
    dump_period_ms: int
    max_sampling_count: int

    def active(self, now_ms: int) -> bool:
        return self.start_ms <= now_ms < self.end_ms

    def to_list(self) -> list[Any]:
        return [
            self.task_id,
            self.endpoint,
            self.start_ms,
            self.end_ms,
            self.min_duration_ms,
            self.dump_period_ms,
            self.max_sampling_count,
        ]


def encode(tasks: list[BoardTask]) -> bytes:
    return orjson.dumps([t.to_list() for t in tasks])


def decode(document: bytes) -> list[BoardTask]:
    """The tasks of a board document; entries that do not fit the layout are skipped."""
    if not document:
        return []
    raw = orjson.loads(document)
    out = []
    for t in raw if isinstance(raw, list) else ():
        if not isinstance(t, list) or len(t) < T_LEN:
            continue
        try:
            out.append(
                BoardTask(
                    str(t[T_ID]),
                    str(t[T_ENDPOINT]),
                    int(t[T_START]),
                    int(t[T_END]),
                    max(0, int(t[T_MIN_DURATION])),
                    max(MIN_DUMP_PERIOD_MS, int(t[T_DUMP_PERIOD])),
                    max(0, int(t[T_MAX_SAMPLING])),
                )
            )
        except (TypeError, ValueError):
            continue
    return out
