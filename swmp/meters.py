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
2. the fork hooks (``os.register_at_fork`` and, under uWSGI, ``uwsgidecorators.postfork``)
   when meters are declared, PVM meters included;
3. the agent's sink claiming this process's ring (its first write, or the agent's own
   after-fork hook), again when meters are declared;
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
"""

from __future__ import annotations

import enum
import gc
import logging
import math
import os
import sys
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from reporter_proc.records import METER, METER_HISTOGRAM, METER_SINGLE
from swmp import lifecycle
from swmp._sink import get_sink
from swmp.tracing.identity import identity

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

log = logging.getLogger("swmp.meters")

Labels = Mapping[str, str] | Iterable[tuple[str, str]] | None

# A histogram's "negative infinity" bucket: the protocol flags it; the bound itself is
# the lowest finite double (JSON has no -inf, and a consumer ignoring the flag still
# sorts it first).
_NEG_INF_BOUND = -sys.float_info.max

PVM_METERS = (
    "instance_pvm_total_cpu_utilization",
    "instance_pvm_process_cpu_utilization",
    "instance_pvm_total_mem_utilization",
    "instance_pvm_process_mem_utilization",
    "instance_pvm_thread_active_count",
    "instance_pvm_thread_daemon_count",
    "instance_pvm_gc_g0",
    "instance_pvm_gc_g1",
    "instance_pvm_gc_g2",
    "instance_pvm_gc_time",
)


class CounterMode(enum.IntEnum):
    """Values as in the peer Python agent."""

    INCREMENT = 1  # report the running total
    RATE = 2  # report what was added since the previous report


INCREMENT = CounterMode.INCREMENT
RATE = CounterMode.RATE


# -- per-process state -------------------------------------------------------------------------
class _Here:
    """What this process knows about its own reporting; replaced wholesale in a new process.

    ``ready`` is the one flag the hot path reads: False means "look at the process before
    counting" (a new process, a new configuration). ``check_pid`` turns on the pid backstop
    where no fork hook can be trusted to clear ``ready``.
    """

    __slots__ = ("check_pid", "final", "pid", "ready", "thread")

    def __init__(self, pid: int, check_pid: bool) -> None:
        self.pid = pid
        self.ready = False
        self.check_pid = check_pid
        self.thread: _MeterThread | None = None
        self.final = False  # flush() ran here: no restart until the reporter is started again


class _Settings:
    __slots__ = ("period", "pvm")

    def __init__(self, period: float, pvm: bool) -> None:
        self.period = period
        self.pvm = pvm


class _Stats:
    __slots__ = ("errors", "reports_dropped", "reports_written", "supplier_errors")

    def __init__(self) -> None:
        self.reports_written = 0  # METER records the sink accepted
        self.reports_dropped = 0  # METER records the sink refused (ring full, no ring)
        self.supplier_errors = 0  # gauge suppliers that raised or returned a non-number
        self.errors = 0  # reports that could not be built, threads that did not start


_here = _Here(os.getpid(), check_pid=False)
_settings: _Settings | None = None  # set by start_meter_reporter; None: not reporting
_stats = _Stats()
_state_lock = threading.Lock()  # _here.thread, _settings; never held while reporting
_report_lock = threading.Lock()  # one report at a time (thread, flush, report())
_new_process_locks: dict[int, threading.Lock] = {}
_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        log.error(message, *args, exc_info=True)


def _enter() -> None:
    """The slow path behind the hot path's flag: a new process, or reporting not settled."""
    try:
        pid = os.getpid()
        if _here.pid != pid:
            _new_process(pid)
        _maybe_start()
    except Exception:
        _stats.errors += 1
        _warn_once("enter", "swmp: meter bookkeeping failed in pid %d", os.getpid())
        _here.ready = True  # do not retry on every increment


def _new_process(pid: int) -> None:
    """Forget what the parent process had: values, locks, its reporter thread."""
    global _here, _state_lock, _report_lock, _stats
    # One lock per pid from setdefault (atomic under the GIL): the hooks and the pid
    # backstop may race here, and any lock inherited from the parent may be held forever.
    with _new_process_locks.setdefault(pid, threading.Lock()):
        if _here.pid == pid:
            return
        _state_lock = threading.Lock()
        _report_lock = threading.Lock()
        _stats = _Stats()  # the child's own counts
        registry._after_fork()
        _pvm.after_fork()
        _here = _Here(pid, _here.check_pid)
        for stale in [p for p in _new_process_locks if p != pid]:
            _new_process_locks.pop(stale, None)


