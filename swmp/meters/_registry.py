"""The meters of this interpreter, and how a meter is declared (once per name and labels)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

Labels = Mapping[str, str] | Iterable[tuple[str, str]] | None


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

    # Observations a meter refused (only histograms refuse any; see Histogram.dropped).
    dropped: int = 0

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
