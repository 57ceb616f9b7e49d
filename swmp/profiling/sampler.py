"""The sampler: one thread per process, alive only while a segment of it is being profiled.

A :class:`Profiled` is one segment under a task: the stack source of the request that runs
it (its thread, its asyncio task or its greenlet), when to sample next, and its sequence.
The request's side calls :meth:`Profiled.stop` when its first span finishes, *before* that
span's end time is taken, under the same lock the sampler holds for a snapshot: so every
snapshot was dumped before the segment's end, and never under another segment's id (the
thread or task goes on to other requests only after the stop).

The thread starts with the first profiled segment and ends once none is left for a second
(``LINGER_S``), so a process with no task, or with a task no request of it matches, has no
sampler thread. It
holds the GIL for the stack walk and the record's serialization only; between samples it
sleeps until the next one is due.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from reporter_proc import records as R
from reporter_proc.taskboard import BoardTask
from swmp import _sink
from swmp.tracing.utf8 import dumps_escaping

log = logging.getLogger("swmp.profiling")

# How long the sampler thread waits for another segment after its last one ended.
LINGER_S = 1.0

StackSource = Callable[[int], list[str]]  # depth -> stack, outermost first ([] = gone)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Profiled:
    """One segment being profiled under one task."""

    __slots__ = (
        "claim",
        "deadline",
        "depth",
        "lock",
        "next_due",
        "segment_id",
        "sequence",
        "source",
        "stopped",
        "task",
        "wake",
    )

    def __init__(
        self,
        task: BoardTask,
        segment_id: str,
        source: StackSource,
        *,
        started_mono: float,
        depth: int,
        max_profile_s: float,
        claim: Callable[[BoardTask], bool] | None = None,
    ) -> None:
        self.task = task
        self.segment_id = segment_id
        self.source = source
        self.depth = depth
        self.sequence = 0
        self.stopped = False
        self.lock = threading.Lock()
        # Nothing is sampled before the request ran for the task's minimum duration, nor
        # before one dump period (a first sample at once would show the agent starting us).
        self.next_due = started_mono + max(task.min_duration_ms, task.dump_period_ms) / 1000
        self.deadline = started_mono + max_profile_s  # SW_AGENT_PROFILE_DURATION
        self.wake: Callable[[], None] | None = None  # set by the sampler that takes it
        # Asked at the first snapshot whether the task's max sampling count has room left: a
        # segment counts only once it ran past the threshold (None: no limit, benchmarks).
        self.claim = claim

    def stop(self) -> None:
        """The segment is ending: no snapshot after this returns."""
        with self.lock:
            self.stopped = True
        wake = self.wake
        if wake is not None:
            wake()  # the sampler forgets us now, and ends if we were its last segment

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's sampler thread may have held :attr:`lock` at the
        fork (it never releases it here), and this segment is the parent's to sample. A new
        lock, stopped, waking nobody: the request's :meth:`stop` returns at once, and no
        snapshot of it is ever dumped from the child."""
        self.lock = threading.Lock()
        self.stopped = True
        self.wake = None

    def sample(self, now_mono: float) -> bool:
        """Dump one snapshot if still running; False once this segment is done with."""
        with self.lock:
            if self.stopped:
                return False
            if now_mono >= self.deadline or _now_ms() >= self.task.end_ms:
                self.stopped = True
                return False
            time_ms = _now_ms()
            stack = self.source(self.depth)
            if not stack:
                return True  # momentarily nothing to show (a task between steps)
            if self.sequence == 0:
                # Counted here, as SkyWalking's ThreadProfiler does (its first dump), not when
                # the segment was admitted: requests that end before the task's threshold must
                # not use up the count, or a stream of fast ones keeps the slow ones out.
                if self.claim is not None and not self.claim(self.task):
                    self.stopped = True  # others took the last places meanwhile
                    return False
                stats.segments += 1
            rec = R.profile_snapshot(
                self.task.task_id, self.segment_id, time_ms=time_ms, sequence=self.sequence, stack=stack
            )
            self.sequence += 1
        try:
            # A code file under a path that is not UTF-8 (surrogateescape): sent escaped.
            payload = dumps_escaping(rec)
        except Exception:  # a stack orjson refuses even escaped: the ring never sees it, so count it here
            _sink.count_unbuilt()
            payload = None
        try:
            written = payload is not None and _sink.get_sink().write(R.PROFILE_SNAPSHOT, payload)
        except Exception:
            written = False
        stats.snapshots += 1 if written else 0
        stats.dropped += 0 if written else 1
        return True


