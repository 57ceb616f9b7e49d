"""Delivery: one sender task per kind ships that kind's sealed batches, in order.

A batch is decoded (its raw ring payloads turned into the positional lists of
``reporter_proc.records``) just before its first send, then sent with jittered exponential
backoff between attempts. When the attempts run out it goes to the spool, or is counted as
dropped when there is none. A batch the encoder chokes on is *isolated*: its records are
sent one by one so a bad record costs only itself. Whatever happens, the batch ends
resolved in the ledger, which lets the rings move on.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from typing import cast

import orjson

from reporter_proc import isolation
from reporter_proc import records as R
from reporter_proc.journal import Journal
from reporter_proc.ledger import Batch, Ledger
from reporter_proc.lifecycle import StopState
from reporter_proc.senders.base import (
    FatalSendError,
    InvalidDataError,
    Record,
    Sender,
    TooLargeError,
    UnsupportedError,
)
from reporter_proc.spooling import SpoolWriter
from reporter_proc.timeouts import limited

RETRYABLE = isolation.RETRYABLE  # failures worth another attempt: one definition
_MAX_EXPONENT = 1023  # the largest n for which 2.0 ** n is a float


def backoff(journal: Journal, attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` (1-based), jittered so reporters do not align."""
    s = journal.settings
    # The exponent stops growing long before the cap could be missed: 2.0 ** 1024 raises
    # OverflowError, and the keeper, the replayer and delivery without a spool count their
    # attempts without bound during an outage (attempt 1025 came after ~17 minutes and
    # killed the reporter). A product past the float range is inf, which the cap takes.
    exponent = min(attempt - 1, _MAX_EXPONENT)
    base = min(s.retry_backoff_max_s, s.retry_backoff_base_s * 2.0**exponent)
    return base * (0.5 + random.random() / 2)


def decode(journal: Journal, kind: R.Kind, payloads: list[bytes]) -> list[Record]:
    """Raw payloads as records; unreadable ones are counted as invalid and left out."""
    loads = orjson.loads
    min_len = kind.min_len
    out: list[Record] = []
    for payload in payloads:
        try:
            rec = loads(payload)
        except orjson.JSONDecodeError as exc:
            journal.invalid(f"record of type {kind.rtype} is not JSON: {exc}")
            continue
        if type(rec) is not list or len(rec) < min_len:
            journal.invalid(f"record of type {kind.rtype} does not have the layout of records.py")
            continue
        out.append(rec)
    return out


