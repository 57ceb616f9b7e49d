"""The per-request check: does this new segment match an active profile task?

Called by the tracing core for the first span of every recorded segment (and again when
that span is renamed), so the common case must cost almost nothing: with a board attached,
one load of its generation word and one comparison; only when the reporter posted a new
table is it read and decoded again. Without tasks for this process's endpoints, nothing
else runs.

A match starts watching the segment when every limit allows it: the task is active now
(its start and duration, on this process's clock), fewer than ``max_sampling_count``
segments were profiled for it in this process (each worker is an instance of its own, and
the OAP's limit is per instance), and fewer than ``SW_AGENT_PROFILE_MAX_PARALLEL``
segments are being watched at this moment. As in SkyWalking's Java agent, a segment counts
towards ``max_sampling_count`` only when its first snapshot is taken, once the request ran
past the task's threshold: a request that ends before it leaves the count as it was, and a
segment that reaches its first snapshot after others took the last places is not sampled.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from functools import partial
from typing import Any

from ipc import Board
from ipc.board import GENERATION
from reporter_proc import taskboard
from reporter_proc.taskboard import BoardTask
from swmp.profiling import stacks
from swmp.profiling.sampler import Profiled, Sampler, StackSource, stats

log = logging.getLogger("swmp.profiling")


class Gate:
    """The board is attached and detached by other threads than the requests' (the sink's
    bind, the agent's stop, which then closes the arena and releases the board's views): a
    request reads ``board`` once, handles a board released under it (ValueError: the views
    are Python memoryviews over the mapping, which cannot be unmapped while one of them is
    out, so nothing is ever read from freed memory) and keeps what it read only if that
    board is still the attached one. No lock: :meth:`attach` sets ``board`` first and
    clears the table after, a refresh installs its table first and checks ``board`` after,
    so whatever the interleaving a detached gate ends with no table (a lock there could be
    taken again by a stop called from a signal handler, and block)."""

    # ``board`` in a slot: the native entry span reads it on every request and consumed
    # message through a slot cache (attrcache.c), which reads a slot where it lies; from the
    # instance's dict it took a full attribute look-up (~300 instructions). The rest stays
    # in the dict (tests put methods of their own on the instance).
    __slots__ = ("__dict__", "board")

    def __init__(self) -> None:
        self.board: Board | None = None  # None: nothing to check (no agent, master, stopped)
        self.seen = -1  # the generation last read
        # endpoint -> its tasks, by start time: the OAP refuses tasks of one service whose times
        # overlap, not a task scheduled after the running one, so both can be on the board.
        self.by_endpoint: dict[str, tuple[BoardTask, ...]] = {}
        # task id -> segments of it this process profiled (first snapshot taken). The sampler
        # thread counts under the lock; the gate only reads it (a dict read, atomic).
        self.started: dict[str, int] = {}
        self._count_lock = threading.Lock()
        # Created on the first match in a process (see Sampler: after gevent's patching).
        self.sampler: Sampler | None = None
        self._made: dict[str, Sampler] = {}
        self.max_parallel = 5
        self.depth = 500
        self.max_profile_s = 600.0

    def configure(self, *, max_parallel: int, depth: int, duration_min: float) -> None:
        self.max_parallel = max(1, max_parallel)
        self.depth = max(1, depth)
        self.max_profile_s = max(1.0, duration_min * 60)

    def attach(self, board: Board | None) -> None:
        self.board = board  # first: see the class doc
        self.seen = -1
        self.by_endpoint = {}

    def reset_after_fork(self) -> None:
        """A new process: no board yet, no counts, and no sampler thread (threads do not fork).

        The parent's segments are dropped here: a request that forks while it is profiled
        (``subprocess`` with ``preexec_fn``, a ``multiprocessing`` fork, ``os.fork``) may go
        on in the child and end its span there, whose ``Profiled.stop`` takes the segment's
        lock, which the parent's sampler thread may have held at the fork."""
        self.attach(None)
        self.started = {}
        self._count_lock = threading.Lock()  # another thread may have held it at the fork
        for sampler in {id(s): s for s in (self.sampler, *self._made.values()) if s is not None}.values():
            sampler.forget_after_fork()
        self.sampler = None  # the parent's thread did not come along
        self._made = {}
        stats.reset()  # this process's counts

    @property
    def sampler_alive(self) -> bool:
        return self.sampler is not None and self.sampler.thread_alive

    def _sampler(self) -> Sampler:
        sampler = self.sampler
        if sampler is None:
            # setdefault is atomic under the GIL: two first matches at once share one sampler
            sampler = self.sampler = self._made.setdefault("sampler", Sampler())
        return sampler

    # -- the hot path ------------------------------------------------------------------------
    def first_span(self, span: Any) -> None:
        board = self.board  # once: the agent may be stopping on another thread
        if board is None:
            return
        try:
            if board.words[GENERATION] != self.seen:
                self._refresh(board)
        except ValueError:  # the arena was closed under us (the agent is stopping)
            self._detach(board)
            return
        if self.by_endpoint:
            self.consider(span)

    def _refresh(self, board: Board) -> None:
        """Read ``board``'s tasks (ValueError once its views are released)."""
        got = board.read()
        if got is None:
            return  # mid-update for too long: try again on the next segment
        gen, doc = got
        try:
            tasks = taskboard.decode(doc)
        except Exception:
            tasks = None
            log.error("swmp: the profile task board is unreadable; profiling is off until it changes")
        self.by_endpoint = by_endpoint(tasks or [])
        self.seen = gen
        if self.board is not board:  # after: see the class doc
            # Detached (the agent stopped) or another board attached meanwhile: what was
            # read is not this gate's; nothing read, as after attach().
            self.by_endpoint = {}
            self.seen = -1
            return
        if tasks is not None:
            self._forget_counts({t.task_id for t in tasks})

    def _detach(self, board: Board) -> None:
        """Detach ``board`` if it is still the one attached (not a board attached since)."""
        if self.board is board:
            self.attach(None)

    def _forget_counts(self, on_board: set[str]) -> None:
        """Drop the counts of tasks the reporter took off the board (they are over): without
        this a long-lived worker keeps one entry per task it ever profiled. An unreadable
        board forgets nothing, so a board readable again does not restart the counts. A
        segment of a removed task still being dumped may count again; the next refresh drops it."""
        with self._count_lock:
            if self.started.keys() - on_board:
                self.started = {k: n for k, n in self.started.items() if k in on_board}

    def consider(self, span: Any) -> None:
        """Start profiling ``span``'s segment if a task matches and every limit allows."""
        tasks = self.by_endpoint.get(span.op)
        seg = span.segment
        if tasks is None or seg.profile is not None:
            return
        task = active_task(tasks, time.time_ns() // 1_000_000)
        if task is None:
            return
        source = current_stack_source()
        # Scheduled from the span's own start: a rename found late does not delay the threshold.
        started_mono = time.monotonic() - max(0, time.time_ns() // 1_000_000 - span.start) / 1000
        item = Profiled(
            task,
            seg.segment_id,
            source,
            started_mono=started_mono,
            depth=self.depth,
            max_profile_s=self.max_profile_s,
            claim=self.claim,
        )
        task_id, limit = task.task_id, task.max_sampling_count

        def admit() -> bool:  # no count taken here: the segment claims its place at its first snapshot
            return self.started.get(task_id, 0) < limit

        if not self._sampler().try_add(item, self.max_parallel, admit):
            return
        seg.profile = item

    def claim(self, task: BoardTask) -> bool:
        """Count one profiled segment of ``task`` if its max sampling count has room (called
        by the sampler at a segment's first snapshot, under that segment's lock)."""
        with self._count_lock:  # no other lock is taken while it is held: no lock order to keep
            started = self.started.get(task.task_id, 0)
            if started >= task.max_sampling_count:
                return False
            self.started[task.task_id] = started + 1
            return True


def by_endpoint(tasks: list[BoardTask]) -> dict[str, tuple[BoardTask, ...]]:
    """The board's tasks per endpoint, earliest start first (see :func:`active_task`)."""
    out: dict[str, list[BoardTask]] = {}
    for t in sorted(tasks, key=lambda t: t.start_ms):
        out.setdefault(t.endpoint, []).append(t)
    return {endpoint: tuple(ts) for endpoint, ts in out.items()}


def active_task(tasks: tuple[BoardTask, ...], now_ms: int) -> BoardTask | None:
    """The task of an endpoint running at ``now_ms``: whichever of its tasks' time covers
    it, not the one posted last (a later task would hide the running one). Should the OAP
    ever post overlapping ones, the one that started first wins."""
    for t in tasks:
        if t.active(now_ms):
            return t
    return None


def current_stack_source() -> StackSource:
    """How to take the stack of the request running here: its asyncio task, greenlet or thread."""
    # A running event loop means the application imported asyncio: look it up rather than
    # import it, so processes that never use asyncio (most prefork workers) never load it.
    aio = sys.modules.get("asyncio")
    loop = aio.events._get_running_loop() if aio is not None else None
    if aio is not None and loop is not None:
        task = aio.current_task(loop)
        if task is not None:
            return partial(stacks.coroutine_stack, task.get_coro(), threading.get_ident())
    if _gevent_patched():
        import greenlet  # noqa: PLC0415 (only under gevent)

        return partial(stacks.greenlet_stack, greenlet.getcurrent())
    return partial(stacks.thread_stack, threading.get_ident())


def _gevent_patched() -> bool:
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None:
        return False
    try:
        return bool(monkey.is_module_patched("threading"))
    except Exception:
        return False


gate = Gate()