def _maybe_start() -> None:
    """Start this process's reporter thread if it should run and is not running."""
    with _state_lock:
        here = _here
        thread = here.thread
        settings = _settings
        if thread is not None and thread.is_alive():
            pass
        elif settings is None or here.final or not lifecycle.may_report_here():
            pass  # start_meter_reporter / a fork makes us look again
        else:
            thread = _MeterThread(settings.period)
            try:
                thread.start()
            except RuntimeError:  # interpreter shutting down, or no more threads
                _stats.errors += 1
                _warn_once("thread", "swmp: cannot start the meter thread in pid %d", os.getpid())
            else:
                here.thread = thread
        here.ready = True


def _after_fork_in_child() -> None:
    try:
        _new_process(os.getpid())
        if len(registry):
            _maybe_start()  # PVM and declared gauges report without waiting for a call
    except Exception:
        _stats.errors += 1
        _warn_once("fork", "swmp: meter after-fork setup failed in pid %d", os.getpid())


def _on_bound(role: str) -> None:
    """The sink bound this process: a worker starts reporting declared meters now."""
    if role == lifecycle.WORKER and len(registry):
        _enter()


# Fork and binding come from swmp.lifecycle; where its fork hooks cannot be trusted
# (uWSGI without uwsgidecorators), the hot path compares pids.
lifecycle.on_fork(_after_fork_in_child)
_here.check_pid = not lifecycle.FORK_HOOKS_RELIABLE


# -- meters ------------------------------------------------------------------------------------
def _normalize_labels(labels: Labels) -> tuple[tuple[str, str], ...]:
    if labels is None:
        return ()
    pairs = labels.items() if isinstance(labels, Mapping) else labels
    out: dict[str, str] = {}
    for name, value in pairs:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a label name must be a non-empty string, got {name!r}")
        out[name] = str(value)
    return tuple(sorted(out.items()))


class _Meter:
    """What every meter has: a name, labels, a lock (replaced after fork)."""

    __slots__ = ("_flat", "_lock", "_params", "labels", "name")

    name: str
    labels: tuple[tuple[str, str], ...]
    _flat: list[str]  # the labels as the record carries them: [name, value, ...]
    _params: tuple[Any, ...]
    _lock: threading.Lock

    def _reset(self) -> None:
        """A new process: zero what was counted (and take a fresh lock)."""
        self._lock = threading.Lock()

    def _collect(self, undo: list[Callable[[], None]]) -> list[Any] | None:
        """This meter's entry of a METER record; may append a give-back to ``undo``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, labels={dict(self.labels)!r})"


def _declare(
    cls: type[Any], name: str, labels: Labels, params: tuple[Any, ...], init: Callable[[Any], None]
) -> Any:
    """The meter ``(name, labels)``: the registered one, or a new one set up by ``init``.

    Creation and registration happen under the registry lock, so two threads declaring the
    same meter at once get the same object.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a meter name must be a non-empty string, got {name!r}")
    norm = _normalize_labels(labels)
    key = (name, norm)
    with registry._lock:
        existing = registry._meters.get(key)
        if existing is not None:
            if type(existing) is not cls or existing._params != params:
                raise ValueError(f"{existing!r} is already declared with other parameters")
            return existing
        meter = object.__new__(cls)
        meter.name = name
        meter.labels = norm
        meter._params = params
        meter._lock = threading.Lock()
        meter._flat = [part for pair in norm for part in pair]
        init(meter)
        registry._meters[key] = meter
        return meter


class Counter(_Meter):
    """A number that only grows; see the module doc for RATE vs INCREMENT."""

    __slots__ = ("_value", "mode")

    mode: CounterMode
    _value: float

    def __new__(cls, name: str, labels: Labels = None, mode: CounterMode | int = INCREMENT) -> Counter:
        mode = CounterMode(mode)

        def init(meter: Counter) -> None:
            meter.mode = mode
            meter._value = 0

        counter: Counter = _declare(cls, name, labels, (mode,), init)
        return counter

    def increment(self, value: float = 1) -> None:
        here = _here
        if not here.ready or (here.check_pid and here.pid != os.getpid()):
            _enter()
        with self._lock:
            self._value += value

    @property
    def value(self) -> float:
        """The running total (INCREMENT) or what the next report will carry (RATE)."""
        return self._value

    def _reset(self) -> None:
        super()._reset()
        self._value = 0

    def _collect(self, undo: list[Callable[[], None]]) -> list[Any] | None:
        with self._lock:
            value = self._value
            if self.mode is RATE:
                self._value = 0
        if self.mode is RATE and value:
            undo.append(lambda: self._give_back(value))
        if not math.isfinite(value):
            return None
        return [METER_SINGLE, self.name, self._flat, float(value)]

    def _give_back(self, delta: float) -> None:
        with self._lock:
            self._value += delta


