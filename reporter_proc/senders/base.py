"""The one interface every transport implements.

The reporter loop talks only to :class:`Sender`; gRPC, HTTP, Kafka and the in-memory test
double are interchangeable behind it. Senders receive *decoded records* (the positional
lists of ``reporter_proc.records``) and encode them for their own wire, so the loop has one
code path whatever the protocol.

Error contract: a method returns normally when the backend accepted the data, raises
:class:`SendError` for failures worth retrying (refused, timeout, unavailable) and
:class:`FatalSendError` for failures that retrying cannot fix (bad credentials, rejected
payload, a kind the protocol does not carry). Two kinds of fatal failure say more, because
the caller can still save most of the data:

* :class:`TooLargeError` - the request was too big for the backend (gRPC
  ``RESOURCE_EXHAUSTED``, HTTP 413, Kafka ``MessageSizeTooLarge``): the caller splits the
  batch and sends the halves; a single record that is still too large is dropped and counted;
* :class:`InvalidDataError` - the backend refused the content (gRPC ``INVALID_ARGUMENT``,
  HTTP 400): some record is malformed, so the caller sends smaller parts to find it and
  drops only that record.

Nothing else escapes.
"""

from __future__ import annotations

import abc
from typing import Any

from reporter_proc.records import CAPABILITIES

# Every capability a sender may declare (``supports``); the record kinds that need each
# one are in ``reporter_proc.records.KINDS``.
KINDS = CAPABILITIES


class SendError(Exception):
    """The backend did not take the data; retrying later may work."""


class FatalSendError(SendError):
    """The backend refused the data for a reason retrying will not fix."""


class TooLargeError(FatalSendError):
    """The request was larger than the backend takes; smaller requests may pass."""


class InvalidDataError(FatalSendError):
    """The backend refused the content of the request; one record in it may be to blame."""


class UnsupportedError(FatalSendError):
    """This protocol has no way to carry that kind of data."""


Record = list[Any]


class Sender(abc.ABC):
    name: str = "abstract"
    supports: frozenset[str] = frozenset()
    address: str = ""
    raw_kinds: frozenset[str] = frozenset()
    """Kinds whose send method takes the records as the raw JSON bytes read from the rings
    (delivery skips decoding them; the spool replay may still pass decoded records)."""

    async def start(self) -> None:  # noqa: B027 (optional hook)
        """Create channels, sessions or producers. Called inside the reporter's event loop."""

    @abc.abstractmethod
    async def send_segments(self, records: list[Record]) -> None: ...

    async def send_logs(self, records: list[Record]) -> None:
        raise UnsupportedError(f"{self.name} does not carry logs")

    async def send_meters(self, records: list[Record]) -> None:
        raise UnsupportedError(f"{self.name} does not carry meters")

    async def send_snapshots(self, records: list[Record]) -> None:
        raise UnsupportedError(f"{self.name} does not carry profiling snapshots")

    async def report_finish(self, record: Record) -> None:
        raise UnsupportedError(f"{self.name} does not carry profiling")

    async def send_finishes(self, records: list[Record]) -> None:
        """A batch of PROFILE_FINISH records: the protocol reports them one by one."""
        for rec in records:
            await self.report_finish(rec)

    @abc.abstractmethod
    async def report_properties(
        self, service: str, instance: str, properties: list[tuple[str, str]], layer: str = ""
    ) -> None: ...

    @abc.abstractmethod
    async def keep_alive(self, service: str, instance: str, layer: str = "") -> None: ...

    async def fetch_profile_commands(
        self, service: str, instance: str, last_command_time: int
    ) -> list[dict[str, str]]:
        """Pending profiling commands, each as its args plus a ``"command"`` key."""
        return []

    async def close(self) -> None:  # noqa: B027 (optional hook)
        """Flush and release everything. Called once, inside the reporter's event loop."""
