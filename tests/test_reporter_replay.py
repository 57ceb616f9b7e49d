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
from reporter_proc.ledger import Batch, Ledger
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
    stop = StopState()
    replayer = Replayer(writer, j, send, stop=stop, busy=lambda: False, backoff=lambda n: 0.0)

    async def emptied() -> None:
        while writer.spool:
            await asyncio.sleep(0)

    async def main() -> None:
        task = asyncio.create_task(replayer.run())
        try:
            await asyncio.wait_for(emptied(), 60)
        finally:
            task.cancel()  # lands even as a send completes (reporter_proc.timeouts)
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


class Encoder(Backend):
    """A sender whose encoder chokes (ValueError) on a call holding ``marker``, and fails
    (IndexError) on a record shorter than its layout, as the real encoders do."""

    def __init__(self, j: Journal, sender: MemorySender, marker: str) -> None:
        super().__init__(j, sender)
        self.marker = marker
        self.short_seen = 0

    async def __call__(self, kind: str, records: list[Record]) -> None:
        self.calls.append((kind, len(records)))
        if any(len(r) < R.BY_NAME[kind].min_len for r in records):
            self.short_seen += 1
            raise IndexError("list index out of range")
        if any(self.marker in str(r) for r in records):
            raise ValueError("cannot encode")
        await self.live(kind, records)


def test_replay_isolates_the_record_the_backend_refuses_as_live_delivery_does(tmp_path: Path) -> None:
    payloads = [segment(f"s{i}") for i in range(99)]
    payloads.insert(40, segment("POISON"))

    live_j = journal()
    live_sender = MemorySender(poison=b"POISON")
    live = Delivery(live_j, Ledger(lambda s, p: None), live_sender, None, StopState())
    batch = Batch("segment")
    batch.payloads = list(payloads)
    asyncio.run(live.deliver(batch))

    j = journal()
    sender = MemorySender(poison=b"POISON")
    replay_everything(spooled(tmp_path, j, [(R.SEGMENT, p) for p in payloads]), j, Backend(j, sender))
    assert nonzero(j.counters.sent) == nonzero(live_j.counters.sent) == {"segment": 99}
    assert nonzero(j.counters.dropped) == nonzero(live_j.counters.dropped) == {"rejected": 1}
    assert j.counters.replayed == 99 and len(sender.segments) == 99


def test_replay_halves_a_group_too_large_and_counts_a_record_too_large_alone(tmp_path: Path) -> None:
    j = journal()
    payloads = [segment(f"s{i}") for i in range(20)]
    limit = 6 * max(len(p) for p in payloads)  # a few records per call, never all 20
    huge = segment("huge", spans=40)
    assert len(huge) > limit
    payloads.insert(7, huge)
    sender = MemorySender(max_call_bytes=limit)
    replay_everything(spooled(tmp_path, j, [(R.SEGMENT, p) for p in payloads]), j, Backend(j, sender))
    assert nonzero(j.counters.sent) == {"segment": 20} and j.counters.replayed == 20
    assert nonzero(j.counters.dropped) == {"too_large": 1}
    assert sorted(s[R.SEG_TRACE_ID] for s in sender.segments) == sorted(f"s{i}" for i in range(20))


def test_replay_refuses_a_short_or_unencodable_record_alone(tmp_path: Path) -> None:
    j = journal()
    items = [(R.SEGMENT, segment(f"s{i}")) for i in range(3)]
    items += [(R.LOG, log_record(f"l{i}")) for i in range(4)]
    items.insert(4, (R.LOG, log_record("BAD")))  # the encoder chokes on it
    items.insert(2, (R.LOG, b'[1, "svc", "inst"]'))  # JSON, but shorter than a log
    sender = MemorySender()
    backend = Encoder(j, sender, marker="BAD")
    replay_everything(spooled(tmp_path, j, items), j, backend)
    assert backend.short_seen == 0  # refused when read, as live delivery's decode does
    assert [s[R.SEG_TRACE_ID] for s in sender.segments] == ["s0", "s1", "s2"]
    assert [rec[R.LOG_BODY] for rec in sender.logs] == ["l0", "l1", "l2", "l3"]
    assert nonzero(j.counters.sent) == {"segment": 3, "log": 4} and j.counters.replayed == 7
    assert nonzero(j.counters.dropped) == {"invalid": 2}


