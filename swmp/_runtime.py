"""The worker's end of the pipe: sinks that write into this process's ring.

Every process that produces telemetry owns one ring and is one service instance, named
after a *slot* of the application's arena (``<base>-w<slot>``): the lowest free slot is
claimed, so a restarted worker takes back its predecessor's name. A slot is claimed in the
process that writes, never inherited: after ``fork()`` the child must not write into its
parent's ring (one producer per ring is what makes the ring safe). Fork is noticed three
ways, cheapest first to fire:

* ``os.register_at_fork(after_in_child=...)`` (Gunicorn, multiprocessing, plain fork);
* ``uwsgidecorators.postfork`` under uWSGI, which skips Python's at-fork hooks unless
  ``--py-call-uwsgi-fork-hooks`` is set (``swmp run`` sets it; see docs/servers.md);
* a pid comparison on every write, the backstop that needs no cooperation from the server
  (``swmp.lifecycle.current_pid``: kept by the fork hooks where they are reliable, so a
  write makes no system call; ``os.getpid()`` under uWSGI without ``uwsgidecorators``).

When the backstop is what noticed, the record in hand was built with the parent's instance
name; it is re-stamped with this worker's instance before it is written.

Two sinks, one per reporter mode:

* ``ArenaSink`` (``SW_AGENT_REPORTER_PROCESS=true``, in ``swmp._arena_sink``): the slot's
  ring *is* the transport; the reporter process drains every slot of the shared arena.
* ``ThreadSink`` (``false``, in ``swmp._thread_sink``): a slot of the shared arena is claimed
  for the name only; records go into a private one-slot arena drained by a reporter thread
  this process starts for itself (no thread, event loop or channel ever crosses a fork).

The master of a prefork server (Gunicorn's arbiter, uWSGI's master) serves no requests; it
claims no slot as a worker, so worker names are ``-w0`` ... ``-w<N-1>`` and, in thread mode, no
reporter thread (with its gRPC channel) runs in a process that forks workers. Its own log
records (start-up errors, worker timeouts) are worth having, though: in process mode, the
first LOG record it writes claims the *highest* free slot of the arena and announces the
instance ``<base>-master``; only LOG records go there, and the master still opens no
connection (the reporter drains that ring like any other). In thread mode the master's
records are dropped and counted (``master``).

Three kinds of process have no ring, and the sink drops their records and counts them:

* a **helper** (``swmp.lifecycle``: a child that a worker forked - a multiprocessing fork
  pool, ``subprocess`` with ``preexec_fn``, ``os.fork`` in request code) is inert by design:
  no slot, no instance, no reporter thread, no arena;
* a **worker that found every slot taken** (more workers than ``SW_AGENT_ARENA_SLOTS``)
  tries the claim again at most every :data:`CLAIM_RETRY_S` seconds, from its writes (no
  timer, no thread): a slot freed by a worker that left is taken within that time;
* a process **after its goodbye** at exit (``leave(for_good=True)``): an atexit handler that
  runs after the agent's, a shutdown signal's receivers. It never claims again.

These counts, and the master's, reach the application's shared arena header
(``Arena.add_counts``) at each drop, in both modes (thread mode: the arena that names the
processes), so ``swmp status`` shows them and ``swmp health`` fails its ``drops`` check on
records lost for want of a slot. Once that file is gone (thread mode: the owner removes the
registry at its goodbye), the process keeps them and logs them at its exit's very end.
(Batching them per second left the last second's drops unpublished while the process sat
idle: the fault suite saw 94 of 143 lost records counted. A process without a ring is
already failing; a lock pair per dropped record is cheap next to what it loses.)

A record that the process could not even encode (``count_unbuilt``) is counted in its ring's
``unbuilt`` word; in a process without a ring, as that process's records are counted above. So
are its records from before the agent (``prestart``) and those a writer it gave up refused
(``stale``; see ``_count_elsewhere``).
"""

from __future__ import annotations

