"""Spool replay end to end with the in-memory sender: a read that fails part-way resumes
where it stopped, and each record is sent and counted once."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from reporter_proc import records as R
from reporter_proc.delivery import Delivery
from reporter_proc.journal import Journal
from reporter_proc.ledger import Ledger
from reporter_proc.lifecycle import StopState
from reporter_proc.senders.base import Record, SendError
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from reporter_proc.spool import Spool
from reporter_proc.spooling import Replayer, SpoolWriter
from tests.test_reporter_helpers import log_record, segment


def journal(**kw: Any) -> Journal:
    return Journal(ReporterSettings(retry_backoff_base_s=0.001, retry_backoff_max_s=0.002, **kw))


def nonzero(table: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in table.items() if v}


class Backend:
    """The replayer's ``send``: live delivery's send to a :class:`MemorySender`, after
    failing the first calls of some kinds on demand; keeps (kind, size) of every call."""

    def __init__(
        self, j: Journal, sender: MemorySender, fail: dict[str, list[Exception]] | None = None
    ) -> None:
        self.live = Delivery(j, Ledger(lambda s, p: None), sender, None, StopState()).send
        self.fail = fail or {}
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, kind: str, records: list[Record]) -> None:
        self.calls.append((kind, len(records)))
        if self.fail.get(kind):
            raise self.fail[kind].pop(0)
        await self.live(kind, records)


def spooled(tmp_path: Path, j: Journal, items: list[tuple[int, bytes]]) -> SpoolWriter:
    writer = SpoolWriter(Spool(str(tmp_path / "spool"), 1 << 20, 1 << 16), j)
    writer.write(items)
    return writer


def replay_everything(writer: SpoolWriter, j: Journal, send: Backend) -> None:
    """Run the replayer until the spool holds nothing (the bound is not a timing check)."""
    replayer = Replayer(writer, j, send, stop=StopState(), busy=lambda: False, backoff=lambda n: 0.0)

    async def emptied() -> None:
        while writer.spool:
            await asyncio.sleep(0)

    async def main() -> None:
        task = asyncio.create_task(replayer.run())
        try:
            await asyncio.wait_for(emptied(), 60)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(main())
    writer.spool.close()


def test_a_replay_that_fails_part_way_resumes_with_what_was_not_sent(tmp_path: Path) -> None:
    j = journal()
    segs = [(R.SEGMENT, segment(f"s{i}")) for i in range(10)]
    logs = [(R.LOG, log_record(f"l{i}")) for i in range(5)]
    writer = spooled(tmp_path, j, segs + logs)
    sender = MemorySender()
    backend = Backend(j, sender, fail={"log": [SendError("backend down")]})
    replay_everything(writer, j, backend)
    # The segments went once; only the logs, whose send failed, were sent again.
    assert backend.calls == [("segment", 10), ("log", 5), ("log", 5)]
    assert len(sender.segments) == 10 and len(sender.logs) == 5
    assert nonzero(j.counters.sent) == {"segment": 10, "log": 5}
    assert j.counters.replayed == 15 and nonzero(j.counters.dropped) == {}
