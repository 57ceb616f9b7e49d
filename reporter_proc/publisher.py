"""Status: the heartbeat and the status document in the arena, at least once a second.

``swmp status`` / ``swmp health`` read what this publishes (``reporter_proc.status`` builds
the document). The publisher only looks at the other parts; it changes nothing in them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ipc import Arena
from reporter_proc import records as R
from reporter_proc.instances import Instances
from reporter_proc.journal import Journal
from reporter_proc.ledger import Ledger
from reporter_proc.lifecycle import StopState
from reporter_proc.senders.base import Sender
from reporter_proc.spooling import SpoolWriter
from reporter_proc.status import InstanceView, Rates, build_document
from reporter_proc.ticks import until_next_tick

_DATA_NAMES = frozenset(k.name for k in R.DATA_KINDS)

# An idle reporter's document does not change from one tick to the next, and deriving and
# building it every tick (~160 us in a reporter process, caches cold after a second's sleep)
# was about a quarter of its main thread's idle CPU. So, while the published rates are 0,
# publish() compares the values the document is made of (StatusPublisher._inputs) with those
# of the last publication and skips the build when they are equal (~55 us for the whole
# tick, heartbeat included). Nothing in the document ages by itself (readers compute ages
# from the timestamps in it against their own clock) and _inputs covers every value it is
# made of, so no periodic rebuild is needed for it to be right. One every REBUILD_S is done
# anyway, for ~5 us/s: should a value added to the document one day be forgotten in
# _inputs, the document would then lag by at most REBUILD_S rather than stay stale until
# some other value changes (which, on an idle reporter with no worker, is never).
REBUILD_S = 30.0


@dataclass
class Parts:
    """What the document describes; filled in as the reporter starts its parts."""

    sender: Sender | None = None
    spool: SpoolWriter | None = None
    ledger: Ledger | None = None
    instances: Instances | None = None
    read_counts: dict[int, int] = field(default_factory=dict)
    supervisor: Callable[[], dict[str, int]] | None = None  # who restarts us (process mode)


class StatusPublisher:
    def __init__(
        self, arena: Arena, journal: Journal, stop: StopState, *, mode: str, restarts: int, parts: Parts
    ) -> None:
        self.arena = arena
        self.journal = journal
        self.stop = stop
        self.mode = mode
        self.restarts = restarts
        self.parts = parts
        self.started_ns = time.time_ns()
        self.rates = Rates()
        # Totals an earlier reporter of this arena left in its counter table (see carry_over).
        self.carried: dict[str, int] = {}
        self._carried_sent = 0
        self._since_ns = 0  # the arena's creation: what the totals count from
        # What the document in the arena was built from, while it shows rates of 0.
        self._published: tuple[object, ...] | None = None
        self._built_at = 0.0  # monotonic time of that publication

    def carry_over(self) -> None:
        """Continue the counts of the arena's earlier reporters (call once we hold the role)."""
        self.carried = self.arena.status.snapshot().counters
        self._published = None  # publish on the next tick, whatever is in the arena now
        self._since_ns = self.arena.info().created_ns
        self.journal.counters.seed(self.carried)
        self._carried_sent = sum(
            n for name, n in self.carried.items() if name.startswith("sent.") and name[5:] in _DATA_NAMES
        )

    def totals(self) -> dict[str, int]:
        """The counts since the arena was created, as stored in its counter table."""
        self.document()  # brings the derived counts (read, dropped.spool) up to date
        return self.journal.counters.flat()

    def document(self) -> bytes:
        self._count_spool_drops()
        self._derive()
        return self._build()

    def _derive(self) -> None:
        """Bring ``read`` and the rates up to date (``dropped.spool``: _count_spool_drops)."""
        c = self.journal.counters
        p = self.parts
        carried = self.carried
        read: dict[str, int] = {k[5:]: n for k, n in carried.items() if k.startswith("read.")}
        for t, n in p.read_counts.items():
            name = R.NAMES.get(t, "unknown")
            read[name] = read.get(name, 0) + n
        c.read = read
        read_total = sum(n for t, n in p.read_counts.items() if t in R.BY_TYPE and R.BY_TYPE[t].data)
        sent_total = sum(n for k, n in c.sent.items() if k in _DATA_NAMES) - self._carried_sent
        self.rates.update(read_total, sent_total)

    def _count_spool_drops(self) -> None:
        spool = self.parts.spool
        dropped = spool.dropped if spool is not None else 0
        self.journal.counters.dropped["spool"] = self.carried.get("dropped.spool", 0) + dropped

    def _build(self) -> bytes:
        """The document from the current values (call :meth:`_derive` first)."""
        j = self.journal
        c = j.counters
        p = self.parts
        s = j.settings
        spool = p.spool
        instances = p.instances.table.values() if p.instances is not None else ()
        return build_document(
            pid=os.getpid(),
            service=s.service,
            protocol=s.protocol,
            mode=self.mode,
            started_ns=self.started_ns,
            restarts=self.restarts,
            address=p.sender.address if p.sender is not None else "",
            counters=c,
            spool_enabled=spool is not None,
            spool_bytes=spool.spool.total_bytes if spool is not None else 0,
            spool_cap=s.spool_max_bytes if spool is not None else 0,
            spool_records=spool.spool.total_records if spool is not None else 0,
            pending_bytes=p.ledger.pending_bytes if p.ledger is not None else 0,
            instances=[InstanceView(i.slot, i.pid, i.instance, i.last_keepalive_ns) for i in instances],
            max_instances=s.status_max_instances,
            rates=self.rates,
            extra=self._extra(),
        )

    def _inputs(self) -> tuple[object, ...]:
        """The values :meth:`_build` and the counter table (``Counters.flat``) are made of,
        but the rates (see publish) and what :meth:`_derive` makes of these (call
        :meth:`_count_spool_drops` first), copied: the counters' dicts change in place.
        Equal inputs and rates at rest give a byte-identical document. Whatever is added to
        the document must be added here."""
        c = self.journal.counters
        p = self.parts
        spool = p.spool
        supervisor = p.supervisor
        table = p.instances.table.values() if p.instances is not None else ()
        return (
            os.getpid(),
            self.journal.settings,  # frozen: service, protocol, spool cap, max instances
            self.mode,
            self.started_ns,
            self.restarts,
            self._since_ns,
            p.sender.address if p.sender is not None else "",  # changes on a backend failover
            c.backend_state,
            c.last_success_ns,
            c.last_error,
            c.last_error_ns,
            c.consecutive_failures,
            tuple(p.read_counts.items()),  # with self.carried (fixed), what c.read is made of
            tuple(c.sent.items()),
            tuple(c.dropped.items()),
            c.retried,
            c.failed,
            c.spooled,
            c.replayed,
            c.profile_commands_refused,
            (spool.spool.total_bytes, spool.spool.total_records) if spool is not None else None,
            p.ledger.pending_bytes if p.ledger is not None else 0,
            [(i.slot, i.pid, i.instance, i.last_keepalive_ns) for i in table],
            self.stop.stopping,
            self.stop.reason,
            tuple(supervisor().items()) if supervisor is not None else None,
        )

    def _extra(self) -> dict[str, object]:
        extra: dict[str, object] = {"counted_since_ns": self._since_ns}
        if self.stop.stopping:
            extra["stopping"] = self.stop.reason
        if self.parts.supervisor is not None:
            extra["supervisor"] = self.parts.supervisor()
        return extra

    def publish(self) -> None:
        """Heartbeat; then publish the document and the counter table unless nothing they
        show changed since the last publication (and ``REBUILD_S`` has not passed)."""
        status = self.arena.status
        status.heartbeat()  # every tick, changed or not: ``swmp health --liveness`` checks its age
        try:
            self._count_spool_drops()  # a derived count, among the inputs
            now = time.monotonic()
            rates = self.rates
            # _published is set only while the document in the arena shows rates of 0; they
            # stay 0 as long as nothing is read or sent, i.e. while the inputs stay equal.
            unchanged = (
                self._published is not None
                and rates.at_rest()
                and now - self._built_at < REBUILD_S
                and self._inputs() == self._published
            )
            if unchanged:
                rates.restart(now)  # what their update would do
                return  # the document and the counters in the arena are these already
            self._published = None  # until this one is in the arena
            self._derive()
            status.publish(self._build(), self.journal.counters.flat())
            self._built_at = now
            if rates.at_rest():  # else the next tick publishes anyway: the rates move
                self._published = self._inputs()
            if status.unstored:
                self.journal.log_once(
                    "counter-table",
                    logging.WARNING,
                    "the arena's counter table is full: %d counters are not kept across restarts",
                    status.unstored,
                )
        except Exception as exc:  # never let reporting on ourselves take us down
            self._published = None  # rebuild on the next tick
            self.journal.log_once("status", logging.ERROR, "cannot publish the status document: %r", exc)

    async def run(self, tick: Callable[[], None]) -> None:
        """Publish every ``status_interval_s`` (at most 1 s, on the reporter's tick grid);
        ``tick`` runs first each time."""
        interval = min(1.0, max(0.05, self.journal.settings.status_interval_s))
        while True:
            await until_next_tick(interval)
            tick()
            self.publish()
