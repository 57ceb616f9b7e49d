"""Transports behind one interface (:class:`Sender`): gRPC, HTTP, Kafka, in-memory.

Network clients are imported only when a sender of that kind is created, inside the
reporter after fork: importing this package costs nothing.
"""

from __future__ import annotations

from reporter_proc.senders.base import (
    KINDS,
    FatalSendError,
    Record,
    Sender,
    SendError,
    UnsupportedError,
)
from reporter_proc.settings import ReporterSettings

__all__ = ["KINDS", "FatalSendError", "Record", "SendError", "Sender", "UnsupportedError", "create_sender"]


def create_sender(settings: ReporterSettings) -> Sender:
    """The sender for ``settings.protocol`` (grpc, http, kafka or memory)."""
    protocol = settings.protocol.strip().lower()
    if protocol == "grpc":
        from reporter_proc.senders.grpc_sender import GrpcSender  # noqa: PLC0415

        return GrpcSender(settings)
    if protocol == "http":
        from reporter_proc.senders.http_sender import HttpSender  # noqa: PLC0415

        return HttpSender(settings)
    if protocol == "kafka":
        from reporter_proc.senders.kafka_sender import KafkaSender  # noqa: PLC0415

        return KafkaSender(settings)
    if protocol == "memory":
        from reporter_proc.senders.memory import MemorySender  # noqa: PLC0415

        return MemorySender(
            path=getattr(settings, "memory_path", ""), fail_next=getattr(settings, "memory_fail_first", 0)
        )
    raise ValueError(f"unknown reporter protocol {settings.protocol!r} (grpc, http, kafka or memory)")
