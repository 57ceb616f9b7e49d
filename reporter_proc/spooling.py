"""Spool and replay: the disk buffer for long backend outages.

:class:`SpoolWriter` opens the service's spool directory and appends records to it
(raw ring payloads, so nothing is re-encoded on the way to disk), counting what it cannot
write. :class:`Replayer` sends the oldest spooled records back once the backend answers
again, while the reporter's memory is not busy with live records.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson

from reporter_proc import isolation
from reporter_proc import records as R
from reporter_proc.journal import Journal
from reporter_proc.lifecycle import StopState
from reporter_proc.senders.base import (
    FatalSendError,
    InvalidDataError,
    Record,
    TooLargeError,
    UnsupportedError,
)
from reporter_proc.spool import Spool, SpoolBusy, SpoolFile, SpoolShortWrite
from reporter_proc.spooldir import AUTO, OFF_VALUES, SpoolUnsafe, auto_base
from reporter_proc.ticks import IDLE_CHECK_S, until_next_tick

log = logging.getLogger("swmp.reporter")

_MAX_SIBLINGS = 16  # spool directories one service may use on a host at once


# A service's directory name is at most this long: a file name has 255 bytes, and the
# sibling suffix (".15") must still fit.
_NAME_MAX = 200


def spool_name(service: str) -> str:
    """The service's directory under the spool base: a plain name of at most _NAME_MAX
    characters. A longer service name disabled the spool ("File name too long"), and "." or
    ".." named the base itself or its parent, so the spool files landed outside it."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", service)[:_NAME_MAX]
    if name.strip(".") == "":  # "", ".", "..": not a directory of its own
        name = "default" if not name else name.replace(".", "_")
    return name


class SpoolWriter:
    def __init__(self, spool: Spool, journal: Journal) -> None:
        self.spool = spool
        self.journal = journal
        self.write_drops = 0  # records the disk refused

    @classmethod
    def open(cls, journal: Journal) -> SpoolWriter | None:
        """The spool of this service, or None when spooling is off or impossible."""
        s = journal.settings
        base = s.spool_dir.strip()
        if base.lower() in OFF_VALUES or s.spool_max_bytes <= 0:
            return None
        if base.lower() == AUTO:
            try:
                base = auto_base()
            except OSError as exc:
                log.error("spool disabled, no private directory for it: %s", exc)
                return None
        name = spool_name(s.service)
        spool: Spool | None = None
        # Several applications of one service on a host (same user) each need a directory of
        # their own: the first free one of <service>, <service>.1, ... (the lock says which
        # are free; a free one left over by an earlier run is replayed by whoever takes it).
        for n in range(_MAX_SIBLINGS):
            directory = os.path.join(base, name if n == 0 else f"{name}.{n}")
            try:
                spool = Spool(directory, s.spool_max_bytes, s.spool_segment_bytes)
                break
            except SpoolBusy:
                continue
            except SpoolUnsafe as exc:
                log.error("spool disabled, its directory is not private: %s", exc)
                return None
            except OSError as exc:
                log.error("spool disabled: %s", exc)
                return None
        if spool is None:
            log.error("spool disabled: %s", f"{_MAX_SIBLINGS} spool directories of {name} are in use")
            return None
        if spool.total_records:
            log.info("spool %s holds %d records to replay", directory, spool.total_records)
        return cls(spool, journal)

    def write(self, items: list[tuple[int, bytes]]) -> None:
        if not items:
            return
        try:
            self.spool.append(items)
        except OSError as exc:
            self.journal.log_once("spool-write", logging.ERROR, "cannot write to the spool: %s", exc)
            kept = exc.records if isinstance(exc, SpoolShortWrite) else 0  # on disk: replayed
            self.journal.counters.spooled += kept
            self.write_drops += len(items) - kept
            return
        self.journal.counters.spooled += len(items)

    @property
    def dropped(self) -> int:
        return self.spool.dropped_records + self.write_drops


Send = Callable[[str, list[Record]], Awaitable[None]]


@dataclass
class _Read:
    """One read of the spool on its way out: what is still to send, by kind.

    It outlives a failed attempt, so the retry sends only the groups not sent yet (a group
    sent before the failure is neither sent nor counted again)."""

    file: SpoolFile
    end: int  # the file's offset after the read, acknowledged once every group is done
    count: int  # records read
    groups: dict[str, list[Record]]


