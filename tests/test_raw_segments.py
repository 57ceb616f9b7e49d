"""Segments go from the rings' JSON bytes to the gRPC sender undecoded (``Sender.raw_kinds``).

Delivery hands a sender that lists "segment" in ``raw_kinds`` the raw payloads; the gRPC
sender encodes them with ``encode.segment_payload`` (the native JSON fast path, or decode and
encode). What reaches the collector must be what the decoded path sends, a payload that is
not a valid record must cost itself only (``dropped.invalid``), and a batch given up goes to
the spool as its original bytes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from reporter_proc import encode
from reporter_proc import records as R
from reporter_proc.delivery import Delivery
from reporter_proc.journal import Journal
from reporter_proc.ledger import Batch, Ledger
from reporter_proc.lifecycle import StopState
from reporter_proc.protocol.generated import tracing_pb2
from reporter_proc.senders.grpc_sender import GrpcSender
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from reporter_proc.spool import Spool
from reporter_proc.spooling import SpoolWriter
from tests.collector import Collector
from tests.test_reporter_helpers import segment

FAST = dict(retry_backoff_base_s=0.001, retry_backoff_max_s=0.002, retry_max_attempts=2, send_timeout_s=5.0)


def _batch(ledger: Ledger, payloads: list[bytes]) -> Batch:
    batch = Batch("segment")
    chunk = ledger.open(0, len(payloads))
    for p in payloads:
        ledger.hold(batch, chunk, p)
    ledger.close(chunk)
    return batch


def _off_fast_path() -> bytes:
    """A valid record the native fast path declines (true in an int slot): decoded instead."""
    rec = orjson.loads(segment("slow", spans=2))
    rec[R.SEG_SPANS][1][R.SPAN_TYPE] = True
    return orjson.dumps(rec)


def test_grpc_sender_ships_raw_segments_and_isolates_bad_ones() -> None:
    good = [segment(f"raw-{i}", spans=3) for i in range(5)] + [_off_fast_path()]
    bad = [b"not json", b'{"a": 1}', b'["t", "s", "svc", "i", false, [[1]]]']
    payloads = good[:3] + bad + good[3:]
    with Collector() as c:
        settings = ReporterSettings(protocol="grpc", backends=(c.grpc_address,), service="svc", **FAST)
        journal = Journal(settings)
        commits: list[Any] = []
        ledger = Ledger(lambda slot, pos: commits.append(pos))

        async def go() -> None:
            sender = GrpcSender(settings)
            await sender.start()
            try:
                delivery = Delivery(journal, ledger, sender, None, StopState())
                batch = _batch(ledger, payloads)
                await delivery.deliver(batch)
                ledger.resolve(batch)
            finally:
                await sender.close()

        asyncio.run(go())
        assert c.wait_for(lambda: len(c.segments) >= len(good), 10)
        got = sorted(s.SerializeToString() for s in c.segments)
    expected = sorted(
        tracing_pb2.SegmentObject.FromString(encode.segment_py(orjson.loads(p))).SerializeToString()
        for p in good
    )
    assert got == expected
    assert journal.counters.dropped.get("invalid", 0) == len(bad)
    assert journal.counters.sent["segment"] == len(good)
    assert commits == [len(payloads)]


class _RawStalled(MemorySender):
    """Takes raw segments and never gets them through."""

    raw_kinds = frozenset({"segment"})

    async def send_segments(self, records: list[Any]) -> None:
        assert all(isinstance(r, bytes) for r in records)
        raise ConnectionRefusedError("backend down")


def test_raw_segments_given_up_are_spooled_as_their_bytes(tmp_path: Path) -> None:
    settings = ReporterSettings(**FAST)
    journal = Journal(settings)
    spool = SpoolWriter(Spool(str(tmp_path / "spool"), 1 << 20, 1 << 16), journal)
    ledger = Ledger(lambda slot, pos: None)
    payloads = [segment("s1"), segment("s2")]
    delivery = Delivery(journal, ledger, _RawStalled(), spool, StopState())
    asyncio.run(delivery.deliver(_batch(ledger, payloads)))
    oldest = spool.spool.oldest()
    assert oldest is not None
    items, _end = spool.spool.read(oldest, 10)
    assert items == [(R.SEGMENT, p) for p in payloads]
    spool.spool.close()


def test_senders_that_want_records_still_get_them_decoded() -> None:
    settings = ReporterSettings(**FAST)
    sender = MemorySender()
    assert "segment" not in sender.raw_kinds
    ledger = Ledger(lambda slot, pos: None)
    delivery = Delivery(Journal(settings), ledger, sender, None, StopState())
    asyncio.run(delivery.deliver(_batch(ledger, [segment("d1")])))
    assert [s[R.SEG_TRACE_ID] for s in sender.segments] == ["d1"]
