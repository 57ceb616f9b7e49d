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

    def carry_over(self) -> None:
        """Continue the counts of the arena's earlier reporters (call once we hold the role)."""
        self.carried = self.arena.status.snapshot().counters
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
        j = self.journal
        c = j.counters
        p = self.parts
        s = j.settings
        carried = self.carried
        read: dict[str, int] = {k[5:]: n for k, n in carried.items() if k.startswith("read.")}
        for t, n in p.read_counts.items():
            name = R.NAMES.get(t, "unknown")
            read[name] = read.get(name, 0) + n
        c.read = read
        read_total = sum(n for t, n in p.read_counts.items() if t in R.BY_TYPE and R.BY_TYPE[t].data)
        sent_total = sum(n for k, n in c.sent.items() if k in _DATA_NAMES) - self._carried_sent
        self.rates.update(read_total, sent_total)
        spool = p.spool
        c.dropped["spool"] = carried.get("dropped.spool", 0) + (spool.dropped if spool is not None else 0)
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

    def _extra(self) -> dict[str, object]:
        extra: dict[str, object] = {"counted_since_ns": self._since_ns}
        if self.stop.stopping:
            extra["stopping"] = self.stop.reason
        if self.parts.supervisor is not None:
            extra["supervisor"] = self.parts.supervisor()
        return extra

    def publish(self) -> None:
        status = self.arena.status
        status.heartbeat()
        try:
            doc = self.document()  # first: it brings the derived counts up to date
            status.publish(doc, self.journal.counters.flat())
            if status.unstored:
                self.journal.log_once(
                    "counter-table",
                    logging.WARNING,
                    "the arena's counter table is full: %d counters are not kept across restarts",
                    status.unstored,
                )
        except Exception as exc:  # never let reporting on ourselves take us down
            self.journal.log_once("status", logging.ERROR, "cannot publish the status document: %r", exc)

    async def run(self, tick: Callable[[], None]) -> None:
        """Publish every ``status_interval_s`` (at most 1 s, on the reporter's tick grid);
        ``tick`` runs first each time."""
        interval = min(1.0, max(0.05, self.journal.settings.status_interval_s))
        while True:
            await until_next_tick(interval)
            tick()
            self.publish()
