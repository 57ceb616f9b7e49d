"""The worker's end of the pipe: a sink that writes into this process's ring slot.

Each process that produces telemetry owns one ring slot of the application's arena. The
slot is claimed lazily in the process that writes, never inherited: after ``fork()`` the
child must not write into its parent's ring (one producer per ring is what makes the ring
safe). Fork is noticed three ways, cheapest first to fire:

* ``os.register_at_fork(after_in_child=...)`` (Gunicorn, multiprocessing, plain fork);
* ``uwsgidecorators.postfork`` under uWSGI, which skips Python's at-fork hooks unless
  ``--py-call-osafterfork`` is set (see docs/servers.md);
* a pid comparison on every write, the backstop that needs no cooperation from the server.
  ``os.getpid()`` is one cheap syscall per finished segment, not per span.

When the backstop is what noticed, the record in hand was built with the parent's instance
name; it is re-stamped with this worker's instance before it is written.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from typing import Any

import orjson

from ipc import Arena, RingWriter
from reporter_proc import records as R
from swmp.tracing.identity import identity

log = logging.getLogger("swmp.agent")

# Where the instance name sits in each record type whose payload carries one.
_INSTANCE_FIELD = {R.SEGMENT: R.SEG_INSTANCE, R.LOG: 2, R.METER: 2}


def worker_instance_name(base: str, slot: int) -> str:
    """Instance name of the worker on ``slot``: stable across worker restarts."""
    return f"{base}-w{slot}"


def host_ipv4s() -> list[str]:
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        return []
    return sorted({str(info[4][0]) for info in infos})


class ArenaSink:
    """Writes records into the ring slot this process owns; claims one on first need.

    Never raises and never blocks: an unavailable slot or a full ring drops the record and
    counts it (the ring counts its own drops; ``dropped_no_slot`` counts the rest).
    """

    def __init__(
        self,
        arena: Arena,
        service: str,
        instance_base: str,
        namespace: str = "",
        properties: dict[str, str] | None = None,
    ) -> None:
        self.arena = arena
        self.service = service
        self.instance_base = instance_base
        self.namespace = namespace
        self.properties = dict(properties or {})
        self.dropped_no_slot = 0
        self._writer: RingWriter | None = None
        self._pid = -1  # nobody has claimed yet: the first write (in any process) claims
        self._lock = threading.Lock()
        self._warned_full = False

    @property
    def slot(self) -> int | None:
        return self._writer.slot if self._writer is not None and self._pid == os.getpid() else None

    def write(self, rtype: int, payload: bytes) -> bool:
        try:
            if self._pid != os.getpid():
                stale_instance = identity.instance
                self.rebind()
                if identity.instance != stale_instance:
                    payload = self._restamp(rtype, payload)
            writer = self._writer
            if writer is None:
                self.dropped_no_slot += 1
                return False
            return writer.write(rtype, payload)
        except Exception:  # the host application must never see our failure
            self.dropped_no_slot += 1
            log.debug("dropping a record after an internal error", exc_info=True)
            return False

    def rebind(self) -> None:
        """Claim a slot for the current process (after fork, or on first use)."""
        with self._lock:
            pid = os.getpid()
            if self._pid == pid:
                return
            self._pid = pid
            self._writer = self.arena.claim_slot()
            if self._writer is None:
                if not self._warned_full:
                    self._warned_full = True
                    log.error(
                        "swmp: all %d ring slots of %s are taken; telemetry of process %d is dropped "
                        "(raise SW_AGENT_ARENA_SLOTS)",
                        self.arena.slots,
                        self.arena.path,
                        pid,
                    )
                return
            slot = self._writer.slot
            instance = worker_instance_name(self.instance_base, slot)
            identity.set(service=self.service, instance=instance)
            self._announce(pid, slot, instance)

    def _announce(self, pid: int, slot: int, instance: str) -> None:
        props = {
            "Process No.": str(pid),
            "slot": str(slot),
            "hostname": socket.gethostname(),
            "ipv4": "; ".join(host_ipv4s()),
            "python_version": sys.version.split()[0],
            "python_implementation": sys.implementation.name,
            "language": "python",
            "OS Name": os.name,
        }
        if self.namespace:
            props["namespace"] = self.namespace
        props.update(self.properties)
        flat: list[str] = []
        for k, v in props.items():
            flat += (k, v)
        assert self._writer is not None
        self._writer.write(
            R.WORKER_START, orjson.dumps([pid, slot, self.service, instance, flat, "", self.namespace])
        )

    def _restamp(self, rtype: int, payload: bytes) -> bytes:
        index = _INSTANCE_FIELD.get(rtype)
        if index is None:
            return payload
        rec: list[Any] = orjson.loads(payload)
        rec[index] = identity.instance
        return orjson.dumps(rec)

    def leave(self) -> None:
        """Clean exit of this worker: say goodbye and free the slot for the next one."""
        if self._writer is None or self._pid != os.getpid():
            return
        try:
            self._writer.write(R.WORKER_STOP, orjson.dumps([self._pid, self._writer.slot]))
        finally:
            self.arena.release_slot()
            self._writer = None
            self._pid = -1