class Gauge(_Meter):
    """A value read from ``supplier()`` at each report (declared once: the first supplier wins)."""

    __slots__ = ("_supplier",)

    _supplier: Callable[[], float]

    def __new__(cls, name: str, labels: Labels = None, supplier: Callable[[], float] | None = None) -> Gauge:
        if not callable(supplier):
            raise ValueError(f"gauge {name!r} needs a supplier: a callable returning a number")
        read: Callable[[], float] = supplier

        def init(meter: Gauge) -> None:
            meter._supplier = read

        gauge: Gauge = _declare(cls, name, labels, (), init)
        here = _here
        if not here.ready or (here.check_pid and here.pid != os.getpid()):
            _enter()  # a gauge is never "used": its declaration is what starts reporting
        return gauge

    def _collect(self, undo: list[Callable[[], None]]) -> list[Any] | None:
        try:
            value = float(self._supplier())
        except Exception:
            _stats.supplier_errors += 1
            _warn_once(f"gauge:{self.name}", "swmp: the supplier of gauge %r failed", self.name)
            return None
        if not math.isfinite(value):
            _stats.supplier_errors += 1
            return None
        return [METER_SINGLE, self.name, self._flat, value]


class Histogram(_Meter):
    """Counts of observed values per bucket; ``steps`` are the buckets' lower bounds."""

    __slots__ = ("_bounds", "_counts", "_min", "_wire_bounds", "dropped")

    _bounds: list[float]
    _min: float
    _wire_bounds: list[tuple[float, bool]]
    _counts: list[int]
    dropped: int

    def __new__(
        cls, name: str, steps: Iterable[float], labels: Labels = None, min_value: float = 0.0
    ) -> Histogram:
        bounds = _bucket_bounds(name, steps, min_value)

        def init(meter: Histogram) -> None:
            meter._bounds = bounds
            meter._min = bounds[0]
            meter._wire_bounds = [(_NEG_INF_BOUND, True) if b == -math.inf else (b, False) for b in bounds]
            meter._counts = [0] * len(bounds)
            meter.dropped = 0  # observations below the first bucket (or NaN)

        histogram: Histogram = _declare(cls, name, labels, (tuple(bounds),), init)
        return histogram

    def observe(self, value: float) -> None:
        here = _here
        if not here.ready or (here.check_pid and here.pid != os.getpid()):
            _enter()
        if not value >= self._min:  # below the first bucket, or NaN
            with self._lock:
                self.dropped += 1
            return
        index = bisect_right(self._bounds, value) - 1
        with self._lock:
            self._counts[index] += 1

    @property
    def buckets(self) -> list[tuple[float, int]]:
        """``[(lower bound, count), ...]`` as the next report will carry them."""
        with self._lock:
            return list(zip(self._bounds, self._counts, strict=True))

    def _reset(self) -> None:
        super()._reset()
        self._counts = [0] * len(self._bounds)
        self.dropped = 0

    def _collect(self, undo: list[Callable[[], None]]) -> list[Any] | None:
        with self._lock:
            counts = list(self._counts)
        values = [[b, c, neg] for (b, neg), c in zip(self._wire_bounds, counts, strict=True)]
        return [METER_HISTOGRAM, self.name, self._flat, values]


def _bucket_bounds(name: str, steps: Iterable[float], min_value: float) -> list[float]:
    try:
        bounds = sorted({float(s) for s in steps})
        low = float(min_value)
    except (TypeError, ValueError):
        raise ValueError(f"histogram {name!r}: steps and min_value must be numbers") from None
    if not bounds:
        raise ValueError(f"histogram {name!r} needs at least one step")
    if math.isnan(low) or low == math.inf or not all(math.isfinite(b) for b in bounds):
        raise ValueError(f"histogram {name!r}: steps must be finite and min_value not NaN/+inf")
    if bounds[0] < low:
        raise ValueError(f"histogram {name!r}: step {bounds[0]} is below min_value {low}")
    if bounds[0] > low:
        bounds.insert(0, low)
    return bounds


