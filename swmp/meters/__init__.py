"""Meters: counters, gauges and histograms reported to SkyWalking's meter system.

What a user writes::

    from swmp.meters import Counter, Gauge, Histogram, CounterMode

    orders = Counter("orders_total", labels={"shop": "eu"}, mode=CounterMode.RATE)
    queue = Gauge("queue_depth", supplier=lambda: float(len(q)))
    latency = Histogram("checkout_ms", steps=[10, 50, 100, 500])

    orders.increment()
    latency.observe(42.0)

Declaring a meter whose name and labels are already declared returns the existing one
(the Java agent's rule), so a meter can be declared where it is used.

Semantics (the SkyWalking meter API):

* ``Counter`` in ``INCREMENT`` mode reports its running total; in ``RATE`` mode it reports
  what was added since the previous report that reached the ring (a dropped report gives its
  delta back to the next one).
* ``Gauge`` reports whatever its supplier returns at report time.
* ``Histogram`` reports cumulative counts per bucket; a bucket is named by its lower bound
  and counts values in ``[bound, next bound)``. The first bound is ``min_value`` (0 unless
  told), so values below it are dropped and counted; ``min_value=-inf`` keeps everything
  (the first bucket is then flagged ``isNegativeInfinity``).

Every process reports for itself: one daemon thread per process writes one METER record
(``reporter_proc.records``) per period into the process's ring through ``swmp._sink``.
The thread is started lazily, never in a prefork master (it would cross every later fork
and hold locks at the wrong moment), on whichever comes first in a process:

1. the first ``increment``/``observe`` or ``Gauge`` declaration;
2. the fork moment of ``swmp.lifecycle`` (``os.register_at_fork`` and, under uWSGI,
   ``uwsgidecorators.postfork``) when meters are declared, PVM meters included;
3. the agent's sink binding this process to a ring slot (``swmp.lifecycle``'s "bound"
   moment: its first write, or the agent's own after-fork hook), again when meters are
   declared;
4. ``start_meter_reporter`` in a process that already owns its ring.

The trade-off: a single-process application whose only meters are PVM meters starts
reporting them with its first record (usually its first request), not at start, because at
start-up the agent cannot tell a future prefork master from a plain process.

After a fork the child drops what it inherited (values, locks, the parent's thread) and
counts from zero: each worker is its own instance. Fork is noticed by the hooks above;
under uWSGI without ``uwsgidecorators`` a pid comparison on the hot path is the backstop.

Nothing here raises into the application at run time (declaring a meter with invalid
arguments raises ``ValueError``, like any constructor): errors are logged once on
``swmp.meters`` and counted in :func:`stats`.

The package's parts: ``_registry`` (declaring, the registry), ``_kinds`` (the three
meters), ``_report`` (one METER record), ``_control`` (thread, fork, start/stop),
``_pvm`` (Python VM meters), ``_state`` (per-process state).
"""

from __future__ import annotations

from swmp.meters._control import (
    flush,
    start_in_this_process,
    start_meter_reporter,
    stats,
    stop_meter_reporter,
)
from swmp.meters._kinds import INCREMENT, RATE, Counter, CounterMode, Gauge, Histogram
from swmp.meters._pvm import PVM_METERS
from swmp.meters._registry import Registry, registry
from swmp.meters._report import report
from swmp.meters._state import here as _here  # noqa: F401 (tests look at it)

__all__ = [
    "INCREMENT",
    "PVM_METERS",
    "RATE",
    "Counter",
    "CounterMode",
    "Gauge",
    "Histogram",
    "Registry",
    "flush",
    "registry",
    "report",
    "start_in_this_process",
    "start_meter_reporter",
    "stats",
    "stop_meter_reporter",
]