import logging
import os
import threading
import time

from ipc import RingWriter
from reporter_proc import records as R
from swmp import _sink, lifecycle
from swmp._drops import UnseenDrops, header_counts, no_counts
from swmp.lifecycle import prefork_master
from swmp.tracing.identity import identity

__all__ = ["ProcessSink", "header_counts", "prefork_master", "worker_instance_name"]

log = logging.getLogger("swmp.agent")

CLAIM_RETRY_S = 1.0  # a worker without a slot tries again at most this often


def worker_instance_name(base: str, slot: int) -> str:
    """Instance name of the worker on ``slot``: stable across worker restarts."""
    return f"{base}-w{slot}"


def master_instance_name(base: str) -> str:
    """Instance name of the prefork master (its own log records only)."""
    return f"{base}-master"


class ProcessSink(UnseenDrops):
    """What both sinks share: one claim per process, the announce, the re-stamp, the leave.

    ``write`` never raises and never blocks on anything but the in-process ring lock: an
    unavailable slot drops the record and counts it (a full ring counts its own drops).
    """

    # Slots (the rest stays in the instance dict): the native emit reads both for every
    # segment (emit.c ``direct_writer``) through slot caches, a full attribute look-up each
    # from the dict.
    __slots__ = ("_pid", "_writer")

    def __init__(
        self,
        service: str,
        instance_base: str,
        *,
        namespace: str = "",
        properties: dict[str, str] | None = None,
        owner_pid: int = 0,
    ) -> None:
        self.service = service
        self.instance_base = instance_base
        self.namespace = namespace
        self.properties = dict(properties or {})
        self.owner_pid = owner_pid or os.getpid()
        self.dropped_no_slot = 0  # records dropped because this process has no ring
        self._retry_at = 0.0  # monotonic time of the next claim attempt (role "unavailable")
        super().__init__()
        self._unpublished = no_counts()  # not yet in the shared arena
        self.role = ""  # "worker" | "master" | "unavailable" | "helper", for this process
        self._writer: RingWriter | None = None
        self._slot: int | None = None
        # The master's log ring (see the module docstring): claimed on its first LOG record.
        self._master_writer: RingWriter | None = None
        self._master_pid = -1  # the pid that tried to claim it (once per process)
        self._pid = -1  # nobody has claimed yet: the first write (in any process) claims
        # The process that left for good (it exits): its later records are dropped, never a
        # new claim. By pid, so that a child it forks is a new process that may claim.
        self._left_pid = -1
        self._handed_over = -1  # the pid whose records go to the agent started anew there
        # One claim lock per pid, created with setdefault (atomic under the GIL): a lock
        # inherited from a parent may have been held by one of its threads at fork time.
        # Reentrant, with ``_claiming`` (:class:`UnseenDrops`): a signal handler or finalizer
        # that logs while this thread claims (the first record) waited for it, for good.
        self._claim_locks: dict[int, threading.RLock] = {}
        self._warned: set[str] = set()

    # -- writing ---------------------------------------------------------------------------
    @property
    def slot(self) -> int | None:
        return self._slot if self._pid == os.getpid() else None

    def write(self, rtype: int, payload: bytes) -> bool:
        try:
            if self._pid != lifecycle.current_pid():
                stale_instance = identity.instance
                self.rebind()
                if self._handed_over == lifecycle.current_pid():
                    return _sink.get_sink().write(rtype, payload)
                if identity.instance != stale_instance:
                    payload = R.restamp_instance(rtype, payload, identity.instance)
            writer = self._writer
            if writer is None:
                if self._left_pid == lifecycle.current_pid():
                    self._count_drop()
                    return False
                if rtype == R.LOG and self.role == "master":
                    return self._write_master_log(payload)
                if self.role == lifecycle.UNAVAILABLE and time.monotonic() >= self._retry_at:
                    writer = self._retry_claim()
                if writer is None:
                    if self.role == lifecycle.HELPER and self._hand_over():
                        return _sink.get_sink().write(rtype, payload)
                    self._count_drop()
                    return False
                payload = R.restamp_instance(rtype, payload, identity.instance)
            return writer.write(rtype, payload)
        except Exception:  # the host application must never see our failure
            self.count_unbuilt()  # (a re-stamp that failed, a claim that raised)
            self._warn_once("write", "swmp: dropping a record after an internal error", exc_info=True)
            return False

    def count_unbuilt(self) -> None:
        """A record this process meant to write but could not encode: counted in its ring
        (``RingWriter.add_unbuilt``), or where a process without one counts its records
        (they are lost for that reason anyway). Never raises."""
        try:
            writer = self._own_writer()
            if writer is None or not writer.add_unbuilt():
                self._count_drop()
        except Exception:
            pass

    def count_bad_input(self) -> None:
        """Bad input this process refused (a malformed incoming ``sw8`` header): counted in its
        ring (``RingWriter.add_bad_input``), where ``swmp status`` shows it. A process without a
        ring serves no requests worth counting (the master, a helper): not counted there, its
        log line still says it. Never raises."""
        try:
            writer = self._own_writer()
            if writer is not None:
                writer.add_bad_input()
        except Exception:
            pass

    def _own_writer(self) -> RingWriter | None:
        """This process's ring writer (bound first after a fork), the master's log ring's."""
        pid = lifecycle.current_pid()
        if self._pid != pid:
            self.rebind()
        return self._writer or (self._master_writer if self._master_pid == pid else None)

    def _write_master_log(self, payload: bytes) -> bool:
        pid = os.getpid()
        if self._master_pid != pid:
            self._master_pid = pid
            self._master_writer = None
            stale_instance = identity.instance
            try:
                master = self._attach_master(pid)
                self._master_writer = None if master is None else self._adopt(master)
            except Exception:
                self._warn_once(
                    "master", "swmp: the master process %d cannot report its logs", pid, exc_info=True
                )
            if identity.instance != stale_instance:
                payload = R.restamp_instance(R.LOG, payload, identity.instance)
        writer = self._master_writer
        if writer is None:
            self._count_drop()
            return False
        return writer.write(R.LOG, payload)

    def _attach_master(self, pid: int) -> RingWriter | None:
        """A ring for the master's own log records; None where the mode has none."""
        return None

    # -- no ring: retry, count ---------------------------------------------------------------
    def _retry_claim(self) -> RingWriter | None:
        """A worker without a slot tries once more (a failed claim sets the next time)."""
        self.rebind(retry=True)
        return self._writer

    def _count_drop(self, n: int = 1, *, after_ring: bool = False) -> None:
        """``n`` records this process had no ring for. ``after_ring``: a writer it gave up
        refused them (not a worker without a slot: counted as after its goodbye)."""
        self.dropped_no_slot += n
        # A master or a helper has no ring by design: counted apart from a worker that
        # wanted one and found none (the loss that fails ``swmp health``).
        role = self.role
        if self._left_pid == lifecycle.current_pid() and not after_ring:
            kind = "late"
        elif role in (lifecycle.HELPER, lifecycle.MASTER):
            kind = role
        else:
            kind = "late" if after_ring else "no_slot"
        self._unpublished[kind] += n
        self.publish_drops()

    def _count_elsewhere(self, n: int, *, stale: bool = False) -> None:
        """``n`` records of this process that no ring of its own took when they were made:
        before it had one (the agent not started, ``swmp._sink.take_prestart``) or, ``stale``,
        refused by a writer it had given up (``RingWriter.forward_refused``). Counted in the
        ring it holds now (its ``prestart`` / ``stale`` word), else with its records that no
        ring takes. Never raises."""
        if n <= 0:
            return
        try:
            pid = lifecycle.current_pid()
            if self._pid not in (-1, pid):  # bound in the parent: a forked child's are its own
                self.rebind()
            writer = self._writer if self._pid == pid else None
            if writer is None and self._master_pid == pid:
                writer = self._master_writer
            if writer is not None and (writer.add_stale(n) if stale else writer.add_prestart(n)):
                return
            self._count_drop(n, after_ring=stale)
        except Exception:
            pass

    def count_master_prestart(self) -> None:
        """At start in a prefork master, which binds no ring for its records: those it made
        before (``swmp._sink.take_prestart``) are counted now with its records (``master``)."""
        n = _sink.take_prestart()
        if n > 0:
            self.dropped_no_slot += n
            self._unpublished[lifecycle.MASTER] += n
            self.publish_drops()

    def _count_stale(self, n: int) -> None:
        # The process's agent now (a stop() and start() make a new sink), else this one.
        current = _sink.get_sink()
        (current if isinstance(current, ProcessSink) else self)._count_elsewhere(n, stale=True)

    def _adopt(self, writer: RingWriter) -> RingWriter:
        """A writer this process just claimed: what it refuses once given up is counted."""
        writer.forward_refused(self._count_stale)
        return writer

    def rebind(self, *, retry: bool = False) -> None:
        """Take this process's ring and name (after fork, or on first use). Idempotent.

        Announces the fork first if nothing did yet (this write's pid check was first),
        and the binding after (``swmp.lifecycle``: meters start their thread on it).
        ``retry``: this process found no free slot before; try the claim again.
        """
        lifecycle.check_fork()
        if self._pid != os.getpid() and self._hand_over():
            return
        if self._bind(retry):
            # What this process made before (``swmp._sink.NullSink``) where status shows it.
            self._count_elsewhere(_sink.take_prestart())
            lifecycle.announce_bound(self.role)

    def _hand_over(self) -> bool:
        """Is this process the daemon of a single fork (``swmp.lifecycle``)? Then the agent
        has started anew here and this sink stays unbound: its records go to the new one.
        Asked under the claim lock, so that another thread's first record waits for the
        answer (up to half a second) and follows it instead of binding here meanwhile."""
        pid = lifecycle.current_pid()
        if self._handed_over != pid:
            with self._claim_locks.setdefault(pid, threading.RLock()):
                if self._handed_over != pid and lifecycle.notice_single_fork_daemon():
                    self._handed_over = pid
        return self._handed_over == pid

    def _bind(self, retry: bool = False) -> bool:
        """Claim under the per-pid lock; True when this call did the claim."""
        pid = os.getpid()
        if pid == self._left_pid:
            return False  # it said goodbye: a claim now would start it all again in an exiting process
        lock = self._claim_locks.setdefault(pid, threading.RLock())
        with lock:
            if self._claiming == threading.get_ident():
                return False  # this thread, re-entered mid-claim: its record is dropped, counted
            if self._pid == pid:
                again = retry and self.role == lifecycle.UNAVAILABLE and self._writer is None
                promoted = self.role == lifecycle.HELPER and not lifecycle.is_helper()
                if not (again or promoted):
                    return False  # bound already
            if self._pid != pid:
                self._unpublished = no_counts()  # the parent's
                self._retry_at = 0.0
            was_unavailable = self._pid == pid and self.role == lifecycle.UNAVAILABLE
            self._writer = None
            self._slot = None
            self._claiming = threading.get_ident()
            try:
                if prefork_master(self.owner_pid):
                    self.role = lifecycle.MASTER
                    return True
                if lifecycle.is_helper():
                    self.role = lifecycle.HELPER  # inert: no slot, no name, no thread, no arena
                    return True
                self.role = lifecycle.UNAVAILABLE
                claimed = self._attach(pid)
                if claimed is not None:
                    self._writer, self._slot = self._adopt(claimed[0]), claimed[1]
                    self.role = lifecycle.WORKER
                else:
                    self._claim_failed(was_unavailable)
            except Exception:
                # As a claim that found no slot: the records are dropped and counted, and the
                # claim is tried again at most every CLAIM_RETRY_S, not on every record (each
                # attempt costs system calls: ENOSPC on a full /dev/shm lasts).
                self._warn_once("attach", "swmp: process %d cannot report", pid, exc_info=True)
                self.role = lifecycle.UNAVAILABLE
                self._claim_failed(was_unavailable)
            finally:
                self._pid = pid
                self._claiming = 0
            return True

    def _claim_failed(self, again: bool) -> None:
        self._retry_at = time.monotonic() + CLAIM_RETRY_S
        if not again:
            self._unpublished["workers"] += 1  # each process once

    def _attach(self, pid: int) -> tuple[RingWriter, int] | None:
        """This process's ring writer and slot; None when no slot is free. Gives back what it
        took before it raises or returns None."""
        raise NotImplementedError

    def _name_and_announce(self, writer: RingWriter, pid: int, slot: int, instance: str = "") -> None:
        instance = instance or (
            worker_instance_name(self.instance_base, slot) if slot >= 0 else f"{self.instance_base}-p{pid}"
        )
        identity.set(service=self.service, instance=instance)
        # Only what this process knows without a system call: the reporter adds the host
        # facts (hostname, interface addresses, OS, Python) once for every worker, and the
        # record's properties override its own. Resolving addresses here would put a DNS
        # lookup on every worker's start, and override the reporter's better values.
        props = {"Process No.": str(pid), "slot": str(slot), "language": "python"}
        if self.namespace:
            props["namespace"] = self.namespace
        props.update(self.properties)
        start = R.worker_start(
            pid, slot, service=self.service, instance=instance, properties=props, namespace=self.namespace
        )
        writer.write(R.WORKER_START, R.encode(start))

    def _warn_once(self, key: str, message: str, *args: object, exc_info: bool = False) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        log.error(message, *args, exc_info=exc_info)

    # -- leaving ---------------------------------------------------------------------------
    def owns_ring(self) -> bool:
        return self._writer is not None and self._pid == os.getpid()

    def leave(self, timeout: float = 5.0, *, for_good: bool = False) -> None:
        """Clean exit of this process: say goodbye and free the slot for the next one.

        ``for_good``: the process is exiting (atexit, a server's worker shutdown). What it
        still records after this (an atexit handler that runs after ours, a shutdown signal's
        receivers) is dropped and counted (``late``): claiming again would announce the
        instance anew after its goodbye and, in thread mode, start a reporter thread and an
        arena in an exiting process that nobody flushes or removes. Without it (``stop()``)
        a later write claims again.
        """
        if for_good:
            self._left_pid = os.getpid()
        if self._pid == os.getpid():
            self.publish_drops()
        master = self._master_writer
        if master is not None and self._master_pid == os.getpid():
            self._master_writer = None
            self._master_pid = -1
            try:
                master.write(R.WORKER_STOP, R.encode(R.worker_stop(os.getpid(), master.slot)))
            finally:
                self._release_master(master)
        if not self.owns_ring():
            return
        writer = self._writer
        assert writer is not None
        try:
            writer.write(R.WORKER_STOP, R.encode(R.worker_stop(self._pid, self._slot or 0)))
        finally:
            self._release(timeout)
            self._writer = None
            self._slot = None
            self._pid = -1
            lifecycle.announce_unbound()

    def _release(self, timeout: float) -> None:
        raise NotImplementedError

    def _release_master(self, writer: RingWriter) -> None:
        pass


def _write_around_the_sink() -> None:
    """Let the native span core hand a segment straight to the ring writer when
    ``ProcessSink.write`` would do just that (its pid is this process's, it has a ring):
    spancore.c's ``direct_writer``; everything else still goes through ``write``."""
    from swmp.tracing.span import native_core  # noqa: PLC0415 (tracing imports nothing of ours)

    register = getattr(native_core, "set_direct_sink", None)
    if register is not None:
        register(ProcessSink.write, lifecycle.pid_holder, lifecycle.current_pid)


_write_around_the_sink()
