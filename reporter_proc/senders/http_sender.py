"""HTTP transport (``aiohttp``) to the OAP's REST receiver (port 12800).

Bodies are proto3 JSON (``reporter_proc.jsonwire``): ``/v3/segments`` and ``/v3/logs`` take
arrays, management calls one object. The receiver has no meters or profiling, so this
sender does not claim them (``supports``) and the loop drops those kinds, counted.

One ``ClientSession`` lives as long as the sender (connection reuse); it is created in
:meth:`HttpSender.start`, inside the reporter's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

import aiohttp

from reporter_proc import jsonwire
from reporter_proc.senders._common import Backends, encode_all, first_line
from reporter_proc.senders.base import (
    FatalSendError,
    InvalidDataError,
    Record,
    Sender,
    SendError,
    TooLargeError,
)
from reporter_proc.senders.tls import agent_context, check_no_plain_backend, tls_requested
from reporter_proc.settings import ReporterSettings

log = logging.getLogger("swmp.reporter.http")

# Statuses worth retrying besides 5xx: request timeout and rate limiting.
RETRYABLE_4XX = frozenset({408, 429})


class HttpSender(Sender):
    name = "http"
    supports = frozenset({"segment", "log", "management"})

    def __init__(self, settings: ReporterSettings) -> None:
        self._backends = Backends(settings.backends, "HTTP")
        self.address = self._backends.current
        tls = tls_requested(settings)
        if tls:
            check_no_plain_backend(settings.backends, "HTTP")
        self._scheme = "https" if tls else "http"
        # One verifying context for every https:// request (a bare "host:port" with TLS on,
        # or an explicit https:// backend); None lets aiohttp use its default for https.
        self._ssl: ssl.SSLContext | None = agent_context(settings) if tls else None
        self._server_name = settings.tls_server_name or None
        self._timeout = settings.send_timeout_s
        self._headers = {"Content-Type": "application/json"}
        if settings.authentication:
            self._headers["Authentication"] = settings.authentication
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self._timeout), headers=self._headers
        )

    def _url(self, path: str) -> str:
        base = self._backends.current.rstrip("/")
        if "://" not in base:  # "host:port" as SW_AGENT_COLLECTOR_BACKEND_SERVICES has it
            base = f"{self._scheme}://{base}"
        return base + path

    async def _post(self, path: str, body: bytes) -> None:
        session = self._session
        if session is None:
            raise SendError("HTTP sender not started")
        generation = self._backends.generation
        url = self._url(path)
        try:
            async with session.post(
                url, data=body, ssl=self._ssl or True, server_hostname=self._server_name
            ) as resp:
                if 200 <= resp.status < 300:
                    await resp.read()  # let the connection go back to the pool
                    return
                detail = first_line(await resp.text(errors="replace"))
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            self._fail_over(generation)
            raise SendError(f"POST {url}: {type(exc).__name__} {first_line(exc)}") from exc
        message = f"POST {url}: HTTP {resp.status} {detail}"
        if resp.status == 413:
            raise TooLargeError(message)
        if resp.status == 400:
            raise InvalidDataError(message)
        if 400 <= resp.status < 500 and resp.status not in RETRYABLE_4XX:
            raise FatalSendError(message)
        self._fail_over(generation)
        raise SendError(message)

    def _fail_over(self, generation: int) -> None:
        if self._backends.fail_over(generation):
            self.address = self._backends.current

    async def send_segments(self, records: list[Record]) -> None:
        objs = encode_all(jsonwire.segment, records)
        if objs:
            await self._post("/v3/segments", jsonwire.dumps(objs))

    async def send_logs(self, records: list[Record]) -> None:
        objs = encode_all(jsonwire.log, records)
        if objs:
            await self._post("/v3/logs", jsonwire.dumps(objs))

    async def report_properties(
        self, service: str, instance: str, properties: list[tuple[str, str]], layer: str = ""
    ) -> None:
        body = jsonwire.dumps(jsonwire.instance_properties(service, instance, properties, layer))
        await self._post("/v3/management/reportProperties", body)

    async def keep_alive(self, service: str, instance: str, layer: str = "") -> None:
        body = jsonwire.dumps(jsonwire.instance_ping(service, instance, layer))
        await self._post("/v3/management/keepAlive", body)

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