class Delivery:
    def __init__(
        self,
        journal: Journal,
        ledger: Ledger,
        sender: Sender,
        spool: SpoolWriter | None,
        stop: StopState,
    ) -> None:
        self.journal = journal
        self.ledger = ledger
        self.sender = sender
        self.spool = spool
        self.stop = stop
        self.queues: dict[str, deque[Batch]] = {k.name: deque() for k in R.DATA_KINDS}
        self._events: dict[str, asyncio.Event] = {}

    # -- the queues ------------------------------------------------------------------------
    def put(self, batch: Batch) -> None:
        self.queues[batch.kind].append(batch)
        event = self._events.get(batch.kind)
        if event is not None:
            event.set()

    def wake_all(self) -> None:
        for event in self._events.values():
            event.set()

    async def run(self, kind: str) -> None:
        """The sender task of one kind: until closing and its queue is empty."""
        queue = self.queues[kind]
        event = self._events[kind] = asyncio.Event()
        while True:
            if not queue:
                if self.stop.closing:
                    return
                event.clear()
                await event.wait()
                continue
            batch = queue[0]
            await self.deliver(batch)
            queue.popleft()
            self.ledger.resolve(batch)

    # -- sending ---------------------------------------------------------------------------
    async def send(self, kind: str, records: list[Record]) -> None:
        call = getattr(self.sender, R.BY_NAME[kind].send)
        await limited(call(records), self.journal.settings.send_timeout_s + 1.0)

    async def deliver(self, batch: Batch) -> None:
        """Send one batch: retries, then spool or drop. Always leaves it resolvable."""
        j = self.journal
        c = j.counters
        kind = batch.kind
        if batch.decoded is None:
            if batch.spilled:
                return  # moved to the spool before its first send: the replayer sends it
            if kind in self.sender.raw_kinds:  # the sender encodes straight from the JSON
                batch.decoded = cast("list[Record]", list(batch.payloads))
            else:
                batch.decoded = decode(j, R.BY_NAME[kind], batch.payloads)
        attempt = 0
        while batch.decoded:
            records = batch.decoded
            n = len(records)
            try:
                await self.send(kind, records)
            except UnsupportedError as exc:
                j.unsupported(kind, n, exc)
                return
            except (TooLargeError, InvalidDataError) as exc:
                keep: list[Record] = []
                await self.split(kind, records, exc, keep)
                batch.decoded = keep
                if len(keep) < n:
                    continue  # progress: send what is left at once
                failure: BaseException = exc  # the parts failed for another reason: wait
            except FatalSendError as exc:
                c.failure(f"{type(exc).__name__}: {exc}")
                j.dropped("rejected", n)
                c.failed += 1
                j.log_once(f"fatal-{kind}", logging.ERROR, "backend refused %d %s records: %s", n, kind, exc)
                return
            except RETRYABLE as exc:
                failure = exc
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the encoder choked on something: find the bad records
                if n == 1:
                    j.invalid(f"{kind} record could not be encoded: {exc!r}")
                    batch.decoded = []
                    return
                await self.isolate(batch)
                continue
            else:
                c.add(c.sent, kind, n)
                c.success()
                return
            attempt += 1
            c.failure(f"{type(failure).__name__}: {failure}" if str(failure) else type(failure).__name__)
            if self.should_give_up(attempt):
                self.give_up(batch, failure)
                return
            if attempt == j.settings.retry_max_attempts:
                # Kept, not given up (no spool, memory not full): still say so once, or a
                # broken backend (a wrong CA, a wrong address) shows only in the status.
                j.log_once(
                    "keeping",
                    logging.WARNING,
                    "backend unavailable (%r): %d %s records kept in memory after %d attempts; retrying",
                    failure,
                    n,
                    kind,
                    attempt,
                )
            c.retried += 1
            delay = backoff(j, attempt)
            if self.stop.stopping:
                delay = min(delay, self.stop.remaining())
            await asyncio.sleep(delay)

    def should_give_up(self, attempt: int) -> bool:
        """After a failed attempt: stop retrying this batch (to spool or drop it)?

        With a spool, after ``retry_max_attempts`` (the batch waits on disk, nothing is
        lost). Without one, only when memory is full or the shutdown forces it: until then
        the batch waits in memory, retried about once a second (``retry_backoff_max_s``).
        """
        s = self.journal.settings
        if self.stop.past_deadline(time.monotonic()):
            return True
        if attempt < s.retry_max_attempts:
            return False
        memory_full = self.ledger.pending_bytes >= s.max_pending_bytes
        return self.spool is not None or self.stop.stopping or memory_full

    async def split(self, kind: str, records: list[Record], exc: FatalSendError, keep: list[Record]) -> None:
        """The backend refused ``records`` as too large or invalid: send halves, recursively
        (:func:`reporter_proc.isolation.split`, which replay shares)."""
        await isolation.split(self.journal, self.send, kind, records, exc, keep=keep)

    async def isolate(self, batch: Batch) -> None:
        """Send records one by one so one bad record costs itself, not its batch
        (:func:`reporter_proc.isolation.isolate`; what failed for a retryable reason stays)."""
        records = batch.decoded or []
        batch.decoded, _sent = await isolation.isolate(self.journal, self.send, batch.kind, records)

    def give_up(self, batch: Batch, exc: BaseException) -> None:
        j = self.journal
        n = len(batch)
        j.counters.failed += 1
        if batch.spilled:  # its copy waits in the spool already
            batch.decoded = []
            return
        if self.spool is not None:
            self.spool.write(spool_items(batch))
            j.log_once("spooling", logging.WARNING, "backend unavailable (%r): spooling to disk", exc)
        else:
            j.dropped("backend", n)
            j.log_once(
                "giving-up",
                logging.WARNING,
                "backend unavailable (%r): dropped %d %s records after %d attempts; more drops are counted",
                exc,
                n,
                batch.kind,
                j.settings.retry_max_attempts,
            )
        batch.decoded = []

    # -- rings under pressure, memory full, shutdown ----------------------------------------
    def failing(self) -> bool:
        return self.journal.counters.consecutive_failures > 0

    def relieve(self) -> None:
        """A ring is half full of records waiting for a failing backend: take them out of the
        rings so the writers never overflow while the reporter has room.

        With a spool they go to disk (durable: a reporter killed now loses nothing); without
        one they stay in memory only, up to ``max_pending_bytes``.
        """
        if self.spool is not None:
            self.spill(memory_full=False)
            self.journal.log_once(
                "relieve-spool",
                logging.WARNING,
                "backend unavailable: moving unsent records from the rings to the spool",
            )
            return
        for queue in self.queues.values():
            for batch in queue:
                if batch.chunks:
                    self.ledger.release(batch)
        self.journal.log_once(
            "release",
            logging.WARNING,
            "backend unavailable and no spool: keeping unsent records in memory only (up to %d bytes)",
            self.journal.settings.max_pending_bytes,
        )

    def spill(self, *, memory_full: bool = True) -> None:
        """Memory is full and a spool is set: move every unsent batch to disk.

        Their records count as resolved, so the rings move on, and they leave the queues
        (their memory is freed). The batch at the head of a queue may be in the middle of a
        send: it is copied and stays; if that send succeeds after all, replay sends it again
        (at-least-once, as documented). It is not sent at all when it had not started yet.
        """
        assert self.spool is not None
        for queue in self.queues.values():
            if not queue:
                continue
            head = queue.popleft()
            for batch in queue:
                self._spill_one(batch)
            queue.clear()
            self._spill_one(head)
            queue.append(head)
        if memory_full:
            self.journal.log_once(
                "spill", logging.WARNING, "reporter memory full: spilling unsent records to the spool"
            )

    def _spill_one(self, batch: Batch) -> None:
        assert self.spool is not None
        if not batch.spilled and len(batch):
            batch.spilled = True
            self.spool.write(spool_items(batch))
            self.ledger.resolve(batch)

    def abandon(self) -> int:
        """After the shutdown deadline: spool what is left, or leave it unresolved in the
        rings for a successor. Returns how many records were left in the rings."""
        left = 0
        for queue in self.queues.values():
            while queue:
                batch = queue.popleft()
                if batch.spilled:
                    continue
                if self.spool is not None and len(batch):
                    self.spool.write(spool_items(batch))
                    self.ledger.resolve(batch)
                else:
                    left += len(batch)  # not committed: still in the ring for a successor
        return left


def spool_items(batch: Batch) -> list[tuple[int, bytes]]:
    """What the spool keeps of ``batch``: the raw payloads as read from the ring (never
    re-encoded), or, once some of its records were sent or dropped, those still unsent."""
    rtype = R.BY_NAME[batch.kind].rtype
    if batch.decoded is None or len(batch.decoded) == len(batch.payloads):
        return [(rtype, p) for p in batch.payloads]
    dumps = orjson.dumps
    return [(rtype, r if isinstance(r, bytes) else dumps(r)) for r in batch.decoded]  # raw_kinds: bytes
