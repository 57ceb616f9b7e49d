"""Thread mode: delivering what processes ended by a signal left unsent in their rings.

With ``SW_AGENT_REPORTER_PROCESS=false`` each process that reports drains a private one-slot
arena on a thread of its own. A process SIGTERMed by ``multiprocessing.Pool.terminate()`` (the
end of a ``with Pool(...)`` block) or killed by its server runs no exit handler, so what its
ring still held was lost (18-19 of 20 segments arrived in a pool test). Every thread-mode
reporter therefore looks for such arenas in its private directory (``ipc.adopt``): when it
starts, every :data:`SCAN_EVERY_S` seconds on the tick grid (a long-running parent that opens
pool after pool does not wait for a new process to start), and in its final flush. It adopts
each (its reporter lock: one live process per arena), reads the ring from its committed head
into its own open batches - the records carry their own service and instance names, so they
are sent as the dead process's - and removes the file once the ledger committed all of it
(sent, spooled or counted). One it could not finish (the shutdown deadline) is left, lock
released, for the next adopter, which starts where this one committed.

Only arenas whose header names the same destination as this reporter's own (protocol,
backends, whether there is an authentication: :func:`destination`) are adopted: another
application of the same user may send elsewhere, and its records must not go to our backend.
Such an arena is left to that application's processes (and to ``ipc.cleanup_stale``).

The dead process's WORKER_START, if still unread, announces its instance once (it is never
kept alive: :meth:`Instances.on_departed_record`). Adopted rings use negative ledger keys,
committed through :attr:`Ledger.foreign`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ipc import Arena, RingReader
from ipc.adopt import adopt, dead_private_arenas, finish, holds_unread
from reporter_proc.ticks import next_tick

if TYPE_CHECKING:
    from reporter_proc.instances import Instances
    from reporter_proc.intake import Intake
    from reporter_proc.ledger import Ledger

log = logging.getLogger("swmp.reporter")

__all__ = ["SCAN_EVERY_S", "Adoption", "kept_for_adoption"]

# How often a running reporter lists its private directory for arenas of dead processes:
# one listing (and a kill(pid, 0) per other process's arena) every few seconds, nothing per
# record. A multiple of the status tick (1 s), so it runs in the same turn of the loop.
SCAN_EVERY_S = 5.0


@dataclass
class _Adopted:
    arena: Arena
    reader: RingReader

    def done(self) -> bool:
        """Read to the end and all of it committed: the file may go."""
        return not self.reader.pending() and self.reader.head == self.reader.cursor


class Adoption:
    """The dead processes' arenas this reporter adopted, and when to look for more."""

    def __init__(
        self, directory: str, ledger: Ledger, intake: Intake, instances: Instances, *, meta: bytes
    ) -> None:
        self.directory = directory
        self.destination = destination(meta)
        self._foreign: set[str] = set()  # arenas of another destination: never opened again
        self.ledger = ledger
        self.intake = intake
        self.instances = instances
        self.held: dict[int, _Adopted] = {}  # ledger key (negative) -> the adopted ring
        self.adopted = 0  # arenas adopted so far (tests, the status)
        self._next_key = -1
        self._next_scan = 0.0
        ledger.foreign = self.commit

    # -- when ------------------------------------------------------------------------------
    def poll(self, now: float) -> None:
        """From the reporter's ~1 s tick: scan when due, then read what the adopted rings hold."""
        if now >= self._next_scan:
            self._next_scan = next_tick(now, SCAN_EVERY_S)
            self.scan()
        if self.held:
            self.read()

    def final(self) -> None:
        """In the final flush, before the last batches are sealed: adopt and read all there is,
        also what processes not reaped yet left (a ``forkserver`` pool's workers are reaped by
        the fork server after ``Pool.terminate()`` returned)."""
        self.scan(zombies=True)
        self.read()

    # -- adopting --------------------------------------------------------------------------
    def scan(self, *, zombies: bool = False) -> int:
        """Adopt the arenas of dead processes that no other process adopted; how many."""
        try:
            paths = dead_private_arenas(self.directory, zombies=zombies)
        except OSError as exc:
            self.intake.journal.log_once(
                "adopt-scan", logging.WARNING, "cannot list %s: %s", self.directory, exc
            )
            return 0
        held = {a.arena.path for a in self.held.values()}
        self._foreign &= set(paths)
        n = 0
        for path in paths:
            if path in held or path in self._foreign:
                continue

            def accept(meta: bytes, path: str = path) -> bool:
                if destination(meta) == self.destination:
                    return True
                self._foreign.add(path)
                return False

            arena = adopt(path, accept)
            if arena is None:
                continue
            try:
                reader = arena.reader(0)
            except (IndexError, ValueError) as exc:  # a header that maps but makes no ring
                log.debug("not adopting %s: %s", path, exc)
                finish(arena, unlink=False)
                continue
            key = self._next_key
            self._next_key -= 1
            self.held[key] = _Adopted(arena, reader)
            self.adopted += 1
            n += 1
            log.debug("adopted %s (%d bytes unread)", path, reader.backlog())
            self._finish_if_done(key)  # nothing unread: removed now
        return n

    def read(self) -> int:
        """Read the adopted rings into the intake's open batches, within the memory cap."""
        intake, ledger = self.intake, self.ledger
        limit = intake.journal.settings.max_pending_bytes
        on_worker = self.instances.on_departed_record
        total = 0
        for key, adopted in list(self.held.items()):
            reader = adopted.reader
            empty = 0
            # A bad header stops a read once and is skipped at the next (RingReader): twice
            # empty while records are pending means the rest cannot be read.
            while key in self.held and reader.pending() and empty < 2 and ledger.pending_bytes < limit:
                n = intake.read_chunk(reader, key, on_worker)  # may commit and finish the ring
                total += n
                empty += not n
            if key in self.held:
                self._finish_if_done(key)
        return total

    # -- committing and letting go ---------------------------------------------------------
    def commit(self, key: int, position: int) -> None:
        """The ledger resolved an adopted ring up to ``position`` (``Ledger.foreign``)."""
        adopted = self.held.get(key)
        if adopted is None:
            return
        adopted.reader.commit(position)
        self._finish_if_done(key)

    def _finish_if_done(self, key: int) -> None:
        adopted = self.held[key]
        if adopted.done():
            del self.held[key]
            self.ledger.forget(key)
            _let_go(adopted, unlink=True)

    def close(self) -> None:
        """At teardown: remove the arenas read to the end, leave the rest (lock released) to
        the next adopter. Records of theirs still unsent were counted by the shutdown."""
        held, self.held = self.held, {}
        for adopted in held.values():
            _let_go(adopted, unlink=adopted.done())


