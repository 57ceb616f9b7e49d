"""The reporter: its parts, composed in one place, on one asyncio event loop.

One :class:`Reporter` runs in the reporter process or on the thread-mode background thread
(same code either way). It owns no logic of its own beyond start, stop and teardown; each
job is a part (docs/reporter.md follows a record through them):

* :class:`~reporter_proc.intake.Intake` reads the rings into per-kind batches, and sleeps
  on a timer between passes (writers ring the doorbell only when a ring fills up);
* :class:`~reporter_proc.ledger.Ledger` knows which ring bytes may be committed;
* :class:`~reporter_proc.delivery.Delivery` sends each kind's batches in order, with
  retry, backoff, isolation of bad records, and the spool as the last resort;
* :class:`~reporter_proc.spooling.SpoolWriter` / ``Replayer`` keep and replay records across outages;
* :class:`~reporter_proc.instances.Instances` announces every worker and keeps it alive;
* :class:`~reporter_proc.publisher.StatusPublisher` heartbeats and publishes the status;
* :class:`~reporter_proc.profile_tasks.ProfileTaskPoller` polls the OAP's profile tasks and
  posts them on the arena's board for the workers (gRPC only);
* :class:`~reporter_proc.lifecycle.StopState` / ``OwnerWatch`` decide when it all ends.

Delivery is at-least-once: a ring position is committed only when every record before it
has been sent, spooled or deliberately given up, so a reporter that dies leaves its unsent
records in the rings for the next one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable

from ipc import Arena
from reporter_proc import records as R
from reporter_proc.adoption import Adoption
from reporter_proc.delivery import Delivery, backoff
from reporter_proc.exit_threads import sender_refused_at_exit
from reporter_proc.exits import EXIT_CONFIG, EXIT_ERROR, EXIT_OK
from reporter_proc.instances import Instance, Instances, host_properties
from reporter_proc.intake import Intake
from reporter_proc.journal import Journal
from reporter_proc.ledger import Ledger
from reporter_proc.lifecycle import OwnerWatch, StopState, SupervisorWatch
from reporter_proc.loopguard import DescriptorsLost
from reporter_proc.profile_tasks import ProfileTaskPoller, profiling_unavailable
from reporter_proc.publisher import Parts, StatusPublisher
from reporter_proc.senders.base import Sender
from reporter_proc.settings import ReporterSettings
from reporter_proc.spool import Spool
from reporter_proc.spooling import Replayer, SpoolWriter
from reporter_proc.status import Counters, exit_summary
from reporter_proc.timeouts import limited

log = logging.getLogger("swmp.reporter")

__all__ = ["EXIT_CONFIG", "EXIT_ERROR", "EXIT_OK", "Reporter", "host_properties", "make_sender"]


DATA_NAMES = frozenset(k.name for k in R.DATA_KINDS)
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
# How long a stopping reporter waits for the owner after the last worker left: a server
# master exits right after its workers (then the arena is removed); one that stays up was
# not stopped with us.
OWNER_GRACE_S = 2.0


def make_sender(settings: ReporterSettings) -> Sender:
    """The sender for ``settings.protocol``; imported here, lazily, after fork."""
    if settings.protocol == "memory":
        from reporter_proc.senders.memory import MemorySender  # noqa: PLC0415

        return MemorySender(path=settings.memory_path, fail_next=settings.memory_fail_first)
    # grpc / aiohttp / aiokafka live behind this import: never load them before fork.
    from reporter_proc.senders import create_sender  # noqa: PLC0415

    return create_sender(settings)


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
        supervisor_pid: int = 0,
    ) -> None:
        self.arena = arena
        self.settings = settings
        self.sender = sender
        self.mode = mode
        self.owner_pid = owner_pid
        self.exit_code = EXIT_OK
        self.ready = False  # the reporter role is ours and the tasks are running
        self.finished = False
        self.journal = Journal(settings)
        self.stop = StopState()
        self.parts = Parts(sender=sender)
        self.publisher = StatusPublisher(
            arena, self.journal, self.stop, mode=mode, restarts=restarts, parts=self.parts
        )
        self.owner = OwnerWatch(arena, owner_pid, mode == "process", self._owner_died)
        self.supervision = SupervisorWatch(
            supervisor_pid if mode == "process" else 0,
            respawn=self._respawn_supervisor,
            wanted=lambda: not self.stop.stopping and not self.owner.gone_now(),
            backoff_s=(settings.restart_backoff_base_s, settings.restart_backoff_max_s),
        )
        if supervisor_pid and mode == "process":
            self.parts.supervisor = self.supervision.info
        self.intake: Intake | None = None
        self.delivery: Delivery | None = None
        self._instances: Instances | None = None
        self.profile_tasks: ProfileTaskPoller | None = None
        self.adoption: Adoption | None = None  # thread mode: dead processes' arenas
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._senders: list[asyncio.Task[None]] = []
        self._stop_requested_early = ""
        self._workers_gone_at = 0.0  # monotonic: when a stopping reporter saw no live slot

    # -- views (tests, the process wrapper, benchmarks) -------------------------------------
    @property
    def counters(self) -> Counters:
        return self.journal.counters

    @property
    def pending_bytes(self) -> int:
        return self.parts.ledger.pending_bytes if self.parts.ledger is not None else 0

    @property
    def instances(self) -> dict[int, Instance]:
        return self._instances.table if self._instances is not None else {}

    @property
    def spool(self) -> Spool | None:
        return self.parts.spool.spool if self.parts.spool is not None else None

    @property
    def owner_dead(self) -> bool:
        return self.owner.dead

    @property
    def stop_reason(self) -> str:
        return self.stop.reason

    def document(self) -> bytes:
        return self.publisher.document()

    # -- control ---------------------------------------------------------------------------
    def request_stop(self, reason: str = "stop", *, wait_for_workers: bool = True) -> None:
        """Begin the graceful shutdown. Call on the reporter's loop (see stop_threadsafe).

        ``wait_for_workers``: a reporter process keeps draining until every worker of the
        arena has exited and the owner is gone (or the drain deadline passes), so records
        that workers write while they finish their last requests are delivered too.
        """
        if self._loop is None:
            self._stop_requested_early = reason
            return
        wait = wait_for_workers and self.owner.enabled
        if not self.stop.begin(reason, self.settings.shutdown_deadline_s, wait_for_workers=wait):
            return
        log.info(
            "reporter %d stopping (%s), deadline %.1f s",
            os.getpid(),
            reason,
            self.settings.shutdown_deadline_s,
        )
        if self.intake is not None:
            self.intake.poke()

    def stop_threadsafe(self, reason: str = "stop") -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            self._stop_requested_early = reason
            return
        try:
            loop.call_soon_threadsafe(self.request_stop, reason)
        except RuntimeError:  # the loop closed in between
            pass

    def _owner_died(self) -> None:
        self.request_stop("owner died")

    def _respawn_supervisor(self) -> int:
        from reporter_proc.process import respawn_supervisor  # noqa: PLC0415 (process imports us)

        return respawn_supervisor(self.arena.path, self.settings, self.owner_pid)

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
        lost = False
        try:
            code = await self._run_as_reporter()
        except DescriptorsLost:  # thread mode: no teardown, it would close the app's files
            lost = True
            raise
        except Exception:
            log.exception("reporter failed")
            code = EXIT_ERROR
        finally:
            if not lost:
                self._teardown()
        self.finished = True
        return code

    async def _start_sender(self) -> Sender | int:
        if self.mode == "thread" and sender_refused_at_exit(self.settings.protocol):
            return EXIT_ERROR
        if self.sender is None:
            try:
                self.sender = make_sender(self.settings)
            except Exception as exc:
                log.error("cannot create the %r sender: %s", self.settings.protocol, exc)
                return EXIT_CONFIG
        try:
            await self.sender.start()
        except Exception as exc:
            log.error("the %s sender did not start: %s", self.settings.protocol, exc)
            return EXIT_ERROR
        self.parts.sender = self.sender
        return self.sender

    async def _run_as_reporter(self) -> int:
        loop = self._loop
        assert loop is not None
        self.arena.status.heartbeat()
        self.publisher.carry_over()  # counts continue from the arena's earlier reporters
        if self.mode == "process":
            # First: a SIGTERM during start-up must mean "stop", not "die" (which the
            # supervisor would take for a crash and answer with a restart).
            for sig in _SIGNALS:
                loop.add_signal_handler(sig, self.request_stop, signal.Signals(sig).name)
        sender = await self._start_sender()
        if isinstance(sender, int):
            return sender
        self._compose(sender, loop)
        assert self.intake is not None
        self.ready = True
        self.publisher.publish()
        if self._stop_requested_early:  # stop() from another thread before the loop ran
            self.request_stop(self._stop_requested_early)
        await self.intake.run()
        await self._flush_and_close()
        return self.exit_code

    def _compose(self, sender: Sender, loop: asyncio.AbstractEventLoop) -> None:
        """Build the parts and start their tasks: the one place they meet."""
        j = self.journal
        check_capabilities(j, sender)
        spool = SpoolWriter.open(j)
        readers = [self.arena.reader(slot) for slot in range(self.arena.slots)]
        ledger = Ledger(lambda slot, pos: readers[slot].commit(pos))
        delivery = self.delivery = Delivery(j, ledger, sender, spool, self.stop)
        instances = self._instances = Instances(
            self.arena,
            j,
            sender,
            self.stop,
            own_process_slots=self.mode == "thread",
            backoff=lambda n: backoff(j, n),
        )
        intake = self.intake = Intake(
            self.arena,
            readers,
            ledger,
            journal=j,
            delivery=delivery,
            stop=self.stop,
            on_worker_record=instances.on_record,
            spill=delivery.spill if spool is not None else None,
            drained_for_stop=self._drained_for_stop,
        )
        ledger.on_freed = intake.on_freed  # memory freed: a reader held back may go on
        self.parts.spool, self.parts.ledger, self.parts.instances = spool, ledger, instances
        self.parts.read_counts = intake.read_counts
        intake.start(loop)
        self.owner.start(loop)
        self.supervision.start(loop)
        instances.restore()
        if self.mode == "thread":  # adopt now, at the start of reporting, then on the tick
            where, meta = os.path.dirname(self.arena.path), self.arena.info().meta
            self.adoption = Adoption(where, ledger, intake, instances, meta=meta)
            self.adoption.poll(loop.time())
        for kind in R.DATA_KINDS:
            self._senders.append(self._spawn(delivery.run(kind.name), f"send-{kind.name}"))
        self._spawn(instances.run(), "instances")
        self._spawn(self.publisher.run(self._tick), "status")
        self._start_profile_tasks(sender, instances)
        if spool is not None:
            busy = lambda: ledger.pending_bytes > self.settings.max_pending_bytes // 2  # noqa: E731
            replayer = Replayer(
                spool, j, delivery.send, stop=self.stop, busy=busy, backoff=lambda n: backoff(j, n)
            )
            self._spawn(replayer.run(), "replay")

    def _tick(self) -> None:
        """About once a second, from the status task: watches that need polling."""
        self.owner.poll()
        self.supervision.poll()
        if self.adoption is not None and self._loop is not None and not self.stop.closing:
            self.adoption.poll(self._loop.time())

    def _start_profile_tasks(self, sender: Sender, instances: Instances) -> None:
        unavailable = profiling_unavailable(self.journal, sender)
        if unavailable:
            log.info("%s", unavailable)  # once: at start
            return
        self.profile_tasks = ProfileTaskPoller(
            self.arena.board,
            self.journal,
            sender,
            self.stop,
            lambda: [(i.service, i.instance) for i in instances.table.values() if not i.leaving],
            interval_s=self.settings.profile_task_interval_s,
        )
        self._spawn(self.profile_tasks.run(), "profile-tasks")

    def _spawn(self, coro: Awaitable[None], name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        task.set_name(f"swmp-reporter-{name}")
        task.add_done_callback(self._task_done)
        self._tasks.append(task)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("reporter task %s failed: %r", task.get_name(), exc, exc_info=exc)
            self.exit_code = EXIT_ERROR
            self.request_stop("internal error", wait_for_workers=False)

    def _drained_for_stop(self, now: float) -> bool:
        assert self.intake is not None and self._instances is not None
        if self.intake.pending():
            return False
        if self.stop.wait_for_workers:
            # Workers outlive the master by a moment, and a group-wide stop signal reaches us
            # while they still finish requests: drained means no worker holds a slot any more
            # and the owner is gone (so teardown can remove the arena). A master that outlives
            # its last worker by more than OWNER_GRACE_S is not stopping (only this process was
            # told to stop); the drain deadline bounds the whole wait.
            if self._instances.refresh_live(now):
                self._workers_gone_at = 0.0
                return False
            if self.owner.dead:
                return True
            if not self._workers_gone_at:
                self._workers_gone_at = now
            return now - self._workers_gone_at >= OWNER_GRACE_S
        return True

    # -- shutdown --------------------------------------------------------------------------
    def _log_summary(self) -> None:
        """One line at exit: what the arena's records became since it was created."""
        try:
            dropped, skipped, unbuilt, stale = ring_losses(self.arena)
            level, message = exit_summary(
                self.publisher.totals(), DATA_NAMES, dropped, skipped, unbuilt, ring_stale=stale
            )
            log.log(
                level,
                "reporter %d exiting (%s); since the arena was created: %s",
                os.getpid(),
                self.stop.reason or "done",
                message,
            )
        except Exception:  # a summary must never stand in the way of the teardown
            log.debug("exit summary failed", exc_info=True)

    async def _flush_and_close(self) -> None:
        assert self.intake is not None and self.delivery is not None and self._instances is not None
        if self.adoption is not None:
            self.adoption.final()  # what dead processes left joins our last batches
        self.intake.seal_all()
        self.stop.closing = True
        self.delivery.wake_all()
        others = [t for t in self._tasks if t not in self._senders and t.get_name() != "swmp-reporter-status"]
        for t in others:
            t.cancel()
        # Instances the keeper never got to are announced beside the last sends, not after
        # them: a slow backend would otherwise leave a short-lived program's instance unknown.
        announcing = asyncio.ensure_future(self._instances.announce_unannounced())
        if self._senders:
            _done, pending = await asyncio.wait(self._senders, timeout=self.stop.remaining())
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        left = self.delivery.abandon()
        if left:
            self.journal.dropped("shutdown", left)
            log.warning("%d records were not delivered before the shutdown deadline", left)
        await announcing  # bounded by the deadline (announce_unannounced), never raises
        sender = self.sender
        if sender is not None:
            try:
                await limited(sender.close(), max(1.0, self.stop.remaining()))
            except Exception as exc:
                log.warning("closing the %s sender: %r", self.settings.protocol, exc)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _teardown(self) -> None:
        """Release everything; unlink the arena when we are the last one out."""
        loop = self._loop
        if self.intake is not None:
            self.intake.close()
        if self.mode == "process" and loop is not None:
            for sig in _SIGNALS:
                loop.remove_signal_handler(sig)
                # Removing the handler restores the default action, and the supervisor's
                # forwarded SIGTERM (the owner died) can land now: it would kill us before
                # the arena is unlinked below. We are leaving anyway.
                signal.signal(sig, signal.SIG_IGN)
        self.ready = False
        self.publisher.publish()
        if self.parts.ledger is not None:  # the parts ran: say what became of the records
            self._log_summary()
        if self.parts.spool is not None:
            self.parts.spool.spool.close()
        # With the owner dead and no worker left, nobody will ever read this arena again (the
        # supervisor restarts reporters only for a live owner, and a new application gets a new
        # arena): what is still in the rings was counted as dropped at the deadline.
        live = self._instances.live_slots() if self._instances is not None else self.arena.live_slots()
        last_out = self.owner.enabled and self.owner.gone() and not live
        if last_out and self.intake is not None:
            abandoned = self.intake.abandoned_bytes()
            if abandoned:
                log.warning(
                    "owner gone: %d bytes of undelivered records are discarded with the arena", abandoned
                )
        self.owner.close()
        self.supervision.stop()
        if self.adoption is not None:
            self.adoption.close()
        arena = self.arena
        arena.status.set_sleeping(False)
        arena.release_reporter()
        if last_out:
            log.info("owner gone and rings drained: removing %s", arena.path)
            arena.unlink()
            if self._instances is not None:
                self._instances.remove_file()


