"""An in-memory :class:`Sender` for tests and benchmarks.

It keeps every call it got, can be told to fail the next N calls (with :class:`SendError`
or :class:`FatalSendError`), to block (every call, or calls of some kinds) until released,
or to add a delay. Like a real
backend it can also refuse calls by content: ``max_call_bytes`` answers
:class:`TooLargeError` to a call whose records' JSON exceeds that size, and ``poison`` answers
:class:`InvalidDataError` to any call holding a record whose JSON contains that marker. With a ``path``
it also appends one JSON line per accepted call to that file, which is how a test observes
what a reporter running in *another process* delivered (``protocol="memory"`` plus
``ReporterSettings.memory_path``).

Nothing here imports a network client, so the reporter package stays import-light.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import orjson

from reporter_proc.senders.base import (
    KINDS,
    FatalSendError,
    InvalidDataError,
    Record,
    Sender,
    SendError,
    TooLargeError,
    UnsupportedError,
)


class MemorySender(Sender):
    name = "memory"

    def __init__(
        self,
        *,
        path: str = "",
        fail_next: int = 0,
        fatal: bool = False,
        delay_s: float = 0.0,
        supports: frozenset[str] = KINDS,
        address: str = "memory",
        max_call_bytes: int = 0,
        poison: bytes = b"",
    ) -> None:
        self.supports = supports
        self.address = address
        self.path = path
        self.delay_s = delay_s
        self.max_call_bytes = max_call_bytes  # 0 = no limit
        self.poison = poison  # b"" = none
        self.refused: list[str] = []  # the error class name of every call refused by content
        self.segments: list[Record] = []
        self.logs: list[Record] = []
        self.meters: list[Record] = []
        self.snapshots: list[Record] = []
        self.finishes: list[Record] = []
        self.properties: list[tuple[str, str, list[tuple[str, str]], str]] = []
        self.keepalives: list[tuple[str, str, str]] = []
        # Profile commands every fetch answers (tests set them), and the fetches asked.
        self.profile_commands: list[dict[str, str]] = []
        self.profile_queries: list[tuple[str, str, int]] = []
        self.calls = 0  # every call, failed or not
        self.failures = 0  # calls answered with an error
        self.started = False
        self.closed = False
        self._fail_next = fail_next
        self._fatal = fatal
        self._lock = threading.Lock()  # tests poke at the sender from other threads
        self._gate = threading.Event()
        self._gate.set()
        self._blocked: frozenset[str] | None = None  # kinds the gate holds (None: every kind)
        self._fd = -1

    # -- test controls (thread-safe) -------------------------------------------------------
    def fail_next(self, n: int, fatal: bool = False) -> None:
        """Answer the next ``n`` calls with an error instead of keeping their data."""
        with self._lock:
            self._fail_next = n
            self._fatal = fatal

    def block(self, kinds: frozenset[str] | None = None) -> None:
        """Make every call (or those of ``kinds``: ``"segment"``, ``"management"`` ...) wait,
        without keeping its data yet, until :meth:`unblock`."""
        self._blocked = kinds
        self._gate.clear()

    def unblock(self) -> None:
        self._gate.set()

    @property
    def total_records(self) -> int:
        with self._lock:
            return len(self.segments) + len(self.logs) + len(self.meters) + len(self.snapshots)

    # -- Sender API ------------------------------------------------------------------------
    async def start(self) -> None:
        if self.path:
            # Never through a planted link, as every file the agent writes (a test double too).
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            self._fd = os.open(self.path, flags, 0o600)
        self.started = True

    async def send_segments(self, records: list[Record]) -> None:
        await self._accept("segment", "segment", records, self.segments)

    async def send_logs(self, records: list[Record]) -> None:
        await self._accept("log", "log", records, self.logs)

    async def send_meters(self, records: list[Record]) -> None:
        await self._accept("meter", "meter", records, self.meters)

    async def send_snapshots(self, records: list[Record]) -> None:
        await self._accept("profile", "profile_snapshot", records, self.snapshots)

    async def report_finish(self, record: Record) -> None:
        await self._accept("profile", "profile_finish", [record], self.finishes)

    async def report_properties(
        self, service: str, instance: str, properties: list[tuple[str, str]], layer: str = ""
    ) -> None:
        await self._enter("management")
        with self._lock:
            self.properties.append((service, instance, list(properties), layer))
        self._log_line("properties", [[service, instance, [list(p) for p in properties], layer]])

    async def keep_alive(self, service: str, instance: str, layer: str = "") -> None:
        await self._enter("management")
        with self._lock:
            self.keepalives.append((service, instance, layer))
        self._log_line("keepalive", [[service, instance, layer]])

    async def fetch_profile_commands(
        self, service: str, instance: str, last_command_time: int
    ) -> list[dict[str, str]]:
        # Not counted in ``calls`` and never failed on purpose: the poller's rounds must not
        # use up failures a test meant for the data it sends.
        if "profile" not in self.supports:
            raise UnsupportedError("memory sender configured without profile")
        with self._lock:
            self.profile_queries.append((service, instance, last_command_time))
            # As the OAP answers: only the commands created after the asker's last one.
            return [dict(c) for c in self.profile_commands if _created(c) > last_command_time]

    async def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.closed = True

    # -- internals -------------------------------------------------------------------------
    async def _enter(self, kind: str) -> None:
        with self._lock:
            self.calls += 1
        if kind not in self.supports:
            with self._lock:
                self.failures += 1
            raise UnsupportedError(f"memory sender configured without {kind}")
        while not self._gate.is_set() and (self._blocked is None or kind in self._blocked):
            await asyncio.sleep(0.005)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        with self._lock:
            if self._fail_next > 0:
                self._fail_next -= 1
                self.failures += 1
                fatal = self._fatal
            else:
                return
        if fatal:
            raise FatalSendError("memory sender: told to refuse")
        raise SendError("memory sender: told to fail")

    async def _accept(self, kind: str, name: str, records: list[Record], into: list[Record]) -> None:
        await self._enter(kind)
        self._judge(records)
        with self._lock:
            into.extend(records)
        self._log_line(name, records)

    def _judge(self, records: list[Record]) -> None:
        """Refuse a call by its content, as a backend with size and validity rules would."""
        if not (self.max_call_bytes or self.poison):
            return
        encoded = [orjson.dumps(r) for r in records]
        error: FatalSendError | None = None
        if self.poison and any(self.poison in e for e in encoded):
            error = InvalidDataError("memory sender: a record is invalid")
        elif self.max_call_bytes and sum(len(e) for e in encoded) > self.max_call_bytes:
            error = TooLargeError(f"memory sender: call larger than {self.max_call_bytes} bytes")
        if error is not None:
            with self._lock:
                self.failures += 1
                self.refused.append(type(error).__name__)
            raise error

    def _log_line(self, name: str, records: list[Any]) -> None:
        if self._fd >= 0:
            # One write per call with O_APPEND: a reader in another process sees whole lines.
            os.write(self._fd, orjson.dumps({"kind": name, "records": records}) + b"\n")


def read_memory_file(path: str) -> list[dict[str, Any]]:
    """Parse a file written by a MemorySender (``path=``): one dict per accepted call."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    out = []
    for line in data.splitlines():
        if line.strip():
            out.append(orjson.loads(line))
    return out


def _created(command: dict[str, str]) -> int:
    try:
        return int(command.get("CreateTime", "0") or 0)
    except ValueError:
        return 0