class _Stats:
    __slots__ = ("dropped", "segments", "snapshots", "threads")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.segments = 0  # segments profiled in this process (their first snapshot taken)
        self.snapshots = 0  # snapshots written to the ring
        self.dropped = 0  # snapshots the ring refused
        self.threads = 0  # sampler threads started


stats = _Stats()


class Sampler:
    """Create it in the process that samples, after any monkey-patching (gevent patches
    ``threading`` in the worker, after fork): its lock and event must be that process's kind."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: list[Profiled] = []
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()  # a segment was added or stopped

    def forget_after_fork(self) -> None:
        """In a forked child (one thread, the fork hooks running): the parent's thread did
        not come along, and might have held :attr:`_lock`, the event's lock or a segment's
        lock at the fork. Every segment it had is dropped (see :meth:`Profiled.forget_after_fork`)
        and this sampler is left empty, with new locks; nothing of it is used again."""
        items, self._active = self._active, []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        for p in items:
            p.forget_after_fork()

    def running(self) -> int:
        """Segments being profiled now (SW_AGENT_PROFILE_MAX_PARALLEL bounds it)."""
        return sum(1 for p in self._active if not p.stopped)

    @property
    def thread_alive(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    def try_add(self, item: Profiled, max_parallel: int, admit: Callable[[], bool]) -> bool:
        """Take ``item`` if fewer than ``max_parallel`` segments are profiled and ``admit()``
        (called under the lock: the task's own count) agrees. The thread is started outside
        the lock: under gevent starting it switches greenlets."""
        item.wake = self._wake.set
        with self._lock:
            if self.running() >= max_parallel or not admit():
                return False
            self._active.append(item)
            start = self._thread is None
            if start:
                t = threading.Thread(target=self._run, name="swmp-profile-sampler", daemon=True)
                self._thread = t
                stats.threads += 1
        if start:
            t.start()
        else:
            self._wake.set()
        return True

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:
            log.exception("swmp: the profile sampler failed; profiling stops in this process")
            with self._lock:
                for p in self._active:
                    p.stop()
                self._active = []
                self._thread = None

    def _loop(self) -> None:
        idle_since = 0.0
        while True:
            with self._lock:
                self._active = items = [p for p in self._active if not p.stopped]
                if not items:
                    now = time.monotonic()
                    idle_since = idle_since or now
                    if now - idle_since >= LINGER_S:
                        self._thread = None  # the next profiled segment starts a new thread
                        return
            if not items:
                # Requests of a task come in runs: waiting a moment for the next one saves a
                # thread start per request; an idle moment later the thread is gone.
                self._wake.wait(LINGER_S)
                self._wake.clear()
                continue
            idle_since = 0.0
            self._wake.clear()
            wake = self.sample_due(items, time.monotonic())
            self._wake.wait(max(0.001, wake - time.monotonic()))

    @staticmethod
    def sample_due(items: list[Profiled], now: float) -> float:
        """Dump the segments whose next sample is due at ``now`` (monotonic seconds); returns
        when the next one is due. Apart from the loop so tests can drive it with their clock."""
        for p in items:
            if now >= p.next_due and p.sample(now):
                p.next_due = now + p.task.dump_period_ms / 1000
        return min(p.next_due for p in items)
