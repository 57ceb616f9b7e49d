"""Pieces every network sender shares: encoding a batch up front, and backend fail-over."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from reporter_proc.encode import EncodeError
from reporter_proc.senders.base import Record

log = logging.getLogger("swmp.reporter.sender")

T = TypeVar("T")


def encode_all(fn: Callable[[Record], T], records: Sequence[Record]) -> list[T]:
    """Encode every record before anything is sent.

    An invalid record raises :class:`EncodeError` while nothing of the batch has left yet, so
    the loop can split the batch and resend the good records without duplicating any.
    """
    return [fn(rec) for rec in records]


class Backends:
    """The configured backends, one in use; fail-over moves to the next, round-robin.

    ``generation`` grows on every switch: a failure seen on an older generation (a call
    that was in flight on the previous backend) must not switch again and skip a backend.
    """

    def __init__(self, addresses: Sequence[str], what: str) -> None:
        cleaned = [a.strip() for a in addresses if a and a.strip()]
        if not cleaned:
            raise ValueError(f"no {what} backend configured (SW_AGENT_COLLECTOR_BACKEND_SERVICES is empty)")
        self.addresses = cleaned
        self.index = 0
        self.generation = 0

    @property
    def current(self) -> str:
        return self.addresses[self.index]

    def fail_over(self, generation: int) -> bool:
        """Switch to the next backend if ``generation`` is still current; True when switched."""
        if len(self.addresses) < 2 or generation != self.generation:
            return False
        old = self.current
        self.index = (self.index + 1) % len(self.addresses)
        self.generation += 1
        log.warning("backend %s failed; switching to %s", old, self.current)
        return True


def first_line(value: Any, limit: int = 200) -> str:
    """A short, single-line description for error messages."""
    text = str(value).strip().splitlines()
    return text[0][:limit] if text else ""


__all__ = ["Backends", "EncodeError", "encode_all", "first_line"]
