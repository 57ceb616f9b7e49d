"""Where finished telemetry goes: the seam between the tracing core and the transport.

The tracing core calls ``get_sink().write(record_type, payload)`` once per finished
segment / log / meter report. In production the sink is the worker's shared-memory ring
(installed by the agent at start and re-installed after fork); tests install a
:class:`MemorySink`. ``write`` never raises and never blocks: it returns False when the
record was dropped (and the sink counted it).

The production sink (``swmp._runtime.ProcessSink``) checks its process and claims its ring in
``write``, then hands the record to the ring writer. The native span core goes around that
Python frame for segments when the check would pass (``_spancore.set_direct_sink``): the
sink's class still has that ``write``, its ``_pid`` is this process's and its ``_writer`` is
not None. Any other sink, state or subclass with a ``write`` of its own is called as above.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Protocol


class Sink(Protocol):
    def write(self, rtype: int, payload: bytes) -> bool: ...


class NullSink:
    """Before the agent starts (or after it stopped): count and discard.

    ``dropped`` is this process's count: a forked child starts again from 0 (the records are
    its parent's). The agent takes it (:func:`take_prestart`) when the process binds, and
    counts it where ``swmp status`` shows it (``prestart``: the ring's word, or with the
    records of a process without one)."""

    def __init__(self) -> None:
        self.dropped = 0
        self._pid = os.getpid()

    def write(self, rtype: int, payload: bytes) -> bool:
        self._own()
        self.dropped += 1
        return False

    def take(self) -> int:
        """This process's count, handed over and reset."""
        self._own()
        n, self.dropped = self.dropped, 0
        return n

    def _own(self) -> None:
        pid = os.getpid()
        if pid != self._pid:  # a forked child: the count so far is its parent's
            self._pid, self.dropped = pid, 0


class MemorySink:
    """Keeps every record in a list; for tests and for benchmarks' baselines."""

    def __init__(self) -> None:
        self.records: list[tuple[int, bytes]] = []
        self._lock = threading.Lock()

    def write(self, rtype: int, payload: bytes) -> bool:
        with self._lock:
            self.records.append((rtype, payload))
        return True

    def clear(self) -> None:
        with self._lock:
            self.records.clear()


_null = NullSink()
# Read by name from this module's namespace by the native span core (spancore.c, emit_fast):
# keep the name, and change it only through set_sink().
_sink: Sink = _null


def get_sink() -> Sink:
    return _sink


def set_sink(sink: Sink | None) -> None:
    global _sink
    _sink = _null if sink is None else sink


def take_prestart() -> int:
    """Records this process wrote while no agent sink was installed (before ``swmp.start()``
    or after ``swmp.stop()``), handed over once (the count starts again from 0)."""
    try:
        return _null.take()
    except Exception:
        return 0


def count_unbuilt() -> None:
    """A record this process meant to write but could not encode (a value its encoder refuses
    even escaped): counted by the current sink where ``swmp status`` reads it
    (``ProcessSink.count_unbuilt``: the ring's ``unbuilt`` word). Once per record; never raises."""
    _count("count_unbuilt")


def count_bad_input() -> None:
    """Bad input this process refused (a malformed incoming ``sw8`` header), counted by the
    current sink where ``swmp status`` reads it (``ProcessSink.count_bad_input``: the ring's
    ``bad_input`` word). Once per refusal; never raises."""
    _count("count_bad_input")


def _count(method: str) -> None:
    """Call the current sink's ``method`` if it has one (the null and memory sinks count
    nothing of the kind); never raises."""
    count = getattr(_sink, method, None)
    if count is not None:
        try:
            count()
        except Exception:
            pass


def report_unseen() -> None:
    """At exit, the last word of the current sink (``ProcessSink.report_unseen``): how many
    records this process dropped after the agent's goodbye where nothing can count them."""
    report = getattr(_sink, "report_unseen", None)
    if report is not None:
        try:
            report()
        except Exception:  # never into the application's exit
            pass


# Registered at ``import swmp`` (this module comes with it), so it runs after the agent's exit
# hook and after every exit handler registered later (atexit runs the last registered first):
# under ``swmp run`` every handler of the application. A no-op until a sink counts such drops.
atexit.register(report_unseen)
