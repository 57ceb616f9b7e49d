"""The three meters: Counter, Gauge, Histogram (see the package doc for their semantics)."""

from __future__ import annotations

import enum
import math
import os
import sys
from bisect import bisect_right
from collections.abc import Callable, Iterable
from typing import Any

from reporter_proc import records as R
from swmp.meters._control import enter
from swmp.meters._registry import Labels, _declare, _Meter
from swmp.meters._state import here as _here
from swmp.meters._state import log as _log
from swmp.meters._state import stats as _stats
from swmp.meters._state import warn_once

# A histogram's "negative infinity" bucket: the protocol flags it; the bound itself is
# the lowest finite double (JSON has no -inf, and a consumer ignoring the flag still
# sorts it first).
_NEG_INF_BOUND = -sys.float_info.max


def _number(meter: str, value: Any) -> float | None:
    """``value`` as a finite float, or None: refused, counted, said once per meter.

    The hot paths take ints and finite floats themselves; this is the rest. A number type of
    another library (Decimal, Fraction, numpy's: they define ``__float__``) counts as its
    float; anything else (a str, None, a complex) or NaN/inf would raise in the caller or
    poison the meter's total, and meters never raise at run time."""
    try:
        # __float__, not float(): float("1") would parse a str, and str is not a number here
        number = float(value) if hasattr(type(value), "__float__") else math.nan
    except Exception:
        number = math.nan
    if math.isfinite(number):
        return number
    _stats.values_refused += 1
    if meter not in _refused_once:
        _refused_once.add(meter)
        _log.warning(
            "swmp: meter %r was given %r, not a finite number; refused and counted (values_refused)",
            meter,
            value,
        )
    return None


_refused_once: set[str] = set()


class CounterMode(enum.IntEnum):
    """Values as in the peer Python agent."""

    INCREMENT = 1  # report the running total
    RATE = 2  # report what was added since the previous report


INCREMENT = CounterMode.INCREMENT
RATE = CounterMode.RATE


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
            enter()
        cls = value.__class__
        if cls is not int and (cls is not float or not math.isfinite(value)):
            number = _number(self.name, value)
            if number is None:
                return
            value = number
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
        return R.single_meter(self.name, self._flat, float(value))

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
            enter()  # a gauge is never "used": its declaration is what starts reporting
        return gauge

    def _collect(self, undo: list[Callable[[], None]]) -> list[Any] | None:
        try:
            value = float(self._supplier())
        except Exception:
            _stats.supplier_errors += 1
            warn_once(f"gauge:{self.name}", "swmp: the supplier of gauge %r failed", self.name)
            return None
        if not math.isfinite(value):
            _stats.supplier_errors += 1
            return None
        return R.single_meter(self.name, self._flat, value)


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
            enter()
        cls = value.__class__
        if cls is not int and cls is not float:  # NaN floats go below, counted as dropped
            number = _number(self.name, value)
            if number is None:
                return
            value = number
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
        return R.histogram_meter(self.name, self._flat, values)


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
