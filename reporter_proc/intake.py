"""Intake: reading the rings into per-kind batches, and deciding when to read.

A *pass* visits every ring (round-robin, so no ring starves) and reads up to
``_READ_CHUNK`` records from each, bounded by the memory cap. Data records join the open
batch of their kind as raw bytes (they are decoded only when sent); worker records
(WORKER_START/STOP) go to the instance table at once. A batch is sealed - handed to
delivery - when it is full (records or bytes), and every open batch is sealed on each
flush tick.

When to read and send (the cost at ordinary load): the intake wakes on its read ticks
(``poll_interval_s``, 1 s, on the grid of :mod:`reporter_proc.ticks`, so in the same turn of
the loop as the status heartbeat and the other periodic jobs) and reads what came. It sends
a batch when it is full, on a read tick when it holds ``send_early_records`` (500) records,
and on every flush tick whatever it holds (``flush_interval_s``, 5 s by default): a send
costs about the same CPU whatever it carries, so a quiet application sends seldom and a
busy one about once a second. Between ticks it sleeps with the arena's "sleeping" flag
set. Writers do
not ring the doorbell for each record: only a writer whose ring passes a quarter full
rings it (``ipc._layout.WAKE_FILL_SHIFT``), which wakes the intake at once, so a burst that
fits in a ring never overflows it. Below saturation no worker makes a system call to
report, and the reporter wakes once per read tick whatever the request rate; at
saturation it reads pass after pass.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ipc import Arena, DoorbellListener, RingReader
from ipc import _layout as L
from ipc.ring_reader import moved
from reporter_proc import records as R
from reporter_proc.delivery import Delivery, decode
from reporter_proc.journal import Journal
from reporter_proc.ledger import Batch, Chunk, Ledger
from reporter_proc.lifecycle import StopState
from reporter_proc.ticks import forget_wake, next_tick, wake_at

log = logging.getLogger("swmp.reporter")

_READ_CHUNK = 256  # records taken from one ring before looking at the next
# Records one pass may take before it yields to the event loop. A 20-span segment decodes
# in ~25 us, so a pass stays in the tens of milliseconds: sends, keep-alives and the
# heartbeat (at least once a second) never wait long behind a busy intake.
_PASS_BUDGET = 1024
_STOPPING_POLL_S = 0.05  # a stopping intake looks for the workers' last records this often


class Intake:
    def __init__(
        self,
        arena: Arena,
        readers: list[RingReader],
        ledger: Ledger,
        *,
        journal: Journal,
        delivery: Delivery,
        stop: StopState,
        on_worker_record: Callable[[int, list[Any]], None],
        spill: Callable[[], None] | None,
        drained_for_stop: Callable[[float], bool],
    ) -> None:
        self.arena = arena
        self.journal = journal
        self.delivery = delivery
        self.stop = stop
        self.readers = readers
        self.ledger = ledger
        self.read_counts: dict[int, int] = {}
        self.open: dict[str, Batch] = {}
        self._on_worker_record = on_worker_record
        self._spill = spill  # memory is full and there is a spool: move unsent batches there
        self._drained_for_stop = drained_for_stop
        self._next_reader = 0  # round-robin start of the next pass
        self.passes = 0  # passes over the rings so far (tests wait for ticks with it)
        self._more = False  # the last pass stopped at a limit: records are waiting
        self._held = False  # the last pass stopped at the memory cap: wake when memory frees
        self._waiter: asyncio.Future[None] | None = None
        self._bell = False
        self._listener: DoorbellListener | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_fill = arena.ring_capacity >> L.WAKE_FILL_SHIFT
        # Ring bytes read but not yet resolved above which, while the backend fails, the
        # records are taken out of the ring (Delivery.relieve) instead of filling it up.
        self._pressure = arena.ring_capacity // 2

    # -- waking and sleeping ---------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        try:
            self._listener = DoorbellListener(self.arena.path)
        except OSError as exc:  # not a FIFO of ours (ipc.private): never use it, poll instead
            self.journal.log_once(
                "doorbell", logging.WARNING, "no doorbell (%s); the rings are polled on a timer", exc
            )
            return
        loop.add_reader(self._listener.fileno(), self._on_bell)

    def close(self) -> None:
        if self._listener is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None

    def _on_bell(self) -> None:
        if self._listener is not None:
            self._listener.drain()
        self._bell = True
        self.poke()

    def poke(self) -> None:
        """Wake the intake now (a stop, memory freed, the doorbell)."""
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _sleep_until(self, when: float) -> None:
        """Sleep until ``when`` (the loop's clock) or a :meth:`poke`, whichever comes first;
        on the tick grid's shared timer, which the other periodic jobs wait for too."""
        loop = self._loop
        assert loop is not None
        fut: asyncio.Future[None] = loop.create_future()
        self._waiter = fut
        wake_at(when, fut)
        try:
            await fut
        finally:
            forget_wake(when, fut)  # a poke came first: the timer may be armed for it still
            self._waiter = None

    def _filling(self) -> bool:
        """Is some ring past the doorbell threshold (or simply unread, when stopping)?"""
        fill = 1 if self.stop.stopping else self._wake_fill
        return any(r.backlog() >= fill and r.pending() for r in moved(self.readers))

    # -- the loop --------------------------------------------------------------------------
    async def run(self) -> None:
        """Read until the stop says the rings are drained (or the drain deadline passed)."""
        loop = self._loop
        assert loop is not None
        status = self.arena.status
        s = self.journal.settings
        flush_period, read_period = s.flush_interval_s, s.poll_interval_s
        flush_at = next_tick(loop.time(), flush_period)
        early_at = next_tick(loop.time(), read_period)
        while True:
            n = self.drain_pass()
            self.passes += 1
            now = loop.time()
            if now >= flush_at:
                self.seal_all()
                flush_at = next_tick(now, flush_period)
            elif now >= early_at:
                # Once per read tick, not per pass: at saturation passes follow each other
                # and batches fill up to batch_max_records on their own.
                self.seal_large(s.send_early_records)
            if now >= early_at:
                early_at = next_tick(now, read_period)
            stop = self.stop
            if stop.stopping and (now >= stop.drain_deadline or self._drained_for_stop(now)):
                return
            if n and self._more:
                await asyncio.sleep(0)  # let the senders run between passes
                continue
            wake = min(flush_at, next_tick(now, read_period))
            if stop.stopping:
                wake = min(wake, now + _STOPPING_POLL_S)
            if self.memory_full():
                # Waiting for sends, not for writers: do not make writers ring the bell.
                await self._sleep_until(wake)
                continue
            status.set_sleeping(True)
            # Re-check after announcing sleep: a writer that passed the threshold before it
            # saw the flag did not ring.
            if self._filling():
                status.set_sleeping(False)
                continue
            await self._sleep_until(wake)
            status.set_sleeping(False)
            if self._bell:
                self._bell = False
                status.count_wakeup()

    def on_freed(self) -> None:
        """A batch was resolved: wake a pass only if the last one stopped at the memory cap
        (otherwise the records wait for the next tick, as they would have anyway)."""
        if self._held:
            self.poke()

    def memory_full(self) -> bool:
        return self.ledger.pending_bytes >= self.journal.settings.max_pending_bytes and self._spill is None

    def pending(self) -> bool:
        return any(r.pending() for r in moved(self.readers))

    def drain_pass(self) -> int:
        limit = self.journal.settings.max_pending_bytes
        ledger = self.ledger
        self._more = self._held = False
        if ledger.pending_bytes >= limit:
            if self._spill is None:
                self._held = True
                return 0
            self.spill()
        total = 0
        # Only the rings whose writer moved the tail past our cursor (ring_reader.moved):
        # most of an arena's slots are never claimed, and an idle worker's ring is quiet.
        ready = moved(self.readers)
        start = self._next_reader
        if start:  # round-robin: from the ring the last pass stopped at
            ready = [r for r in ready if r.slot >= start] + [r for r in ready if r.slot < start]
        for reader in ready:
            if not reader.pending():
                continue
            if total >= _PASS_BUDGET:
                # Yield to the senders and the status task; carry on from this ring next pass.
                self._next_reader = reader.slot
                self._more = True
                break
            n = self.read_chunk(reader, reader.slot)
            total += n
            if n >= _READ_CHUNK:
                self._more = True
            if reader.cursor - reader.head >= self._pressure and self.delivery.failing():
                self.seal_all()
                self.delivery.relieve()
            if ledger.pending_bytes >= limit:
                self._more = True
                if self._spill is None:
                    self._held = True
                    break
                self.spill()
        return total

    def read_chunk(
        self, reader: RingReader, key: int, on_worker: Callable[[int, list[Any]], None] | None = None
    ) -> int:
        """Up to a chunk of ``reader``'s records into the open batches, as one ledger chunk
        under ``key`` (its slot; an adopted ring's negative key); how many records."""
        ledger = self.ledger
        # Bounded by bytes too, so the memory cap is overshot by one record at most.
        recs = reader.read(_READ_CHUNK, self.journal.settings.max_pending_bytes - ledger.pending_bytes)
        chunk = ledger.open(key, reader.cursor)
        if recs:
            self.dispatch(recs, chunk, on_worker)
        ledger.close(chunk)  # may commit (an adopted ring: and finish it) right now
        return len(recs)

    def spill(self) -> None:
        assert self._spill is not None
        self.seal_all()
        self._spill()

    def dispatch(
        self,
        recs: list[tuple[int, bytes]],
        chunk: Chunk,
        on_worker: Callable[[int, list[Any]], None] | None = None,
    ) -> None:
        """``recs`` (read in ``chunk``) into the open batches; worker records to ``on_worker``
        (default: the instance table; an adopted ring's go elsewhere, see ``adoption``)."""
        on_worker = on_worker or self._on_worker_record
        counts = self.read_counts
        by_type = R.BY_TYPE
        shut = self.journal.shut
        open_batches = self.open
        hold = self.ledger.hold
        batch_max = self.journal.settings.batch_max_records
        bytes_max = self.journal.settings.batch_max_bytes
        for rtype, payload in recs:
            counts[rtype] = counts.get(rtype, 0) + 1
            kind = by_type.get(rtype)
            if kind is None:
                self.journal.invalid(f"unknown record type {rtype}")
                continue
            if not kind.data:
                for rec in decode(self.journal, kind, [payload]):
                    on_worker(kind.rtype, rec)
                continue
            reason = shut.get(kind.name)
            if reason is not None:
                self.journal.dropped(reason)
                continue
            # Kept as the raw bytes until sent: delivery decodes (and checks) them.
            batch = open_batches.get(kind.name)
            if batch is not None and batch.nbytes + len(payload) > bytes_max:
                self.seal(kind.name)  # sealed by bytes: one request stays under the backend's limit
                batch = None
            if batch is None:
                batch = open_batches[kind.name] = Batch(kind.name)
            hold(batch, chunk, payload)
            if len(batch.payloads) >= batch_max:
                self.seal(kind.name)

    # -- batches ---------------------------------------------------------------------------
    def seal(self, kind: str) -> None:
        self.delivery.put(self.open.pop(kind))

    def seal_all(self) -> None:
        for kind in list(self.open):
            self.seal(kind)

    def seal_large(self, records: int) -> None:
        """Seal the open batches holding at least ``records`` records."""
        for kind, batch in list(self.open.items()):
            if len(batch.payloads) >= records:
                self.seal(kind)

    def abandoned_bytes(self) -> int:
        return sum(max(0, r.backlog()) for r in self.readers)