class Replayer:
    """Sends spooled records, oldest file first; acknowledges a read once it is resolved."""

    def __init__(
        self,
        writer: SpoolWriter,
        journal: Journal,
        send: Send,
        *,
        stop: StopState,
        busy: Callable[[], bool],
        backoff: Callable[[int], float],
    ) -> None:
        self.spool = writer.spool
        self.journal = journal
        self._send = send
        self.stop = stop
        self._busy = busy  # True while live records fill memory: they go first
        self._backoff = backoff
        self.pending: _Read | None = None  # the read being replayed

    async def run(self) -> None:
        failures = 0
        while not self.stop.closing:
            # Live records first: nothing is replayed while they fill memory or while stopping.
            if self.stop.stopping or self._busy() or not self.next_read():
                # Look again on the reporter's next one-second tick, in the same wake-up as
                # its other periodic work.
                await until_next_tick(IDLE_CHECK_S)
                continue
            failure = await self.replay()
            if failure is not None:
                self.journal.counters.failure(f"{type(failure).__name__}: {failure}")
                failures += 1
                await asyncio.sleep(self._backoff(failures))
                continue
            failures = 0
            await asyncio.sleep(0)  # the next read at once, after the loop's other work

    def next_read(self) -> bool:
        """Is there a read to replay? The one a failure interrupted, else the spool's next."""
        if self.pending is None:
            f = self.spool.oldest()
            if f is None:
                return False
            items, end = self.spool.read(f, self.journal.settings.batch_max_records)
            self.pending = _Read(f, end, len(items), self._groups(items))
        return True

    def _groups(self, items: list[tuple[int, bytes]]) -> dict[str, list[Record]]:
        """The records of a read by kind; unreadable ones are counted and left out."""
        groups: dict[str, list[Record]] = {}
        for rtype, payload in items:
            kind = R.BY_TYPE.get(rtype)
            rec = _decode_one(kind, payload)
            if kind is None or rec is None:
                self.journal.invalid(f"spooled record of type {rtype} is unreadable")
                continue
            groups.setdefault(kind.name, []).append(rec)
        return groups

    async def replay(self) -> BaseException | None:
        """Send what is left of the pending read, then acknowledge it.

        Returns the retryable failure that interrupted it (what is not sent yet stays
        pending), or None once the read is resolved; refused records are counted.
        """
        read = self.pending
        assert read is not None
        j = self.journal
        for name in list(read.groups):
            reason = j.shut.get(name)  # shut since the read, perhaps, by live delivery
            if reason is not None:
                j.dropped(reason, len(read.groups.pop(name)))
                continue
            failure = await self._send_group(read, name)
            if failure is not None:
                return failure
            del read.groups[name]
        self.spool.ack(read.file, read.end, read.count)
        self.pending = None
        return None

    async def _send_group(self, read: _Read, name: str) -> BaseException | None:
        """Send the read's records of one kind as live delivery sends a batch: a group refused
        as too large or invalid is halved until the records to blame are alone, one the
        encoder chokes on is sent record by record. Returns the retryable failure that
        stopped it; its records not sent yet stay in ``read``."""
        j = self.journal
        c = j.counters
        while recs := read.groups[name]:
            n = len(recs)
            try:
                await self._send(name, recs)
            except UnsupportedError as exc:
                j.unsupported(name, n, exc)
                read.groups[name] = []
            except (TooLargeError, InvalidDataError) as exc:
                keep: list[Record] = []
                c.replayed += await isolation.split(j, self._send, name, recs, exc, keep=keep)
                read.groups[name] = keep
                if len(keep) == n:
                    return exc  # the parts failed for another reason: try again later
            except FatalSendError as exc:
                c.failure(f"{type(exc).__name__}: {exc}")
                j.dropped("rejected", n)
                c.failed += 1
                j.log_once(f"fatal-{name}", logging.ERROR, "backend refused %s records: %s", name, exc)
                read.groups[name] = []
            except isolation.RETRYABLE as exc:
                return exc
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the encoder choked on something: find the bad records
                if n == 1:
                    j.invalid(f"spooled {name} record could not be encoded: {exc!r}")
                    read.groups[name] = []
                    continue
                keep, sent = await isolation.isolate(j, self._send, name, recs)
                c.replayed += sent
                read.groups[name] = keep
            else:
                # Only a send the backend took says it is up (not a read with nothing to send).
                c.success()
                c.add(c.sent, name, n)
                c.replayed += n
                read.groups[name] = []
        return None


def _decode_one(kind: R.Kind | None, payload: bytes) -> Record | None:
    """The record, or None when it is not one live delivery's decode would send on."""
    if kind is None or not kind.data:
        return None
    try:
        rec = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return rec if type(rec) is list and len(rec) >= kind.min_len else None
