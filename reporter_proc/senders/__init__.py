"""Transports behind one interface (:class:`Sender`): gRPC, HTTP, Kafka, in-memory.

Network clients are imported only when a sender of that kind is created, inside the
reporter after fork: importing this package costs nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from reporter_proc.senders.base import (
    KINDS,
    FatalSendError,
    Record,
    Sender,
    SendError,
    UnsupportedError,
)
from reporter_proc.settings import ReporterSettings

__all__ = [
    "KINDS",
    "FatalSendError",
    "Record",
    "SendError",
    "Sender",
    "UnsupportedError",
    "create_sender",
    "import_sender",
]


# The network senders: protocol -> (module, class). Imported by name, on demand.
_NETWORK = {
    "grpc": ("reporter_proc.senders.grpc_sender", "GrpcSender"),
    "http": ("reporter_proc.senders.http_sender", "HttpSender"),
    "kafka": ("reporter_proc.senders.kafka_sender", "KafkaSender"),
}


def import_sender(protocol: str) -> Callable[[ReporterSettings], Sender] | None:
    """The sender class for ``protocol``, its client library imported (None: not a network
    protocol). Thread mode's reporter thread calls it as it starts, to make all its imports
    at once (see ``reporter_proc.thread_mode``)."""
    entry = _NETWORK.get(protocol.strip().lower())
    if entry is None:
        return None
    module, name = entry
    cls: Callable[[ReporterSettings], Sender] = getattr(importlib.import_module(module), name)
    return cls


def create_sender(settings: ReporterSettings) -> Sender:
    """The sender for ``settings.protocol`` (grpc, http, kafka or memory)."""
    network = import_sender(settings.protocol)
    if network is not None:
        return network(settings)
    if settings.protocol.strip().lower() == "memory":
        from reporter_proc.senders.memory import MemorySender  # noqa: PLC0415

        return MemorySender(
            path=getattr(settings, "memory_path", ""), fail_next=getattr(settings, "memory_fail_first", 0)
        )
    raise ValueError(f"unknown reporter protocol {settings.protocol!r} (grpc, http, kafka or memory)")