class Registry:
    """The meters of this interpreter, in declaration order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._meters: dict[tuple[str, tuple[tuple[str, str], ...]], _Meter] = {}

    def remove(self, meter: _Meter) -> None:
        with self._lock:
            if self._meters.get((meter.name, meter.labels)) is meter:
                del self._meters[(meter.name, meter.labels)]

    def get(self, name: str, labels: Labels = None) -> _Meter | None:
        return self._meters.get((name, _normalize_labels(labels)))

    def meters(self) -> list[_Meter]:
        with self._lock:
            return list(self._meters.values())

    def clear(self) -> None:
        with self._lock:
            self._meters.clear()

    def __len__(self) -> int:
        return len(self._meters)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        for meter in list(self._meters.values()):
            meter._reset()


registry = Registry()


# -- reporting ---------------------------------------------------------------------------------
def _build() -> tuple[bytes | None, list[Callable[[], None]]]:
    """One METER record of every meter (None when there is nothing to report)."""
    undo: list[Callable[[], None]] = []
    meters: list[list[Any]] = []
    for meter in registry.meters():
        entry = meter._collect(undo)
        if entry is not None:
            meters.append(entry)
    if not meters:
        return None, undo
    record = [int(time.time() * 1000), identity.service, identity.instance, meters]
    return orjson.dumps(record), undo


def report() -> bool:
    """Write one report of every meter now; True if the sink took it. Never raises."""
    with _report_lock:
        undo: list[Callable[[], None]] = []
        try:
            payload, undo = _build()
            if payload is None:
                return False
            ok = get_sink().write(METER, payload)
        except Exception:
            _stats.errors += 1
            _warn_once("report", "swmp: a meter report failed")
            ok = False
        if ok:
            _stats.reports_written += 1
        else:
            _stats.reports_dropped += 1
            for give_back in undo:  # RATE deltas travel with the next report
                give_back()
        return ok


class _MeterThread(threading.Thread):
    def __init__(self, period: float) -> None:
        super().__init__(name="swmp-meters", daemon=True)
        self.period = period
        self.stopping = threading.Event()

    def run(self) -> None:
        _pvm.prime()
        while not self.stopping.wait(self.period):
            report()

    def stop(self, timeout: float) -> None:
        self.stopping.set()
        if self is not threading.current_thread():
            self.join(timeout)


# -- PVM meters --------------------------------------------------------------------------------
class _Pvm:
    """Python VM meters of this process, named as the OAP's python-runtime rules expect."""

    def __init__(self) -> None:
        self._pid = -1
        self._process: Any = None
        self._psutil: Any = None
        self.gc_ms = 0.0  # total time spent in collections since the callback was installed
        self._gc_started = 0.0
        self._installed = False

    def install(self) -> None:
        if self._installed:
            return
        try:
            import psutil  # noqa: PLC0415 (only when PVM meters are on)

            self._psutil = psutil
        except ImportError:
            log.warning("swmp: psutil is missing; PVM CPU and memory meters are not reported")
        gc.callbacks.append(self._on_gc)
        suppliers: dict[str, Callable[[], float]] = {
            "instance_pvm_total_cpu_utilization": self.total_cpu,
            "instance_pvm_process_cpu_utilization": self.process_cpu,
            "instance_pvm_total_mem_utilization": self.total_mem,
            "instance_pvm_process_mem_utilization": self.process_mem,
            "instance_pvm_thread_active_count": self.threads,
            "instance_pvm_thread_daemon_count": self.daemon_threads,
            "instance_pvm_gc_g0": lambda: float(gc.get_stats()[0]["collected"]),
            "instance_pvm_gc_g1": lambda: float(gc.get_stats()[1]["collected"]),
            "instance_pvm_gc_g2": lambda: float(gc.get_stats()[2]["collected"]),
            "instance_pvm_gc_time": lambda: self.gc_ms,
        }
        for name, supplier in suppliers.items():
            if self._psutil is None and ("cpu" in name or "mem" in name):
                continue
            Gauge(name, supplier=supplier)
        self._installed = True

    def uninstall(self) -> None:
        if not self._installed:
            return
        self._installed = False
        try:
            gc.callbacks.remove(self._on_gc)
        except ValueError:
            pass
        for name in PVM_METERS:
            meter = registry.get(name)
            if meter is not None:
                registry.remove(meter)

    def after_fork(self) -> None:
        self._pid = -1  # psutil.Process() caches the pid: take a new one on first use

    def prime(self) -> None:
        """CPU percentages compare with the previous call: take the first sample now."""
        if self._installed and self._psutil is not None:
            try:
                self._psutil.cpu_percent(None)
                self._proc()
            except Exception:
                log.debug("PVM priming failed", exc_info=True)

    def _proc(self) -> Any:
        pid = os.getpid()
        if self._pid != pid:
            self._process = self._psutil.Process(pid)
            self._process.cpu_percent(None)
            self._pid = pid
        return self._process

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        # Collections never nest, so one start time serves every thread.
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started:
            self.gc_ms += (time.perf_counter() - self._gc_started) * 1000.0
            self._gc_started = 0.0

    def total_cpu(self) -> float:
        return float(self._psutil.cpu_percent(None))  # whole machine, since the last report

    def process_cpu(self) -> float:
        return float(self._proc().cpu_percent(None))  # this process; 100 = one core

    def total_mem(self) -> float:
        return float(self._psutil.virtual_memory().percent)

    def process_mem(self) -> float:
        rss = float(self._proc().memory_info().rss)
        return 100.0 * rss / float(self._psutil.virtual_memory().total)

    def threads(self) -> float:
        if self._psutil is None:
            return float(threading.active_count())
        return float(self._proc().num_threads())  # OS threads, C-level ones included

    def daemon_threads(self) -> float:
        return float(sum(1 for t in threading.enumerate() if t.daemon))