def ring_losses(arena: Arena) -> tuple[int, int, int, int]:
    """``(dropped, skipped, unbuilt, stale)`` records over every ring of ``arena``: writers'
    drops (ring full, record too large), records skipped by the readers' corruption recovery,
    records the writers' processes could not encode, and records refused by a writer those
    processes had given up (the last two counted in their rings' words)."""
    dropped = skipped = unbuilt = stale = 0
    for slot in range(arena.slots):
        st = arena.ring_stats(slot)
        dropped += st.dropped_records
        skipped += st.skipped_records
        unbuilt += st.unbuilt_records
        stale += st.stale_records
    return dropped, skipped, unbuilt, stale


def check_capabilities(journal: Journal, sender: Sender) -> None:
    """Shut the kinds that are disabled, or that the sender cannot carry (logged once)."""
    s = journal.settings
    shut = journal.shut
    enabled = {"log": s.log_enabled, "meter": s.meter_enabled, "profile": s.profile_enabled}
    for kind in R.DATA_KINDS:
        if not enabled.get(kind.capability, True):
            shut[kind.name] = "disabled"
    supports = sender.supports
    missing = sorted(
        {k.capability for k in R.DATA_KINDS if k.name not in shut and k.capability not in supports}
    )
    if "management" not in supports:
        missing.append("management")
    if missing:
        log.warning(
            "the %s protocol cannot carry %s: such records are counted as dropped.unsupported",
            s.protocol,
            ", ".join(missing),
        )
    for kind in R.DATA_KINDS:
        if kind.capability not in supports and kind.name not in shut:
            shut[kind.name] = "unsupported"
