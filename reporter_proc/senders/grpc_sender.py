"""gRPC transport (``grpc.aio``) to the OAP's port 11800.

Records are encoded by ``reporter_proc.encode`` and handed to gRPC as raw bytes: every
method is a generic multicallable with no request serializer, so no protobuf object is
built on the send path. Only the profiling query decodes its answer (``Commands``).

The channel is created in :meth:`GrpcSender.start`, inside the reporter's event loop and
after the reporter was forked: a gRPC channel must never exist across a fork.

Segments go by default as one ``collectInSync`` call per batch (a ``SegmentCollection``):
each batch is acknowledged, so a failure is seen and retried. ``segment_stream=True``
(settings field ``grpc_segment_stream``) keeps one long-lived ``collect`` client stream
open instead and writes every segment into it; it is re-opened every
``stream_max_age_s`` so the backend's answer (and any error) comes back regularly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import grpc
from grpc import aio

from reporter_proc import encode
from reporter_proc.senders._common import Backends, encode_all, first_line
from reporter_proc.senders.base import (
    KINDS,
    FatalSendError,
    InvalidDataError,
    Record,
    Sender,
    SendError,
    TooLargeError,
)
from reporter_proc.senders.tls import check_no_plain_backend, client_context, read_file, tls_requested
from reporter_proc.settings import ReporterSettings
from reporter_proc.timeouts import limited

log = logging.getLogger("swmp.reporter.grpc")

_SEGMENT_COLLECT = "/skywalking.v3.TraceSegmentReportService/collect"
_SEGMENT_SYNC = "/skywalking.v3.TraceSegmentReportService/collectInSync"
_LOG_COLLECT = "/skywalking.v3.LogReportService/collect"
_METER_BATCH = "/skywalking.v3.MeterReportService/collectBatch"
_PROPERTIES = "/skywalking.v3.ManagementService/reportInstanceProperties"
_KEEP_ALIVE = "/skywalking.v3.ManagementService/keepAlive"
_PROFILE_QUERY = "/skywalking.v3.ProfileTask/getProfileTaskCommands"
_PROFILE_SNAPSHOT = "/skywalking.v3.ProfileTask/collectSnapshot"
_PROFILE_FINISH = "/skywalking.v3.ProfileTask/reportTaskFinish"

_UNARY = (_SEGMENT_SYNC, _PROPERTIES, _KEEP_ALIVE, _PROFILE_QUERY, _PROFILE_FINISH)
_CLIENT_STREAMS = (_SEGMENT_COLLECT, _LOG_COLLECT, _METER_BATCH, _PROFILE_SNAPSHOT)

# Retrying cannot fix these: wrong token, a payload the backend rejects, an RPC it lacks.
FATAL_CODES = frozenset(
    {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED}
)

_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 60_000),  # notice a dead backend behind a silent NAT/LB
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.enable_retries", 0),  # the reporter loop owns retries and counts them
    # Reconnect at least once a second while the backend is down (gRPC's default backoff
    # grows to 120 s), so delivery resumes within about a second of its return.
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def _too_large(details: str | None) -> bool:
    """RESOURCE_EXHAUSTED also means "overloaded": only a size complaint asks for a split."""
    text = (details or "").lower()
    return "larger than" in text or "too large" in text or "message length" in text


def _decode_commands(data: bytes) -> list[dict[str, str]]:
    from reporter_proc.protocol.generated.common_pb2 import Commands  # noqa: PLC0415

    out = []
    for cmd in Commands.FromString(data).commands:
        entry = {arg.key: arg.value for arg in cmd.args}
        entry["command"] = cmd.command
        out.append(entry)
    return out


def channel_credentials(settings: ReporterSettings) -> grpc.ChannelCredentials | None:
    """TLS credentials from the settings, or None for a plaintext channel.

    Files are read here, when the sender is built: a missing or unreadable one is a
    :class:`SecurityConfigError` (the reporter refuses to start), never a plaintext channel.
    """
    if not tls_requested(settings):
        return None
    check_no_plain_backend(settings.backends, "gRPC")
    # gRPC parses the PEM lazily, at the first handshake: load it once now (same checks and
    # messages as HTTP) so a bad file is refused at start with a reason.
    client_context(
        ca_file=settings.tls_ca_file, cert_file=settings.tls_cert_file, key_file=settings.tls_key_file
    )
    ca = read_file(settings.tls_ca_file, "CA file") if settings.tls_ca_file else None
    cert = read_file(settings.tls_cert_file, "client certificate") if settings.tls_cert_file else None
    key = read_file(settings.tls_key_file, "client key") if settings.tls_key_file else None
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


class GrpcSender(Sender):
    name = "grpc"
    supports = KINDS
    raw_kinds = frozenset({"segment"})  # encoded from the JSON bytes (encode.segment_payload)

    def __init__(
        self,
        settings: ReporterSettings,
        *,
        segment_stream: bool | None = None,
        stream_max_age_s: float = 30.0,
    ) -> None:
        self._backends = Backends(settings.backends, "gRPC")
        self.address = self._backends.current
        self._credentials = channel_credentials(settings)
        self._channel_options: list[tuple[str, int | str]] = list(_CHANNEL_OPTIONS)
        if settings.tls_server_name:
            self._channel_options.append(("grpc.ssl_target_name_override", settings.tls_server_name))
        self._timeout = settings.send_timeout_s
        self._metadata: tuple[tuple[str, str], ...] | None = (
            (("authentication", settings.authentication),) if settings.authentication else None
        )
        if segment_stream is None:
            segment_stream = bool(getattr(settings, "grpc_segment_stream", False))
        self.segment_stream = segment_stream
        self.stream_max_age_s = stream_max_age_s
        self._channel: aio.Channel | None = None
        self._methods: dict[str, Any] = {}
        self._generation = -1
        self._stream: Any = None  # the long-lived collect call (segment_stream mode)
        self._stream_opened = 0.0
        self._stream_lock: asyncio.Lock | None = None
        self._closing_channels: set[asyncio.Task[None]] = set()

    # -- channel ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._stream_lock = asyncio.Lock()
        self._open()

    def _open(self) -> None:
        address = self._backends.current
        if self._credentials is not None:
            channel = aio.secure_channel(address, self._credentials, options=self._channel_options)
        else:
            channel = aio.insecure_channel(address, options=self._channel_options)
        self._channel = channel
        self._generation = self._backends.generation
        self.address = address
        # Raw bytes both ways: requests are pre-encoded, answers decoded only where used.
        raw = {"request_serializer": None, "response_deserializer": None}
        self._methods = {path: channel.unary_unary(path, **raw) for path in _UNARY}
        self._methods.update({path: channel.stream_unary(path, **raw) for path in _CLIENT_STREAMS})

    def _channel_failed(self, generation: int) -> None:
        """Fail over to the next backend (when there is one) with a fresh channel."""
        if not self._backends.fail_over(generation):
            return
        old = self._channel
        self._stream = None
        self._open()
        if old is not None:
            # Closing cancels what is still in flight on the old backend; those callers see
            # an error and retry on the new one. Keep a reference until it is done.
            task = asyncio.ensure_future(old.close(grace=None))
            self._closing_channels.add(task)
            task.add_done_callback(self._closing_channels.discard)

    def _ready(self) -> int:
        if self._channel is None:
            raise SendError("gRPC sender not started")
        return self._generation

    def _error(self, exc: BaseException, generation: int, what: str) -> SendError:
        if isinstance(exc, aio.AioRpcError):
            code = exc.code()
            message = f"{what} to {self.address}: {code.name} {first_line(exc.details())}"
            if code is grpc.StatusCode.INVALID_ARGUMENT:
                return InvalidDataError(message)
            if code is grpc.StatusCode.RESOURCE_EXHAUSTED and _too_large(exc.details()):
                return TooLargeError(message)
            if code in FATAL_CODES:
                return FatalSendError(message)
        else:
            message = f"{what} to {self.address}: {type(exc).__name__} {first_line(exc)}"
        self._channel_failed(generation)
        return SendError(message)

    async def _unary(self, path: str, body: bytes, what: str) -> bytes:
        generation = self._ready()
        try:
            result: bytes = await self._methods[path](body, timeout=self._timeout, metadata=self._metadata)
            return result
        except asyncio.CancelledError:
            raise
        except (aio.AioRpcError, aio.UsageError, asyncio.TimeoutError, OSError) as exc:
            raise self._error(exc, generation, what) from exc

    async def _client_stream(self, path: str, bodies: Sequence[bytes], what: str) -> None:
        if not bodies:
            return
        generation = self._ready()
        try:
            await self._methods[path](iter(bodies), timeout=self._timeout, metadata=self._metadata)
        except asyncio.CancelledError:
            raise
        except (aio.AioRpcError, aio.UsageError, asyncio.TimeoutError, OSError) as exc:
            raise self._error(exc, generation, what) from exc

    # -- data ------------------------------------------------------------------------------
    async def send_segments(self, records: list[Record]) -> None:
        segments = encode_all(encode.segment_payload, records)
        if not segments:
            return
        if self.segment_stream:
            await self._stream_segments(segments)
        else:
            await self._unary(_SEGMENT_SYNC, encode.segment_collection(segments), "collectInSync")

    async def _stream_segments(self, segments: list[bytes]) -> None:
        generation = self._ready()
        assert self._stream_lock is not None
        async with self._stream_lock:  # writes of two batches must not interleave mid-message
            try:
                age = time.monotonic() - self._stream_opened
                if self._stream is not None and age > self.stream_max_age_s:
                    await self._finish_stream()
                if self._stream is None:
                    # No deadline: this call lives for stream_max_age_s; each write has one.
                    self._stream = self._methods[_SEGMENT_COLLECT](None, metadata=self._metadata)
                    self._stream_opened = time.monotonic()
                stream = self._stream
                for body in segments:
                    await limited(stream.write(body), self._timeout)
            except asyncio.CancelledError:
                raise
            except (
                aio.AioRpcError,
                aio.UsageError,
                asyncio.TimeoutError,
                asyncio.InvalidStateError,
                OSError,
            ) as exc:
                # A write to a call the backend ended raises that call's status. Whatever
                # was written into the broken stream may be lost: the whole batch is retried.
                self._abandon_stream()
                raise self._error(exc, generation, "collect stream") from exc

    def _abandon_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None and not stream.done():
            stream.cancel()

    async def _finish_stream(self) -> None:
        """End the current collect stream and wait for the backend's answer."""
        stream, self._stream = self._stream, None
        if stream is None:
            return
        await limited(stream.done_writing(), self._timeout)
        await limited(stream, self._timeout)

    async def send_logs(self, records: list[Record]) -> None:
        await self._client_stream(_LOG_COLLECT, encode_all(encode.log, records), "log collect")

    async def send_meters(self, records: list[Record]) -> None:
        # One MeterDataCollection per METER record (one report period of one instance):
        # collectBatch makes the backend process each one as it arrives.
        await self._client_stream(
            _METER_BATCH, encode_all(encode.meter_collection, records), "meter collectBatch"
        )

    async def send_snapshots(self, records: list[Record]) -> None:
        await self._client_stream(
            _PROFILE_SNAPSHOT, encode_all(encode.thread_snapshot, records), "collectSnapshot"
        )

    async def report_finish(self, record: Record) -> None:
        await self._unary(_PROFILE_FINISH, encode.profile_finish(record), "reportTaskFinish")

    # -- management and commands -----------------------------------------------------------
    async def report_properties(
        self, service: str, instance: str, properties: list[tuple[str, str]], layer: str = ""
    ) -> None:
        body = encode.instance_properties(service, instance, properties, layer)
        await self._unary(_PROPERTIES, body, "reportInstanceProperties")

    async def keep_alive(self, service: str, instance: str, layer: str = "") -> None:
        await self._unary(_KEEP_ALIVE, encode.instance_ping(service, instance, layer), "keepAlive")

    async def fetch_profile_commands(
        self, service: str, instance: str, last_command_time: int
    ) -> list[dict[str, str]]:
        body = encode.profile_task_query(service, instance, last_command_time)
        answer = await self._unary(_PROFILE_QUERY, body, "getProfileTaskCommands")
        try:
            return _decode_commands(answer)
        except Exception as exc:  # a garbled answer is the backend's fault, not a reason to crash
            raise SendError(f"undecodable profile commands from {self.address}: {exc}") from exc

    async def close(self) -> None:
        if self._stream is not None and self._stream_lock is not None:
            async with self._stream_lock:
                try:
                    await self._finish_stream()
                except Exception as exc:
                    log.warning("closing the segment stream: %r", exc)
                    self._abandon_stream()
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close(grace=1.0)
        if self._closing_channels:
            await asyncio.gather(*self._closing_channels, return_exceptions=True)