_pvm = _Pvm()


# -- lifecycle ---------------------------------------------------------------------------------
def start_meter_reporter(config: Any) -> None:
    """Turn reporting on (the agent calls this at start, in the master). Never raises.

    ``config`` is a :class:`swmp.config.Config` (or anything with its
    ``agent_meter_reporter_period`` and ``agent_pvm_meter_reporter_active``). No thread is
    started here unless this process already owns its ring: see the module doc.
    """
    global _settings
    try:
        period = float(getattr(config, "agent_meter_reporter_period", 20.0))
        pvm = bool(getattr(config, "agent_pvm_meter_reporter_active", True))
        if not period > 0:
            period = 20.0
        if pvm:
            _pvm.install()
        else:
            _pvm.uninstall()
        with _state_lock:
            _settings = _Settings(period, pvm)
            _here.final = False
            _here.ready = False  # the next use looks at the process again
        lifecycle.on_bound(_on_bound)
        lifecycle.on_leave(_flush_on_leave)
        if lifecycle.is_reporting_worker() and len(registry):
            _enter()
    except Exception:
        _stats.errors += 1
        _warn_once("start", "swmp: the meter reporter could not be set up")


def start_in_this_process() -> bool:
    """Start this process's reporter thread now (an application that knows it is not a
    prefork master). True if the thread runs. Needs :func:`start_meter_reporter` first."""
    _here.ready = False
    _enter()
    thread = _here.thread
    return thread is not None and thread.is_alive()


def flush(timeout: float = 2.0) -> bool:
    """Stop this process's meter thread and write a final report (the agent calls this at
    exit, before the worker leaves its ring). True if a report was written."""
    try:
        if _here.pid != os.getpid():
            return False  # a forked process that never reported inherits nothing to flush
        with _state_lock:
            thread = _here.thread
            _here.thread = None
            _here.final = True
        if thread is None:
            return False
        thread.stop(timeout)
        return report()
    except Exception:
        _warn_once("flush", "swmp: the final meter report failed")
        return False


def stop_meter_reporter(timeout: float = 2.0) -> None:
    """Flush, then turn reporting off in this process (PVM meters are removed)."""
    global _settings
    flush(timeout)
    with _state_lock:
        _settings = None
        _here.ready = False
    _pvm.uninstall()
    lifecycle.unsubscribe(_on_bound)
    lifecycle.unsubscribe(_flush_on_leave)


def stats() -> dict[str, int | bool]:
    """Counters of this process's meter reporting (for status pages and tests)."""
    thread = _here.thread
    return {
        "reports_written": _stats.reports_written,
        "reports_dropped": _stats.reports_dropped,
        "supplier_errors": _stats.supplier_errors,
        "errors": _stats.errors,
        "observations_dropped": sum(m.dropped for m in registry.meters() if isinstance(m, Histogram)),
        "meters": len(registry),
        "thread_alive": bool(thread is not None and thread.is_alive() and _here.pid == os.getpid()),
    }


def _flush_on_leave() -> None:
    try:
        flush()
    except Exception:
        pass