def kept_for_adoption(meta: bytes) -> Callable[[Arena], bool]:
    """``ipc.cleanup_stale``'s ``keep`` for a thread-mode process whose reporter will adopt
    with this header ``meta``: a dead private arena with unread records bound for the same
    destination, which its :class:`Adoption` then delivers. One bound elsewhere is not kept:
    no reporter of this application would send it."""
    ours = destination(meta)

    def keep(arena: Arena) -> bool:
        return holds_unread(arena) and destination(arena.info().meta) == ours

    return keep


def destination(meta: bytes) -> Any:
    """Where the records of the arena with this header meta (``swmp._arena_meta``) go: equal
    for every process of one application, and for applications that send to the same place."""
    try:
        doc = orjson.loads(meta) if meta else {}
    except orjson.JSONDecodeError:
        return ("unreadable",)
    if not isinstance(doc, dict):
        return ("unreadable",)
    backends = doc.get("backends")
    return (
        doc.get("protocol"),
        tuple(backends) if isinstance(backends, list) else backends,
        doc.get("authentication"),
    )


def _let_go(adopted: _Adopted, *, unlink: bool) -> None:
    adopted.reader.release()  # its views first: the mapping can then be closed, not parked
    try:
        finish(adopted.arena, unlink=unlink)
    except OSError as exc:
        log.debug("letting go of %s: %s", adopted.arena.path, exc)