class SpoolingBackend(Backend):
    """Live delivery gives records up to the spool while the first replayed call is on its way."""

    def __init__(
        self, j: Journal, sender: MemorySender, writer: SpoolWriter, more: list[tuple[int, bytes]]
    ) -> None:
        super().__init__(j, sender)
        self.writer = writer
        self.more = more

    async def __call__(self, kind: str, records: list[Record]) -> None:
        if self.more:
            self.writer.write(self.more)
            self.more = []
        await super().__call__(kind, records)


def test_records_spooled_over_the_cap_during_a_replay_are_counted_once(tmp_path: Path) -> None:
    j = journal(batch_max_records=10)
    writer = SpoolWriter(Spool(str(tmp_path / "spool"), 40_000, 4096), j)
    writer.write([(R.SEGMENT, segment(f"a{i}")) for i in range(30)])
    more = [(R.SEGMENT, segment(f"b{i}")) for i in range(300)]
    sender = MemorySender()
    replay_everything(writer, j, SpoolingBackend(j, sender, writer, more))
    assert writer.dropped > 0  # the cap did drop records
    sent = [s[R.SEG_TRACE_ID] for s in sender.segments]
    assert len(sent) == len(set(sent)) == j.counters.sent["segment"] == j.counters.replayed
    assert j.counters.spooled == 330 and j.counters.replayed + writer.dropped == 330


def test_a_replay_that_sends_nothing_does_not_show_the_backend_as_ok(tmp_path: Path) -> None:
    j = journal()
    j.counters.failure("SendError: backend down")  # live delivery is failing
    writer = spooled(tmp_path, j, [(R.LOG, b"not json"), (R.SEGMENT, b"[1]"), (999, b"[]")])
    sender = MemorySender()
    replay_everything(writer, j, Backend(j, sender))
    assert nonzero(j.counters.dropped) == {"invalid": 3} and j.counters.replayed == 0
    assert j.counters.backend_state == "failing" and j.counters.consecutive_failures == 1


class GatedSender(MemorySender):
    """A backend whose segment call returns when the test opens its gate."""

    def __init__(self, entered: asyncio.Future[None], gate: asyncio.Future[None]) -> None:
        super().__init__()
        self.entered = entered
        self.gate = gate

    async def send_segments(self, records: list[Record]) -> None:
        self.entered.set_result(None)
        await self.gate


def test_a_stop_cancel_arriving_as_the_send_completes_ends_the_replayer(tmp_path: Path) -> None:
    """The stop cancels the replayer in the loop iteration where its send completes. Python
    3.11's wait_for (which wrapped the send) then returned the send's result and dropped the
    cancel: the replayer went on to its next round. Now the task ends cancelled at once.
    Deterministic: the gate opens and the cancel is sent in one callback, and a handful of
    loop iterations (no clock) is all the cancel may take."""
    j = journal()
    writer = spooled(tmp_path, j, [(R.SEGMENT, segment("c-0"))])

    async def main() -> asyncio.Task[None]:
        loop = asyncio.get_running_loop()
        entered: asyncio.Future[None] = loop.create_future()
        gate: asyncio.Future[None] = loop.create_future()
        send = Backend(j, GatedSender(entered, gate))
        replayer = Replayer(writer, j, send, stop=StopState(), busy=lambda: False, backoff=lambda n: 0.0)
        task = asyncio.create_task(replayer.run())
        await entered
        gate.set_result(None)  # the send completes...
        task.cancel()  # ...and the stop's cancel arrives in the same iteration
        for _ in range(20):
            if task.done():
                break
            await asyncio.sleep(0)
        if not task.done():  # the cancel was lost: end the task for the assertion below
            replayer.stop.closing = True
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise AssertionError("the replayer did not end on the stop's cancel")
        return task

    task = asyncio.run(main())
    writer.spool.close()
    assert task.cancelled()
