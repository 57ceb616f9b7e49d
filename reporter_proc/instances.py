"""Instances: every worker that said WORKER_START is announced to the backend and kept alive.

The table lives beside the arena (``<arena>.instances``) so a restarted reporter keeps the
same workers alive. A worker leaves with WORKER_STOP, or by no longer holding its slot
lock (it died); one that left before its first announcement is still announced once: its
segments name it, so the backend should know it existed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from ipc import Arena, private
from ipc.arena import MAX_SLOTS
from reporter_proc import records as R
from reporter_proc.journal import Journal
from reporter_proc.lifecycle import StopState
from reporter_proc.senders.base import Sender, SendError, UnsupportedError
from reporter_proc.ticks import until_next_tick
from reporter_proc.timeouts import limited

log = logging.getLogger("swmp.reporter")

_PID_MAX = 2**31 - 1  # pid_t is a signed 32-bit int (Linux's pid_max is at most 2**22)


@dataclass
class Instance:
    record: list[Any]  # the WORKER_START record as received
    pid: int
    slot: int
    service: str
    instance: str
    layer: str
    properties: list[tuple[str, str]]
    due: float = 0.0  # monotonic time of the next keep-alive
    pings_since_props: int = 0
    props_sent: bool = False
    failures: int = 0
    last_keepalive_ns: int = 0
    leaving: bool = False  # said WORKER_STOP before it was ever announced


class Instances:
    def __init__(
        self,
        arena: Arena,
        journal: Journal,
        sender: Sender,
        stop: StopState,
        *,
        own_process_slots: bool,
        backoff: Callable[[int], float],
    ) -> None:
        self.arena = arena
        self.journal = journal
        self.sender = sender
        self.stop = stop
        self.table: dict[int, Instance] = {}
        # Workers gone from the table (they left, or a successor took their slot before the
        # keeper's round: a Celery child recycled by --max-tasks-per-child may live less than
        # a tick): the keeper announces each once if it never was, then forgets it; the
        # shutdown announces those it did not get to.
        self.departed: list[Instance] = []
        self.live: dict[int, int] = {}  # slot -> pid of the workers alive at the last check
        self.last_live_check = 0.0
        # Thread mode: our own process's slot locks are invisible to F_GETLK.
        self._own_process_slots = own_process_slots
        self._backoff = backoff
        self._host_props: list[tuple[str, str]] | None = None
        self._path = arena.path + ".instances"

    @property
    def managed(self) -> bool:
        return "management" in self.sender.supports

    # -- records from the rings ------------------------------------------------------------
    def on_record(self, rtype: int, rec: list[Any]) -> None:
        try:
            if rtype == R.WORKER_START:
                self._started(rec)
            else:
                pid, slot = self._pid_and_slot(rec)
                inst = self.table.get(slot)
                if inst is not None and inst.pid == pid:
                    if not inst.props_sent:
                        # Not announced yet (it lived less than a keeper tick): the keeper
                        # announces it once, then forgets it (or the shutdown announces it).
                        inst.leaving = True
                        return
                    del self.table[slot]
                    self.save()
        except (TypeError, ValueError, IndexError) as exc:
            self.journal.invalid(f"worker record {rec!r:.100}: {exc}")

    def on_departed_record(self, rtype: int, rec: list[Any]) -> None:
        """A worker record from the ring of a process that is gone (``reporter_proc.adoption``):
        its WORKER_START still unread there, it is announced once with the departed and never
        kept alive, nor let into the table, whose slots (the name registry's) live processes
        hold now. A WORKER_STOP has nothing left to do."""
        if rtype != R.WORKER_START:
            return
        try:
            self.departed.append(self._instance(rec))
        except (TypeError, ValueError, IndexError) as exc:
            self.journal.invalid(f"worker record {rec!r:.100}: {exc}")

    def _pid_and_slot(self, rec: list[Any]) -> tuple[int, int]:
        """The record's pid and slot; ValueError for numbers no worker of this arena has.

        A slot outside the arena reached the lock query of every keeper round, whose
        ``struct`` packing raised for numbers past 64 bits and killed the reporter; a pid
        outside ``pid_t`` could never hold a slot, and made the status document unbuildable.
        """
        pid, slot = int(rec[R.WS_PID]), int(rec[R.WS_SLOT])
        # Not the arena's own slot count: in thread mode a worker's reporter thread drains a
        # one-slot arena of its own, and the record carries the worker's slot in the
        # application's name registry (-1: named by pid). Any arena has at most MAX_SLOTS.
        if not -1 <= slot < MAX_SLOTS:
            raise ValueError(f"slot {slot} is not a slot number (-1..{MAX_SLOTS - 1})")
        if not 0 < pid <= _PID_MAX:
            raise ValueError(f"pid {pid} is not a process id")
        return pid, slot

    def _started(self, rec: list[Any], save: bool = True) -> None:
        inst = self._instance(rec)
        before = self.table.get(inst.slot)
        if before is not None and before.pid != inst.pid and not before.props_sent:
            self.departed.append(before)
        self.table[inst.slot] = inst
        if save:
            self.save()

    def _instance(self, rec: list[Any]) -> Instance:
        pid, slot = self._pid_and_slot(rec)
        service, instance, props, layer = (
            rec[R.WS_SERVICE],
            rec[R.WS_INSTANCE],
            rec[R.WS_PROPERTIES],
            rec[R.WS_LAYER],
        )
        if not isinstance(service, str) or not isinstance(instance, str) or not isinstance(props, list):
            raise TypeError("bad field types")
        return Instance(
            record=rec,
            pid=pid,
            slot=slot,
            service=service,
            instance=instance,
            layer=layer if isinstance(layer, str) else "",
            properties=self._properties(rec),
        )

    def _properties(self, rec: list[Any]) -> list[tuple[str, str]]:
        if self._host_props is None:
            self._host_props = host_properties()
        pid, slot, props, namespace = rec[R.WS_PID], rec[R.WS_SLOT], rec[R.WS_PROPERTIES], rec[R.WS_NAMESPACE]
        merged: dict[str, str] = dict(self._host_props)
        merged["Process No."] = str(pid)
        ns = namespace if isinstance(namespace, str) and namespace else self.journal.settings.namespace
        if ns:
            merged["namespace"] = ns
        merged["slot"] = str(slot)
        for i in range(0, len(props) - 1, 2):
            merged[str(props[i])] = str(props[i + 1])
        return list(merged.items())

    # -- the table on disk -----------------------------------------------------------------
    def save(self) -> None:
        """Persist the table beside the arena, so a restarted reporter keeps them alive."""
        try:
            # 0600 through an unguessable O_EXCL temporary: a link planted at either name is
            # replaced, never written through.
            private.write_file(self._path, orjson.dumps([i.record for i in self.table.values()]))
        except OSError as exc:
            self.journal.log_once(
                "instances-file", logging.WARNING, "cannot save the instance table: %s", exc
            )

    def restore(self) -> None:
        try:
            saved = orjson.loads(private.read_file(self._path))
        except private.UnsafePathError as exc:  # not written by us: never trust its content
            self.journal.log_once("instances-unsafe", logging.WARNING, "ignoring the instance table: %s", exc)
            return
        except (OSError, orjson.JSONDecodeError):
            return
        live = self.live_slots()
        for rec in saved if isinstance(saved, list) else []:
            try:
                # A list, as save() writes: a dict's rec[n] is a KeyError, which killed every
                # reporter started on this table (the file outlives them).
                if type(rec) is list and live.get(int(rec[R.WS_SLOT])) == int(rec[R.WS_PID]):
                    self._started(rec, save=False)
            except (TypeError, ValueError, IndexError):
                continue

    def remove_file(self) -> None:
        try:
            os.unlink(self._path)
        except OSError:
            pass

    def live_slots(self) -> dict[int, int]:
        live = self.arena.live_slots()
        if self._own_process_slots:
            # Our own process's slot locks are invisible to F_GETLK: trust WORKER_STOP instead.
            me = os.getpid()
            for slot, inst in self.table.items():
                if inst.pid == me:
                    live[slot] = me
        return live

    def table_live(self) -> dict[int, int]:
        """``{slot: pid}`` of the table's slots that are held: what the keeper needs each
        tick. Only these slots are looked at - a lock query each (in a forked reporter the
        arena's inherited descriptor is checked too: about three system calls a slot) -
        not every slot of the arena, which cost ~200 system calls a second in an idle
        reporter with 64 slots."""
        me = os.getpid() if self._own_process_slots else 0
        # One check of the arena's descriptor (an fstat) for all of them, then a lock query
        # each: not a descriptor check per slot.
        asked = [slot for slot, inst in self.table.items() if inst.pid != me]
        out = self.arena.live_slots(asked) if asked else {}
        if me:  # thread mode: our own locks are invisible to F_GETLK
            out.update((slot, me) for slot, inst in self.table.items() if inst.pid == me)
        return out

    def refresh_live(self, now: float, every: float = 0.1) -> dict[int, int]:
        """The live slots, looked up at most once per ``every`` seconds."""
        if now - self.last_live_check >= every:
            self.last_live_check = now
            self.live = self.live_slots()
        return self.live

    # -- the keeper task -------------------------------------------------------------------
    async def run(self) -> None:
        s = self.journal.settings
        tick = min(1.0, max(0.05, s.keepalive_interval_s))
        while True:
            live = self.table_live()
            gone = [slot for slot, inst in self.table.items() if inst.leaving or live.get(slot) != inst.pid]
            if gone:
                for slot in gone:
                    self.departed.append(self.table.pop(slot))
                self.save()
            await self._announce_departed()
            if self.managed:
                for inst in list(self.table.values()):
                    if self.stop.stopping:
                        break
                    if time.monotonic() >= inst.due and self.table.get(inst.slot) is inst:
                        await self.keep_alive(inst)
            await until_next_tick(tick)

    async def _announce_departed(self) -> None:
        """Announce once the workers that left unannounced, then forget them. Each stays in
        ``departed`` until its attempt is over: the stop cancels this task, possibly in the
        middle of one, and ``announce_unannounced`` then finds it there (taken out first, it
        was lost: a one-shot program's instance stayed without properties, seen against the
        OAP)."""
        for inst in list(self.departed):
            if not inst.props_sent and self.managed:
                await self.keep_alive(inst)
            self.departed = [d for d in self.departed if d is not inst]

    async def keep_alive(self, inst: Instance) -> None:
        s = self.journal.settings
        c = self.journal.counters
        timeout = s.send_timeout_s + 1.0
        try:
            if not inst.props_sent or inst.pings_since_props >= s.properties_every_n_keepalives:
                await limited(
                    self.sender.report_properties(inst.service, inst.instance, inst.properties, inst.layer),
                    timeout,
                )
                inst.props_sent = True
                inst.pings_since_props = 0
                c.add(c.sent, "properties")
            await limited(self.sender.keep_alive(inst.service, inst.instance, inst.layer), timeout)
        except UnsupportedError as exc:
            self.journal.log_once(
                "unsupported-management", logging.WARNING, "%s; instances are not kept alive", exc
            )
            inst.due = float("inf")
            return
        except (SendError, asyncio.TimeoutError, OSError) as exc:
            c.failure(f"{type(exc).__name__}: {exc}")
            inst.failures += 1
            inst.due = time.monotonic() + min(s.keepalive_interval_s, self._backoff(inst.failures))
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.journal.log_once(
                "keepalive-error", logging.ERROR, "keep-alive for %s failed: %r", inst.instance, exc
            )
            inst.due = time.monotonic() + s.keepalive_interval_s
            return
        c.success()
        c.add(c.sent, "keepalive")
        inst.failures = 0
        inst.pings_since_props += 1
        inst.last_keepalive_ns = time.time_ns()
        inst.due = time.monotonic() + s.keepalive_interval_s

    async def announce_unannounced(self) -> None:
        """At shutdown, announce instances the keeper never got to (a program that lived
        shorter than one keeper tick), within what is left of the deadline.

        A failed attempt is tried again after the usual backoff, as a batch of records is:
        a short-lived program's first sends often meet a connection still being made (or a
        Kafka partition leader still being elected), and with one attempt only its segments,
        retried, reached the OAP while its instance stayed without properties."""
        if not self.managed:
            return
        attempt = 0
        while True:
            candidates = [*self.departed, *self.table.values()]
            pending = [i for i in candidates if not i.props_sent and i.due != math.inf]
            if not pending or self.stop.remaining() <= 0:
                return
            if attempt:
                await asyncio.sleep(min(self._backoff(attempt), self.stop.remaining()))
                if self.stop.remaining() <= 0:
                    return
            attempt += 1
            try:
                await limited(asyncio.gather(*(self.keep_alive(i) for i in pending)), self.stop.remaining())
            except (asyncio.TimeoutError, Exception) as exc:
                log.debug("announcing instances at shutdown: %r", exc)
                return


def host_properties() -> list[tuple[str, str]]:
    """Instance properties that describe this host (the same for every worker)."""
    return [
        ("language", "python"),
        ("OS Name", platform.system() or os.name),
        ("hostname", socket.gethostname()),
        ("ipv4", "; ".join(_ipv4_addresses())),
        ("python_implementation", platform.python_implementation()),
        ("python_version", platform.python_version()),
    ]


def _ipv4_addresses() -> list[str]:
    # Interface addresses, not DNS: a resolver that hangs must not stall the reporter.
    try:
        import psutil  # noqa: PLC0415  (only the reporter needs it)

        out = []
        for addrs in psutil.net_if_addrs().values():
            for a in addrs:
                if a.family == socket.AF_INET and not a.address.startswith("127."):
                    out.append(a.address)
        return out or ["127.0.0.1"]
    except Exception:
        return []
