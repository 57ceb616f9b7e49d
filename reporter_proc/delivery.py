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

from reporter_proc import records as R
from reporter_proc.journal import Journal
from reporter_proc.ledger import Batch, Ledger
from reporter_proc.lifecycle import StopState
from reporter_proc.senders.base import FatalSendError, Record, Sender, SendError, UnsupportedError
from reporter_proc.spooling import SpoolWriter

RETRYABLE = (SendError, asyncio.TimeoutError, OSError)


def backoff(journal: Journal, attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` (1-based), jittered so reporters do not align."""
    s = journal.settings
    base = min(s.retry_backoff_max_s, s.retry_backoff_base_s * 2.0 ** (attempt - 1))
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
        await asyncio.wait_for(call(records), timeout=self.journal.settings.send_timeout_s + 1.0)

    async def deliver(self, batch: Batch) -> None:
        """Send one batch: retries, then spool or drop. Always leaves it resolvable."""
        j = self.journal
        c = j.counters
        kind = batch.kind
        if batch.decoded is None:
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
            except FatalSendError as exc:
                c.failure(f"{type(exc).__name__}: {exc}")
                j.dropped("rejected", n)
                c.failed += 1
                j.log_once(f"fatal-{kind}", logging.ERROR, "backend refused %d %s records: %s", n, kind, exc)
                return
            except RETRYABLE as exc:
                attempt += 1
                c.failure(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
                now = time.monotonic()
                if attempt >= j.settings.retry_max_attempts or self.stop.past_deadline(now):
                    self.give_up(batch, exc)
                    return
                c.retried += 1
                delay = backoff(j, attempt)
                if self.stop.stopping:
                    delay = min(delay, self.stop.remaining())
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the encoder choked on something: find the bad records
                if n == 1:
                    j.invalid(f"{kind} record could not be encoded: {exc!r}")
                    batch.decoded = []
                    return
                await self.isolate(batch)
            else:
                c.add(c.sent, kind, n)
                c.success()
                return

    async def isolate(self, batch: Batch) -> None:
        """Send records one by one so one bad record costs itself, not its batch."""
        j = self.journal
        keep: list[Record] = []
        for rec in batch.decoded or []:
            try:
                await self.send(batch.kind, [rec])
            except (UnsupportedError, *RETRYABLE):
                keep.append(rec)  # counted on deliver's next round
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                j.invalid(f"{batch.kind} record could not be encoded: {exc!r}")
            else:
                j.counters.add(j.counters.sent, batch.kind)
                j.counters.success()
        batch.decoded = keep

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

    # -- memory full, shutdown -------------------------------------------------------------
    def spill(self) -> None:
        """Memory is full and a spool is set: move every unsent batch to disk.

        Their records count as resolved, so the rings move on. A batch whose send is in
        progress is copied too: if that send succeeds after all, replay sends it again
        (at-least-once, as documented).
        """
        assert self.spool is not None
        for queue in self.queues.values():
            for batch in queue:
                if not batch.spilled and len(batch):
                    batch.spilled = True
                    self.spool.write(spool_items(batch))
                    self.ledger.resolve(batch)
        self.journal.log_once(
            "spill", logging.WARNING, "reporter memory full: spilling unsent records to the spool"
        )

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
    """What the spool keeps of ``batch``: the raw payloads, or the records still unsent."""
    rtype = R.BY_NAME[batch.kind].rtype
    if batch.decoded is None:
        return [(rtype, p) for p in batch.payloads]
    dumps = orjson.dumps
    return [(rtype, r if isinstance(r, bytes) else dumps(r)) for r in batch.decoded]  # raw_kinds: bytes
