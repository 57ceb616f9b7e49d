"""The reporter's work: drain every ring, batch per kind, send, retry, spool, keep instances alive.

One :class:`Reporter` runs on one asyncio event loop, in the reporter process or on the
thread-mode background thread (same code either way). Its pieces are cooperative tasks:

* the **drain loop** reads all rings, decodes records (orjson), puts them in per-kind
  batches and seals a batch when it is full or old; it sleeps on the doorbell FIFO when
  every ring is empty (bounded by ``poll_interval_s``) and stops reading when
  ``max_pending_bytes`` are in flight (or spools straight to disk when a spool is set);
* one **kind worker** per kind sends that kind's sealed batches in order, retrying with
  jittered exponential backoff, then spooling or counting the batch as dropped;
* the **instance keeper** announces every worker (WORKER_START) and keeps it alive;
* the **replayer** sends spooled records once the backend answers again;
* the **status task** heartbeats and publishes the status document at least once a second.

Delivery is at-least-once: a ring position is committed only when every record before it
has been sent, spooled or deliberately given up, so a reporter that dies leaves its unsent
records in the rings for the next one (a ring reader starts at the committed head).
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import random
import re
import select
import signal
import socket
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ipc import Arena, DoorbellListener, RingReader, process_alive
from reporter_proc import records as R
from reporter_proc.senders.base import FatalSendError, Record, Sender, SendError, UnsupportedError
from reporter_proc.settings import ReporterSettings
from reporter_proc.spool import Spool, SpoolBusy
from reporter_proc.status import Counters, InstanceView, Rates, build_document

log = logging.getLogger("swmp.reporter")

# Exit statuses. Never 3 or 4: Gunicorn <= 23 halts the whole server when any child it
# reaps exits with those.
EXIT_OK = 0
EXIT_ERROR = 70  # EX_SOFTWARE: something broke; the supervisor restarts us
EXIT_CONFIG = 78  # EX_CONFIG: restarting cannot help (no such protocol, bad settings)

# Data record type -> batch kind (also the counter names in the status document).
_KIND_OF: dict[int, str] = {
    R.SEGMENT: "segment",
    R.LOG: "log",
    R.METER: "meter",
    R.PROFILE_SNAPSHOT: "profile_snapshot",
    R.PROFILE_FINISH: "profile_finish",
}
_TYPE_OF: dict[str, int] = {v: k for k, v in _KIND_OF.items()}
# Batch kind -> the Sender capability (``Sender.supports``) it needs.
_CAPABILITY: dict[str, str] = {
    "segment": "segment",
    "log": "log",
    "meter": "meter",
    "profile_snapshot": "profile",
    "profile_finish": "profile",
}
# Shortest valid positional record per type (longer ones are accepted: fields may be added).
_MIN_LEN: dict[int, int] = {
    R.SEGMENT: 6,
    R.LOG: 11,
    R.METER: 4,
    R.PROFILE_SNAPSHOT: 5,
    R.PROFILE_FINISH: 3,
    R.WORKER_START: 7,
    R.WORKER_STOP: 2,
}
_READ_CHUNK = 256  # records taken from one ring before looking at the next
_LINGER_S = 0.01  # after a busy pass: poll again this soon, doorbell unarmed (see _drain_loop)
# Records one drain pass may take before it yields to the event loop. A 20-span segment
# decodes in ~25 us, so a pass stays in the tens of milliseconds: sends, keep-alives and
# the heartbeat (at least once a second) never wait long behind a busy drain.
_PASS_BUDGET = 1024


def make_sender(settings: ReporterSettings) -> Sender:
    """The sender for ``settings.protocol``; imported here, lazily, after fork."""
    if settings.protocol == "memory":
        from reporter_proc.senders.memory import MemorySender  # noqa: PLC0415

        return MemorySender(path=settings.memory_path, fail_next=settings.memory_fail_first)
    # grpc / aiohttp / aiokafka live behind this import: never load them before fork.
    from reporter_proc.senders import create_sender  # noqa: PLC0415

    return create_sender(settings)


class _Chunk:
    """The records one ``read()`` took from one ring; the ring head may pass ``end`` once
    every record in it is resolved (sent, spooled, dropped)."""

    __slots__ = ("end", "left", "slot")

    def __init__(self, slot: int, end: int) -> None:
        self.slot = slot
        self.end = end
        self.left = 0


class _Batch:
    __slots__ = ("born", "chunks", "kind", "nbytes", "records", "spilled")

    def __init__(self, kind: str, born: float) -> None:
        self.kind = kind
        self.records: list[Record] = []
        self.chunks: dict[_Chunk, int] = {}
        self.nbytes = 0
        self.born = born
        self.spilled = False  # already copied to the spool (and resolved)


@dataclass
class _Instance:
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
    extra: dict[str, Any] = field(default_factory=dict)


class Reporter:
    """Drains one arena and ships its records through one :class:`Sender`."""

    def __init__(
        self,
        arena: Arena,
        settings: ReporterSettings,
        *,
        sender: Sender | None = None,
        mode: str = "process",
        owner_pid: int = 0,
        restarts: int = 0,
    ) -> None:
        self.arena = arena
        self.settings = settings
        self.sender = sender
        self.mode = mode
        self.owner_pid = owner_pid
        self.restarts = restarts
        self.counters = Counters()
        self.rates = Rates()
        self.exit_code = EXIT_OK
        self.stop_reason = ""
        self.started_ns = time.time_ns()
        self.pending_bytes = 0
        self.spool: Spool | None = None
        self.instances: dict[int, _Instance] = {}
        self.owner_dead = False
        self.ready = False  # the reporter role is ours and the tasks are running
        self.finished = False

        self._read_counts: dict[int, int] = {}
        self._readers: list[RingReader] = []
        self._next_reader = 0  # round-robin start of the next drain pass
        self._chunks: dict[int, deque[_Chunk]] = {}
        self._open: dict[str, _Batch] = {}
        self._queues: dict[str, deque[_Batch]] = {k: deque() for k in _TYPE_OF}
        self._queue_events: dict[str, asyncio.Event] = {}
        self._drop_kinds: dict[str, str] = {}  # kind -> dropped.<reason>
        self._logged: set[str] = set()
        self._stopping = False
        self._closing = False
        self._deadline = 0.0
        self._drain_deadline = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._bell = False
        self._listener: DoorbellListener | None = None
        self._owner_fd = -1
        self._tasks: list[asyncio.Task[None]] = []
        self._stop_requested_early = ""
        self._host_props: list[tuple[str, str]] | None = None
        self._last_live_check = 0.0
        self._spool_write_drops = 0
        self._live: dict[int, int] = {}
        self._instances_path = arena.path + ".instances"

    # -- control ---------------------------------------------------------------------------
    def request_stop(self, reason: str = "stop") -> None:
        """Begin the graceful shutdown. Call on the reporter's loop (see stop_threadsafe)."""
        if self._loop is None:
            self._stop_requested_early = reason
            return
        if self._stopping:
            return
        self._stopping = True
        self.stop_reason = reason
        now = time.monotonic()
        deadline_s = max(0.0, self.settings.shutdown_deadline_s)
        self._deadline = now + deadline_s
        # Most of the budget is for draining; the rest is for sending what is in flight.
        self._drain_deadline = now + 0.7 * deadline_s
        log.info("reporter %d stopping (%s), deadline %.1f s", os.getpid(), reason, deadline_s)
        self._poke()

    def stop_threadsafe(self, reason: str = "stop") -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            self._stop_requested_early = reason
            return
        try:
            loop.call_soon_threadsafe(self.request_stop, reason)
        except RuntimeError:  # the loop closed in between
            pass

    # -- main ------------------------------------------------------------------------------
    async def run(self) -> int:
        """Run until stopped; returns the exit status for the process."""
        self._loop = asyncio.get_running_loop()
        if not self.arena.try_become_reporter():
            log.info(
                "another reporter (pid %s) drains %s; exiting", self.arena.reporter_pid(), self.arena.path
            )
            self.finished = True
            return EXIT_OK
        try:
            code = await self._run_as_reporter()
        except Exception:
            log.exception("reporter failed")
            code = EXIT_ERROR
        finally:
            self._teardown()
        self.finished = True
        return code

    async def _run_as_reporter(self) -> int:
        s = self.settings
        loop = self._loop
        assert loop is not None
        self.arena.status.heartbeat()
        if self.mode == "process":
            # First: a SIGTERM during start-up must mean "stop", not "die" (which the
            # supervisor would take for a crash and answer with a restart).
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
                loop.add_signal_handler(sig, self.request_stop, signal.Signals(sig).name)
        if self.sender is None:
            try:
                self.sender = make_sender(s)
            except Exception as exc:
                log.error("cannot create the %r sender: %s", s.protocol, exc)
                return EXIT_CONFIG
        try:
            await self.sender.start()
        except Exception as exc:
            log.error("the %s sender did not start: %s", s.protocol, exc)
            return EXIT_ERROR
        self._check_capabilities()
        self._open_spool()
        self._readers = [self.arena.reader(slot) for slot in range(self.arena.slots)]
        self._chunks = {r.slot: deque() for r in self._readers}
        self._listener = DoorbellListener(self.arena.path)
        loop.add_reader(self._listener.fileno(), self._on_bell)
        self._watch_owner()
        self._restore_instances()
        for kind in self._queues:
            self._queue_events[kind] = asyncio.Event()
            self._spawn(self._kind_worker(kind), f"send-{kind}")
        self._spawn(self._instance_keeper(), "instances")
        self._spawn(self._status_task(), "status")
        if self.spool is not None:
            self._spawn(self._replayer(), "replay")
        self.ready = True
        self._publish()
        if self._stop_requested_early:  # stop() from another thread before the loop ran
            self.request_stop(self._stop_requested_early)
        await self._drain_loop()
        await self._flush_and_close()
        return self.exit_code

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        task.set_name(f"swmp-reporter-{name}")
        task.add_done_callback(self._task_done)
        self._tasks.append(task)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("reporter task %s failed: %r", task.get_name(), exc, exc_info=exc)
            self.exit_code = EXIT_ERROR
            self.request_stop("internal error")

    # -- start-up helpers ------------------------------------------------------------------
    def _check_capabilities(self) -> None:
        s = self.settings
        assert self.sender is not None
        supports = self.sender.supports
        for kind, enabled in (
            ("log", s.log_enabled),
            ("meter", s.meter_enabled),
            ("profile_snapshot", s.profile_enabled),
            ("profile_finish", s.profile_enabled),
        ):
            if not enabled:
                self._drop_kinds[kind] = "disabled"
        missing = sorted(
            {_CAPABILITY[k] for k in _TYPE_OF if k not in self._drop_kinds and _CAPABILITY[k] not in supports}
        )
        if "management" not in supports:
            missing.append("management")
        if missing:
            log.warning(
                "the %s protocol cannot carry %s: such records are counted as dropped.unsupported",
                s.protocol,
                ", ".join(missing),
            )
        for kind, cap in _CAPABILITY.items():
            if cap not in supports and kind not in self._drop_kinds:
                self._drop_kinds[kind] = "unsupported"

    def _open_spool(self) -> None:
        s = self.settings
        if not s.spool_dir:
            return
        directory = os.path.join(s.spool_dir, re.sub(r"[^A-Za-z0-9_.-]", "_", s.service) or "default")
        try:
            self.spool = Spool(directory, s.spool_max_bytes, s.spool_segment_bytes)
        except (OSError, SpoolBusy) as exc:
            log.error("spool disabled: %s", exc)
            self.spool = None
            return
        if self.spool.total_records:
            log.info("spool %s holds %d records to replay", directory, self.spool.total_records)

    def _watch_owner(self) -> None:
        if self.mode != "process" or self.owner_pid <= 0:
            return
        info = self.arena.info()
        ticks = info.owner_start_ticks if info.owner_pid == self.owner_pid else 0
        if not process_alive(self.owner_pid, ticks):
            self._owner_died()
            return
        try:
            self._owner_fd = os.pidfd_open(self.owner_pid)
        except ProcessLookupError:
            self._owner_died()
            return
        except (OSError, AttributeError) as exc:  # old kernel: fall back to polling in the status task
            log.warning("pidfd_open(%d) failed (%s); watching the owner by polling", self.owner_pid, exc)
            return
        assert self._loop is not None
        self._loop.add_reader(self._owner_fd, self._owner_died)

    def _owner_died(self) -> None:
        if self._owner_fd >= 0 and self._loop is not None:
            self._loop.remove_reader(self._owner_fd)
            os.close(self._owner_fd)
            self._owner_fd = -1
        if not self.owner_dead:
            self.owner_dead = True
            log.info("owner process %d is gone", self.owner_pid)
        self.request_stop("owner died")

    # -- waking and sleeping ---------------------------------------------------------------
    def _on_bell(self) -> None:
        if self._listener is not None:
            self._listener.drain()
        self._bell = True
        self._poke()

    def _poke(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _sleep(self, timeout: float) -> None:
        loop = self._loop
        assert loop is not None
        fut: asyncio.Future[None] = loop.create_future()
        self._waiter = fut
        handle = loop.call_later(max(0.0, timeout), _resolve, fut)
        try:
            await fut
        finally:
            handle.cancel()
            self._waiter = None

    # -- the drain loop --------------------------------------------------------------------
    async def _drain_loop(self) -> None:
        s = self.settings
        status = self.arena.status
        flush_after = s.flush_interval_s
        busy = False
        while True:
            n = self._drain_pass()
            now = time.monotonic()
            self._seal_due(now, flush_after)
            if self._stopping and (now >= self._drain_deadline or self._drained_for_stop(now)):
                return
            if n:
                busy = True
                await asyncio.sleep(0)  # let the senders run between passes
                continue
            timeout = s.poll_interval_s
            if self._open:
                oldest = min(b.born for b in self._open.values())
                timeout = min(timeout, max(0.0, oldest + flush_after - now))
            if self._stopping:
                timeout = min(timeout, 0.05)
            if busy:
                # Records were flowing: linger a moment with the doorbell *unarmed* before
                # sleeping for real. Under steady load the next pass finds a batch, writers
                # never ring, and wake-ups stay at ~1/_LINGER_S instead of one per record
                # (a FIFO write in the worker and a whole wake-up here, each).
                busy = False
                await self._sleep(min(timeout, _LINGER_S))
                continue
            if self._memory_full():
                # Waiting for sends, not for writers: do not make writers ring the bell.
                await self._sleep(timeout)
                continue
            status.set_sleeping(True)
            # Re-check after announcing sleep: a writer that published before seeing the
            # flag did not ring.
            if any(r.pending() for r in self._readers):
                status.set_sleeping(False)
                continue
            await self._sleep(timeout)
            status.set_sleeping(False)
            if self._bell:
                self._bell = False
                status.count_wakeup()

    def _memory_full(self) -> bool:
        return self.pending_bytes >= self.settings.max_pending_bytes and self.spool is None

    def _drained_for_stop(self, now: float) -> bool:
        if any(r.pending() for r in self._readers):
            return False
        if self.owner_dead and now < self._deadline:
            # Workers outlive the master by a moment: keep draining while they still hold slots.
            if now - self._last_live_check >= 0.1:
                self._last_live_check = now
                self._live = self._live_slots()
            return not self._live
        return True

    def _drain_pass(self) -> int:
        limit = self.settings.max_pending_bytes
        if self.pending_bytes >= limit:
            if self.spool is None:
                return 0
            self._spill()
        total = 0
        chunks = self._chunks
        readers = self._readers
        count = len(readers)
        start = self._next_reader
        for i in range(count):
            reader = readers[(start + i) % count]
            if not reader.pending():
                continue
            if total >= _PASS_BUDGET:
                # Yield to the senders and the status task; carry on from this ring next pass.
                self._next_reader = reader.slot
                break
            # Bounded by bytes too, so the memory cap is overshot by one record at most.
            recs = reader.read(_READ_CHUNK, limit - self.pending_bytes)
            chunk = _Chunk(reader.slot, reader.cursor)
            chunks[reader.slot].append(chunk)
            if recs:
                total += len(recs)
                self._dispatch(recs, chunk)
            if chunk.left == 0:
                self._advance(reader.slot)
            if self.pending_bytes >= limit:
                if self.spool is None:
                    break
                self._spill()
        return total

    def _spill(self) -> None:
        """Memory is full and a spool is set: move every unsent batch to disk.

        Their records count as resolved, so the rings move on. A batch whose send is in
        progress is copied too: if that send succeeds after all, replay sends it again
        (at-least-once, as documented).
        """
        for kind in list(self._open):
            self._seal(kind)
        for queue in self._queues.values():
            for batch in queue:
                if not batch.spilled and batch.records:
                    batch.spilled = True
                    self._to_spool([(_TYPE_OF[batch.kind], orjson.dumps(r)) for r in batch.records])
                    self._resolve(batch)
        self._log_once("spill", logging.WARNING, "reporter memory full: spilling unsent records to the spool")

    def _dispatch(self, recs: list[tuple[int, bytes]], chunk: _Chunk) -> None:
        loads = orjson.loads
        counts = self._read_counts
        kind_of = _KIND_OF
        min_len = _MIN_LEN
        drop_kinds = self._drop_kinds
        open_batches = self._open
        batch_max = self.settings.batch_max_records
        for rtype, payload in recs:
            counts[rtype] = counts.get(rtype, 0) + 1
            kind = kind_of.get(rtype)
            try:
                rec = loads(payload)
            except orjson.JSONDecodeError as exc:
                self._invalid(f"record of type {rtype} is not JSON: {exc}")
                continue
            if type(rec) is not list or len(rec) < min_len.get(rtype, 0):
                self._invalid(f"record of type {rtype} does not have the layout of records.py")
                continue
            if kind is None:
                if rtype in (R.WORKER_START, R.WORKER_STOP):
                    self._worker_record(rtype, rec)
                else:
                    self._invalid(f"unknown record type {rtype}")
                continue
            reason = drop_kinds.get(kind)
            if reason is not None:
                self.counters.add(self.counters.dropped, reason)
                continue
            batch = open_batches.get(kind)
            if batch is None:
                batch = open_batches[kind] = _Batch(kind, time.monotonic())
            batch.records.append(rec)
            n = len(payload)
            batch.nbytes += n
            self.pending_bytes += n
            batch.chunks[chunk] = batch.chunks.get(chunk, 0) + 1
            chunk.left += 1
            if len(batch.records) >= batch_max:
                self._seal(kind)

    def _to_spool(self, items: list[tuple[int, bytes]]) -> bool:
        spool = self.spool
        if spool is None or not items:
            return False
        try:
            spool.append(items)
        except OSError as exc:
            self._log_once("spool-write", logging.ERROR, "cannot write to the spool: %s", exc)
            self._spool_write_drops += len(items)
            return True
        self.counters.spooled += len(items)
        return True

    def _invalid(self, why: str, n: int = 1) -> None:
        self.counters.add(self.counters.dropped, "invalid", n)
        self._log_once(
            "invalid", logging.ERROR, "dropping an invalid record (%s); further ones are only counted", why
        )

    def _log_once(self, key: str, level: int, msg: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, msg, *args)

    def _seal_due(self, now: float, flush_after: float) -> None:
        if not self._open:
            return
        for kind in [k for k, b in self._open.items() if now - b.born >= flush_after]:
            self._seal(kind)

    def _seal(self, kind: str) -> None:
        batch = self._open.pop(kind)
        self._queues[kind].append(batch)
        self._queue_events[kind].set()

    def _advance(self, slot: int) -> None:
        """Commit the ring head past every leading chunk that is fully resolved."""
        dq = self._chunks[slot]
        last = None
        while dq and dq[0].left == 0:
            last = dq.popleft()
        if last is not None:
            self._readers[slot].commit(last.end)

    def _resolve(self, batch: _Batch) -> None:
        for chunk, n in batch.chunks.items():
            chunk.left -= n
            if chunk.left == 0:
                self._advance(chunk.slot)
        batch.chunks = {}
        self.pending_bytes -= batch.nbytes
        batch.nbytes = 0
        self._poke()

    # -- sending ---------------------------------------------------------------------------
    async def _kind_worker(self, kind: str) -> None:
        queue = self._queues[kind]
        event = self._queue_events[kind]
        while True:
            if not queue:
                if self._closing:
                    return
                event.clear()
                await event.wait()
                continue
            batch = queue[0]
            await self._deliver(batch)
            queue.popleft()
            self._resolve(batch)

    def _call(self, kind: str, records: list[Record]) -> Awaitable[None]:
        sender = self.sender
        assert sender is not None
        if kind == "segment":
            return sender.send_segments(records)
        if kind == "log":
            return sender.send_logs(records)
        if kind == "meter":
            return sender.send_meters(records)
        if kind == "profile_snapshot":
            return sender.send_snapshots(records)
        return self._finishes(records)

    async def _finishes(self, records: list[Record]) -> None:
        assert self.sender is not None
        for rec in records:
            await self.sender.report_finish(rec)

    async def _send(self, kind: str, records: list[Record]) -> None:
        await asyncio.wait_for(self._call(kind, records), timeout=self.settings.send_timeout_s + 1.0)

    def _backoff(self, attempt: int) -> float:
        s = self.settings
        base = min(s.retry_backoff_max_s, s.retry_backoff_base_s * 2.0 ** (attempt - 1))
        return base * (0.5 + random.random() / 2)  # jitter: workers' reporters do not align

    async def _deliver(self, batch: _Batch) -> None:
        """Send one batch: retries, then spool or drop. Always leaves it resolvable."""
        c = self.counters
        kind = batch.kind
        attempt = 0
        while batch.records:
            n = len(batch.records)
            try:
                await self._send(kind, batch.records)
            except UnsupportedError as exc:
                self._unsupported(kind, n, exc)
                return
            except FatalSendError as exc:
                c.failure(f"{type(exc).__name__}: {exc}")
                c.add(c.dropped, "rejected", n)
                c.failed += 1
                self._log_once(
                    f"fatal-{kind}", logging.ERROR, "backend refused %d %s records: %s", n, kind, exc
                )
                return
            except (SendError, asyncio.TimeoutError, OSError) as exc:
                attempt += 1
                c.failure(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
                now = time.monotonic()
                if attempt >= self.settings.retry_max_attempts or (self._stopping and now >= self._deadline):
                    self._give_up(batch, exc)
                    return
                c.retried += 1
                delay = self._backoff(attempt)
                if self._stopping:
                    delay = min(delay, max(0.0, self._deadline - now))
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the encoder choked on something: find the bad records
                if n == 1:
                    self._invalid(f"{kind} record could not be encoded: {exc!r}")
                    batch.records = []
                    return
                await self._isolate(batch)
            else:
                c.add(c.sent, kind, n)
                c.success()
                return

    async def _isolate(self, batch: _Batch) -> None:
        """Send records one by one so one bad record costs itself, not its batch."""
        keep: list[Record] = []
        for rec in batch.records:
            try:
                await self._send(batch.kind, [rec])
            except UnsupportedError:
                keep.append(rec)  # _deliver counts it on the next round
            except (SendError, asyncio.TimeoutError, OSError):
                keep.append(rec)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._invalid(f"{batch.kind} record could not be encoded: {exc!r}")
            else:
                self.counters.add(self.counters.sent, batch.kind)
                self.counters.success()
        batch.records = keep

    def _unsupported(self, kind: str, n: int, exc: Exception) -> None:
        self._drop_kinds[kind] = "unsupported"
        self.counters.add(self.counters.dropped, "unsupported", n)
        self._log_once(
            f"unsupported-{kind}", logging.WARNING, "%s; %s records are dropped and counted", exc, kind
        )

    def _give_up(self, batch: _Batch, exc: BaseException) -> None:
        c = self.counters
        n = len(batch.records)
        c.failed += 1
        if batch.spilled:  # its copy waits in the spool already
            batch.records = []
            return
        if self.spool is not None:
            rtype = _TYPE_OF[batch.kind]
            self._to_spool([(rtype, orjson.dumps(r)) for r in batch.records])
            self._log_once("spooling", logging.WARNING, "backend unavailable (%r): spooling to disk", exc)
        else:
            c.add(c.dropped, "backend", n)
            self._log_once(
                "giving-up",
                logging.WARNING,
                "backend unavailable (%r): dropped %d %s records after %d attempts; more drops are counted",
                exc,
                n,
                batch.kind,
                self.settings.retry_max_attempts,
            )
        batch.records = []

    # -- spool replay ----------------------------------------------------------------------
    async def _replayer(self) -> None:
        spool = self.spool
        assert spool is not None
        s = self.settings
        c = self.counters
        failures = 0
        delay = 0.0
        while not self._closing:
            await asyncio.sleep(delay)
            delay = 0.2
            if self._stopping or not spool or self.pending_bytes > s.max_pending_bytes // 2:
                continue
            f = spool.oldest()
            if f is None:
                continue
            items, end = spool.read(f, s.batch_max_records)
            groups: dict[str, list[Record]] = {}
            for rtype, payload in items:
                kind = _KIND_OF.get(rtype)
                try:
                    rec = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    rec = None
                if kind is None or type(rec) is not list:
                    self._invalid(f"spooled record of type {rtype} is unreadable")
                    continue
                reason = self._drop_kinds.get(kind)
                if reason is not None:
                    c.add(c.dropped, reason)
                    continue
                groups.setdefault(kind, []).append(rec)
            try:
                for kind, recs in groups.items():
                    try:
                        await self._send(kind, recs)
                    except UnsupportedError as exc:
                        self._unsupported(kind, len(recs), exc)
                        continue
                    except FatalSendError as exc:
                        c.add(c.dropped, "rejected", len(recs))
                        self._log_once(
                            f"fatal-{kind}", logging.ERROR, "backend refused %s records: %s", kind, exc
                        )
                        continue
                    c.add(c.sent, kind, len(recs))
                    c.replayed += len(recs)
            except (SendError, asyncio.TimeoutError, OSError) as exc:
                c.failure(f"{type(exc).__name__}: {exc}")
                failures += 1
                delay = self._backoff(failures)
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._invalid(f"spooled records could not be encoded: {exc!r}", len(items))
            c.success()
            failures = 0
            spool.ack(f, end, len(items))
            delay = 0.0

    # -- instances -------------------------------------------------------------------------
    def _worker_record(self, rtype: int, rec: list[Any]) -> None:
        try:
            if rtype == R.WORKER_START:
                self._instance_started(rec)
            else:
                pid, slot = int(rec[0]), int(rec[1])
                inst = self.instances.get(slot)
                if inst is not None and inst.pid == pid:
                    if not inst.props_sent:
                        # Not announced yet (it lived less than a keeper tick): the keeper
                        # announces it once, then forgets it (or the shutdown announces it).
                        inst.leaving = True
                        return
                    del self.instances[slot]
                    self._save_instances()
        except (TypeError, ValueError, IndexError) as exc:
            self._invalid(f"worker record {rec!r:.100}: {exc}")

    def _instance_started(self, rec: list[Any], save: bool = True) -> None:
        pid, slot, service, instance, props, layer = int(rec[0]), int(rec[1]), rec[2], rec[3], rec[4], rec[5]
        if not isinstance(service, str) or not isinstance(instance, str) or not isinstance(props, list):
            raise TypeError("bad field types")
        self.instances[slot] = _Instance(
            record=rec,
            pid=pid,
            slot=slot,
            service=service,
            instance=instance,
            layer=layer if isinstance(layer, str) else "",
            properties=self._properties(rec),
        )
        if save:
            self._save_instances()

    def _properties(self, rec: list[Any]) -> list[tuple[str, str]]:
        if self._host_props is None:
            self._host_props = host_properties()
        pid, slot, props, namespace = rec[0], rec[1], rec[4], rec[6]
        merged: dict[str, str] = dict(self._host_props)
        merged["Process No."] = str(pid)
        ns = namespace if isinstance(namespace, str) and namespace else self.settings.namespace
        if ns:
            merged["namespace"] = ns
        merged["slot"] = str(slot)
        for i in range(0, len(props) - 1, 2):
            merged[str(props[i])] = str(props[i + 1])
        return list(merged.items())

    def _save_instances(self) -> None:
        """Persist the instance table beside the arena, so a restarted reporter keeps them alive."""
        try:
            tmp = f"{self._instances_path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(orjson.dumps([i.record for i in self.instances.values()]))
            os.replace(tmp, self._instances_path)
        except OSError as exc:
            self._log_once("instances-file", logging.WARNING, "cannot save the instance table: %s", exc)

    def _restore_instances(self) -> None:
        try:
            with open(self._instances_path, "rb") as f:
                saved = orjson.loads(f.read())
        except (OSError, orjson.JSONDecodeError):
            return
        live = self._live_slots()
        for rec in saved if isinstance(saved, list) else []:
            try:
                if live.get(int(rec[1])) == int(rec[0]):
                    self._instance_started(rec, save=False)
            except (TypeError, ValueError, IndexError):
                continue

    def _live_slots(self) -> dict[int, int]:
        live = self.arena.live_slots()
        if self.mode == "thread":
            # Our own process's slot locks are invisible to F_GETLK: trust WORKER_STOP instead.
            me = os.getpid()
            for slot, inst in self.instances.items():
                if inst.pid == me:
                    live[slot] = me
        return live

    async def _instance_keeper(self) -> None:
        s = self.settings
        tick = min(1.0, max(0.05, s.keepalive_interval_s))
        while True:
            self._live = live = self._live_slots()
            self._last_live_check = time.monotonic()
            gone = [
                slot for slot, inst in self.instances.items() if inst.leaving or live.get(slot) != inst.pid
            ]
            if gone:
                for slot in gone:
                    inst = self.instances.pop(slot)
                    # A short-lived worker may be gone before its first announcement; its
                    # segments name it, so the backend should know it existed.
                    await self._announce_once(inst)
                self._save_instances()
            if "management" in self.sender_supports():
                for inst in list(self.instances.values()):
                    if self._stopping:
                        break
                    if time.monotonic() >= inst.due and self.instances.get(inst.slot) is inst:
                        await self._keep_alive(inst)
            await asyncio.sleep(tick)

    async def _announce_once(self, inst: _Instance) -> None:
        if not inst.props_sent and "management" in self.sender_supports():
            await self._keep_alive(inst)

    def sender_supports(self) -> frozenset[str]:
        return self.sender.supports if self.sender is not None else frozenset()

    async def _keep_alive(self, inst: _Instance) -> None:
        s = self.settings
        sender = self.sender
        assert sender is not None
        c = self.counters
        timeout = s.send_timeout_s + 1.0
        try:
            if not inst.props_sent or inst.pings_since_props >= s.properties_every_n_keepalives:
                await asyncio.wait_for(
                    sender.report_properties(inst.service, inst.instance, inst.properties, inst.layer),
                    timeout,
                )
                inst.props_sent = True
                inst.pings_since_props = 0
                c.add(c.sent, "properties")
            await asyncio.wait_for(sender.keep_alive(inst.service, inst.instance, inst.layer), timeout)
        except UnsupportedError as exc:
            self._log_once("unsupported-management", logging.WARNING, "%s; instances are not kept alive", exc)
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
            self._log_once(
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

    # -- status ----------------------------------------------------------------------------
    async def _status_task(self) -> None:
        interval = min(1.0, max(0.05, self.settings.status_interval_s))
        while True:
            await asyncio.sleep(interval)
            # No pidfd (old kernel): poll the owner instead.
            if self._polls_owner() and not process_alive(self.owner_pid, 0):
                self._owner_died()
            self._publish()

    def _polls_owner(self) -> bool:
        return self._owner_fd < 0 and self.owner_pid > 0 and self.mode == "process" and not self.owner_dead

    def document(self) -> bytes:
        c = self.counters
        c.read = {R.NAMES.get(t, "unknown"): n for t, n in self._read_counts.items()}
        read_total = sum(n for t, n in self._read_counts.items() if t in _KIND_OF)
        sent_total = sum(n for k, n in c.sent.items() if k in _TYPE_OF)
        self.rates.update(read_total, sent_total)
        spool = self.spool
        c.dropped["spool"] = (spool.dropped_records if spool is not None else 0) + self._spool_write_drops
        sender = self.sender
        return build_document(
            pid=os.getpid(),
            service=self.settings.service,
            protocol=self.settings.protocol,
            mode=self.mode,
            started_ns=self.started_ns,
            restarts=self.restarts,
            address=sender.address if sender is not None else "",
            counters=c,
            spool_enabled=spool is not None,
            spool_bytes=spool.total_bytes if spool is not None else 0,
            spool_cap=self.settings.spool_max_bytes if spool is not None else 0,
            spool_records=spool.total_records if spool is not None else 0,
            pending_bytes=self.pending_bytes,
            instances=[
                InstanceView(i.slot, i.pid, i.instance, i.last_keepalive_ns) for i in self.instances.values()
            ],
            max_instances=self.settings.status_max_instances,
            rates=self.rates,
            extra={"stopping": self.stop_reason} if self._stopping else None,
        )

    def _publish(self) -> None:
        status = self.arena.status
        status.heartbeat()
        try:
            status.publish(self.document())
        except Exception as exc:  # never let reporting on ourselves take us down
            self._log_once("status", logging.ERROR, "cannot publish the status document: %r", exc)

    # -- shutdown --------------------------------------------------------------------------
    async def _flush_and_close(self) -> None:
        for kind in list(self._open):
            self._seal(kind)
        self._closing = True
        for event in self._queue_events.values():
            event.set()
        workers = [t for t in self._tasks if t.get_name().startswith("swmp-reporter-send-")]
        others = [t for t in self._tasks if t not in workers and t.get_name() != "swmp-reporter-status"]
        for t in others:
            t.cancel()
        remaining = max(0.0, self._deadline - time.monotonic())
        if workers:
            _done, pending = await asyncio.wait(workers, timeout=remaining)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        left = 0
        for queue in self._queues.values():
            while queue:
                batch = queue.popleft()
                if batch.spilled:
                    continue
                if self.spool is not None and batch.records:
                    self._to_spool([(_TYPE_OF[batch.kind], orjson.dumps(r)) for r in batch.records])
                    self._resolve(batch)
                else:
                    left += len(batch.records)  # not committed: still in the ring for a successor
        if left:
            self.counters.add(self.counters.dropped, "shutdown", left)
            log.warning("%d records were not delivered before the shutdown deadline", left)
        await self._announce_unannounced()
        sender = self.sender
        if sender is not None:
            try:
                await asyncio.wait_for(sender.close(), timeout=max(1.0, self._deadline - time.monotonic()))
            except Exception as exc:
                log.warning("closing the %s sender: %r", self.settings.protocol, exc)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _announce_unannounced(self) -> None:
        """At shutdown, announce instances the keeper never got to (a program that lived
        shorter than one keeper tick), within what is left of the deadline."""
        if self.sender is None or "management" not in self.sender_supports():
            return
        pending = [inst for inst in self.instances.values() if not inst.props_sent]
        remaining = self._deadline - time.monotonic()
        if not pending or remaining <= 0:
            return
        try:
            await asyncio.wait_for(asyncio.gather(*(self._keep_alive(i) for i in pending)), remaining)
        except (asyncio.TimeoutError, Exception) as exc:
            log.debug("announcing instances at shutdown: %r", exc)

    def _teardown(self) -> None:
        """Release everything; unlink the arena when we are the last one out."""
        loop = self._loop
        if self._listener is not None:
            if loop is not None:
                loop.remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
        if self.mode == "process" and loop is not None:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
                loop.remove_signal_handler(sig)
                # Removing the handler restores the default action, and the supervisor's
                # forwarded SIGTERM (the owner died) can land now: it would kill us before
                # the arena is unlinked below. We are leaving anyway.
                signal.signal(sig, signal.SIG_IGN)
        self.ready = False
        self._publish()
        if self.spool is not None:
            self.spool.close()
        # With the owner dead and no worker left, nobody will ever read this arena again (the
        # supervisor restarts reporters only for a live owner, and a new application gets a new
        # arena): what is still in the rings was counted as dropped at the deadline.
        last_out = (
            self.mode == "process" and self.owner_pid > 0 and self._owner_gone() and not self._live_slots()
        )
        if last_out:
            abandoned = sum(max(0, r.backlog()) for r in self._readers)
            if abandoned:
                log.warning(
                    "owner gone: %d bytes of undelivered records are discarded with the arena", abandoned
                )
        if self._owner_fd >= 0:
            if loop is not None:
                loop.remove_reader(self._owner_fd)
            os.close(self._owner_fd)
            self._owner_fd = -1
        arena = self.arena
        arena.status.set_sleeping(False)
        arena.release_reporter()
        if last_out:
            log.info("owner gone and rings drained: removing %s", arena.path)
            arena.unlink()
            try:
                os.unlink(self._instances_path)
            except OSError:
                pass

    def _owner_gone(self) -> bool:
        """Is the owner dead (or dying)? Decides whether we are the last one out.

        When the owner dies, the kernel sends our supervisor its PDEATHSIG (forwarded to
        us as SIGTERM) a moment *before* the owner turns into a zombie and its pidfd fires;
        on a busy machine this reporter can finish its flush inside that moment. If our
        process chain no longer leads to the owner, it is dying: wait for the pidfd briefly.
        """
        if self.owner_dead:
            return True
        if self._owner_fd >= 0:
            # A leader that already exited while other threads of its process are still being
            # torn down (a gevent or daemon thread killed by exit_group) shows as a zombie
            # before the pidfd fires and before we are reparented.
            wait = 1.0 if self._chain_broken() or _zombie(self.owner_pid) else 0.0
            ready, _, _ = select.select([self._owner_fd], [], [], wait)
            return bool(ready)
        return not process_alive(self.owner_pid, 0)

    def _chain_broken(self) -> bool:
        ppid = os.getppid()
        return ppid != self.owner_pid and _parent_of(ppid) != self.owner_pid


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X")
    except OSError:
        return False


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rfind(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def host_properties() -> list[tuple[str, str]]:
    """Instance properties that describe this host (the same for every worker)."""
    props = [
        ("language", "python"),
        ("OS Name", platform.system() or os.name),
        ("hostname", socket.gethostname()),
        ("ipv4", "; ".join(_ipv4_addresses())),
        ("python_implementation", platform.python_implementation()),
        ("python_version", platform.python_version()),
    ]
    return props


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
