"""Propagation headers as ``skywalking.trace.carrier.Carrier``: iterate its items.

Outgoing: ``for item in span.inject(): headers[item.key] = item.val``.
Incoming: ``carrier = Carrier(); for item in carrier: item.val = headers.get(item.key)``,
then ``context.new_entry_span(op, carrier)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping


class CarrierItem:
    def __init__(self, key: str = "", val: str = "") -> None:
        self.key = key
        self.val = val


class Carrier:
    """The ``sw8``, ``sw8-correlation`` and ``sw8-x`` headers of one call."""

    def __init__(self, headers: Mapping[str, str] | None = None) -> None:
        headers = headers or {}
        self.items = [CarrierItem(k, headers.get(k, "")) for k in ("sw8", "sw8-correlation", "sw8-x")]

    def __iter__(self) -> Iterator[CarrierItem]:
        return iter(self.items)

    def headers(self) -> dict[str, str]:
        return {item.key: item.val for item in self.items if item.val}

    @property
    def is_valid(self) -> bool:
        return bool(self.items[0].val)
