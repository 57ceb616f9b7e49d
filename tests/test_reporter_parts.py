"""The reporter's parts, each on its own with the in-memory sender (no rings, no threads
unless the part needs them): the record contract, the ledger, delivery, spool replay,
instances, intake's batching.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from ipc import Arena
from reporter_proc import records as R
from reporter_proc.delivery import Delivery, backoff, decode
from reporter_proc.instances import Instances
from reporter_proc.intake import Intake
from reporter_proc.journal import Journal
from reporter_proc.ledger import Batch, Ledger
from reporter_proc.lifecycle import StopState
from reporter_proc.loop import check_capabilities
from reporter_proc.senders.base import Sender
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from reporter_proc.spool import Spool
from reporter_proc.spooling import Replayer, SpoolWriter
from tests.test_reporter_helpers import log_record, meter_record, segment, worker_start

FAST = ReporterSettings(retry_backoff_base_s=0.001, retry_backoff_max_s=0.002, retry_max_attempts=3)


def drops(j: Journal) -> dict[str, int]:
    return {k: v for k, v in j.counters.dropped.items() if v}


def journal(**kw: Any) -> Journal:
    return Journal(ReporterSettings(**{**FAST.__dict__, **kw}))


# -- the contract ------------------------------------------------------------------------------
def test_every_data_kind_names_a_sender_method_and_a_known_capability() -> None:
    for kind in R.DATA_KINDS:
        method = getattr(Sender, kind.send, None)
        assert inspect.iscoroutinefunction(method), kind
        assert kind.capability in R.CAPABILITIES
    assert len({k.rtype for k in R.KINDS}) == len(R.KINDS)
    assert all(0 < k.rtype < 0xFFFF for k in R.KINDS)


def test_builders_produce_layouts_the_reporter_accepts() -> None:
    built = {
        R.SEGMENT: R.segment("t", "s", service="svc", instance="i", spans=[R.span(0, -1, 1, 2, "op")]),
        R.LOG: R.log(1, "svc", "i", "hello"),
        R.METER: R.meter_report(1, "svc", "i", [R.single_meter("m", [], 1.0)]),
        R.PROFILE_SNAPSHOT: R.profile_snapshot("task", "seg", time_ms=1, sequence=0, stack=["f"]),
        R.PROFILE_FINISH: R.profile_finish("svc", "i", "task"),
        R.WORKER_START: R.worker_start(1, 0, service="svc", instance="i", properties={"a": "b"}),
        R.WORKER_STOP: R.worker_stop(1, 0),
    }
    assert set(built) == set(R.BY_TYPE)
    for rtype, rec in built.items():
        assert len(rec) == R.BY_TYPE[rtype].min_len, R.NAMES[rtype]
    assert built[R.LOG][R.LOG_BODY] == "hello" and built[R.LOG][R.LOG_SPAN_ID] == -1
    assert built[R.METER][R.METER_INSTANCE] == "i"
    assert built[R.WORKER_START][R.WS_PROPERTIES] == ["a", "b"]


def test_restamp_replaces_only_the_instance_field() -> None:
    for rtype, payload in ((R.SEGMENT, segment("t")), (R.LOG, log_record("x")), (R.METER, meter_record("m"))):
        again = orjson.loads(R.restamp_instance(rtype, payload, "child-w3"))
        before = orjson.loads(payload)
        index = R.INSTANCE_FIELD[rtype]
        assert again[index] == "child-w3"
        assert again[:index] + again[index + 1 :] == before[:index] + before[index + 1 :]
    assert R.restamp_instance(R.WORKER_STOP, b"[1,2]", "x") == b"[1,2]"


# -- the ledger --------------------------------------------------------------------------------
def test_the_ledger_commits_a_ring_only_past_fully_resolved_reads() -> None:
    commits: list[tuple[int, int]] = []
    ledger = Ledger(lambda slot, pos: commits.append((slot, pos)))
    a, b = Batch("segment"), Batch("log")
    first = ledger.open(0, 100)
    ledger.hold(a, first, b"x" * 10)
    ledger.close(first)
    second = ledger.open(0, 200)
    ledger.hold(b, second, b"y" * 5)
    ledger.close(second)
    assert ledger.pending_bytes == 15 and commits == []
    ledger.resolve(b)  # the later read is done, the earlier one is not: nothing moves
    assert commits == [] and ledger.pending_bytes == 10
    ledger.resolve(a)
    assert commits == [(0, 200)] and ledger.pending_bytes == 0
    empty = ledger.open(1, 50)
    ledger.close(empty)  # a read that held nothing (all dropped) commits at once
    assert commits[-1] == (1, 50)


# -- delivery ----------------------------------------------------------------------------------
def _batch(ledger: Ledger, kind: str, payloads: list[bytes]) -> Batch:
    batch = Batch(kind)
    chunk = ledger.open(0, len(payloads))
    for p in payloads:
        ledger.hold(batch, chunk, p)
    ledger.close(chunk)
    return batch


def _delivery(j: Journal, sender: Sender, spool: SpoolWriter | None = None) -> tuple[Delivery, list[Any]]:
    commits: list[Any] = []
    ledger = Ledger(lambda slot, pos: commits.append(pos))
    return Delivery(j, ledger, sender, spool, StopState()), commits


def test_delivery_retries_then_sends_and_the_ring_moves_on() -> None:
    j = journal()
    sender = MemorySender(fail_next=2)
    d, commits = _delivery(j, sender)
    batch = _batch(d.ledger, "segment", [segment("a"), segment("b")])

    async def go() -> None:
        await d.deliver(batch)
        d.ledger.resolve(batch)

    asyncio.run(go())
    assert [s[R.SEG_TRACE_ID] for s in sender.segments] == ["a", "b"]
    assert j.counters.retried == 2 and j.counters.sent["segment"] == 2
    assert commits == [2]


def test_delivery_gives_up_into_the_spool_with_the_raw_bytes(tmp_path: Path) -> None:
    j = journal()
    spool = SpoolWriter(Spool(str(tmp_path / "spool"), 1 << 20, 1 << 16), j)
    d, _ = _delivery(j, MemorySender(fail_next=99), spool)
    payloads = [log_record("one"), log_record("two")]
    batch = _batch(d.ledger, "log", payloads)
    asyncio.run(d.deliver(batch))
    assert j.counters.spooled == 2 and j.counters.failed == 1
    f = spool.spool.oldest()
    assert f is not None
    items, _end = spool.spool.read(f, 10)
    assert items == [(R.LOG, p) for p in payloads]
    spool.spool.close()


def test_delivery_without_a_spool_keeps_retrying_while_memory_has_room() -> None:
    # Issue 16: retry_max_attempts alone must not drop data the reporter can still hold.
    j = journal()
    sender = MemorySender(fail_next=20)  # far more failures than retry_max_attempts=3
    d, _ = _delivery(j, sender)
    asyncio.run(d.deliver(_batch(d.ledger, "meter", [meter_record("m")])))
    assert drops(j) == {}
    assert len(sender.meters) == 1 and sender.failures == 20


def test_the_retry_backoff_stays_capped_at_any_attempt_count() -> None:
    """The keeper, the replayer and delivery without a spool count their attempts without
    bound during an outage: ``2.0 ** 1024`` raised OverflowError at attempt 1025 (about 17
    minutes of a backend refusing connections) and killed the reporter."""
    j = journal(retry_backoff_base_s=0.5, retry_backoff_max_s=1.0)
    for attempt in (2, 1024, 1025, 1026, 100_000, 10**30):
        assert 0.5 <= backoff(j, attempt) <= 1.0, attempt


def test_delivery_without_a_spool_outlasts_more_than_a_thousand_failed_attempts() -> None:
    j = journal(retry_backoff_base_s=0.0, retry_backoff_max_s=0.0)  # no wait between attempts
    sender = MemorySender(fail_next=1100)
    d, _ = _delivery(j, sender)
    asyncio.run(d.deliver(_batch(d.ledger, "meter", [meter_record("m")])))
    assert len(sender.meters) == 1 and sender.failures == 1100
    assert drops(j) == {} and j.counters.retried == 1100


def test_delivery_without_a_spool_counts_the_drop_when_memory_is_full() -> None:
    j = journal(max_pending_bytes=10)  # the one pending record already fills memory
    d, _ = _delivery(j, MemorySender(fail_next=99))
    asyncio.run(d.deliver(_batch(d.ledger, "meter", [meter_record("m")])))
    assert drops(j) == {"backend": 1}


def test_a_batch_too_large_for_the_backend_is_split_and_a_lone_giant_dropped() -> None:
    j = journal()
    small = [segment(f"s{i}") for i in range(40)]
    giant = segment("giant", spans=200)
    limit = max(len(p) for p in small) * 8  # about 8 small records per call
    assert len(giant) > limit
    sender = MemorySender(max_call_bytes=limit)
    d, _ = _delivery(j, sender)
    asyncio.run(d.deliver(_batch(d.ledger, "segment", [*small[:20], giant, *small[20:]])))
    assert sorted(r[R.SEG_TRACE_ID] for r in sender.segments) == sorted(f"s{i}" for i in range(40))
    assert drops(j) == {"too_large": 1}
    assert "TooLargeError" in sender.refused


def test_a_poison_record_costs_only_itself() -> None:
    j = journal()
    payloads = [segment(f"ok{i}") for i in range(99)]
    payloads.insert(37, segment("POISON"))
    sender = MemorySender(poison=b"POISON")
    d, _ = _delivery(j, sender)
    asyncio.run(d.deliver(_batch(d.ledger, "segment", payloads)))
    assert sorted(r[R.SEG_TRACE_ID] for r in sender.segments) == sorted(f"ok{i}" for i in range(99))
    assert drops(j) == {"rejected": 1}
    assert set(sender.refused) == {"InvalidDataError"}
    assert len(sender.refused) <= 2 * 7 + 1  # halving: about 2 log2(n) refused calls, not n


def test_spilled_batches_leave_memory_and_are_not_sent_twice(tmp_path: Path) -> None:
    j = journal(spool_dir=str(tmp_path / "spool"))
    spool = SpoolWriter.open(j)
    assert spool is not None
    sender = MemorySender()
    d, _ = _delivery(j, sender, spool)
    batches = [_batch(d.ledger, "log", [log_record(f"b{i}-{k}") for k in range(3)]) for i in range(4)]
    for b in batches:
        d.put(b)
    d.spill()
    assert d.ledger.pending_bytes == 0
    assert list(d.queues["log"]) == [batches[0]]  # the head stays: its send may be under way
    asyncio.run(d.deliver(batches[0]))
    assert sender.logs == []  # spilled before its first send: only the spool sends it
    assert spool.spool.total_records == 12
    spool.spool.close()


class _ChokesOn(MemorySender):
    """Its 'encoder' fails on one trace id, as a real encoder fails on a bad field."""

    async def send_segments(self, records: list[Any]) -> None:
        if any(r[R.SEG_TRACE_ID] == "bad" for r in records):
            raise ValueError("cannot encode")
        await super().send_segments(records)


def test_delivery_isolates_the_record_the_encoder_chokes_on() -> None:
    j = journal()
    sender = _ChokesOn()
    d, _ = _delivery(j, sender)
    asyncio.run(d.deliver(_batch(d.ledger, "segment", [segment("ok1"), segment("bad"), segment("ok2")])))
    assert sorted(s[R.SEG_TRACE_ID] for s in sender.segments) == ["ok1", "ok2"]
    assert drops(j) == {"invalid": 1}


def test_decode_counts_records_without_the_contract_layout() -> None:
    j = journal()
    out = decode(j, R.BY_TYPE[R.LOG], [log_record("x"), b"not json", b"[1, 2]", b"{}"])
    assert len(out) == 1 and drops(j) == {"invalid": 3}


def test_unsupported_kinds_are_shut_at_start() -> None:
    j = journal(log_enabled=False)
    check_capabilities(j, MemorySender(supports=frozenset({"segment", "management"})))
    assert j.shut == {
        "log": "disabled",
        "meter": "unsupported",
        "profile_snapshot": "unsupported",
        "profile_finish": "unsupported",
    }


# -- spool replay ------------------------------------------------------------------------------
def test_replay_sends_spooled_records_and_counts_unreadable_ones(tmp_path: Path) -> None:
    j = journal()
    spool = SpoolWriter(Spool(str(tmp_path / "spool"), 1 << 20, 1 << 16), j)
    spool.write([(R.SEGMENT, segment("s1")), (R.LOG, log_record("l1")), (R.LOG, b"garbage"), (999, b"[]")])
    sender = MemorySender()
    replayer = Replayer(
        spool,
        j,
        Delivery(j, Ledger(lambda s, p: None), sender, spool, StopState()).send,
        stop=StopState(),
        busy=lambda: False,
        backoff=lambda n: 0.0,
    )
    assert replayer.next_read()
    assert asyncio.run(replayer.replay()) is None
    assert [s[R.SEG_TRACE_ID] for s in sender.segments] == ["s1"]
    assert [rec[R.LOG_BODY] for rec in sender.logs] == ["l1"]
    assert j.counters.replayed == 2 and drops(j) == {"invalid": 2}
    spool.spool.close()


def test_the_replayer_outlasts_more_than_a_thousand_failed_attempts(tmp_path: Path) -> None:
    j = journal(retry_backoff_base_s=0.0, retry_backoff_max_s=0.0)  # no wait between attempts
    spool = SpoolWriter(Spool(str(tmp_path / "spool"), 1 << 20, 1 << 16), j)
    spool.write([(R.SEGMENT, segment("s1"))])
    sender = MemorySender(fail_next=1100)
    stop = StopState()
    replayer = Replayer(
        spool,
        j,
        Delivery(j, Ledger(lambda s, p: None), sender, spool, StopState()).send,
        stop=stop,
        busy=lambda: False,
        backoff=lambda n: backoff(j, n),
    )

    async def outage() -> None:
        task = asyncio.ensure_future(replayer.run())
        while not sender.segments:
            if task.done():
                task.result()  # raises what ended it
            await asyncio.sleep(0)
        # Closing, not cancel(): the send may be finishing, and Python 3.11's wait_for
        # returns its result rather than the cancellation then.
        stop.closing = True
        await task

    asyncio.run(outage())
    assert sender.failures == 1100 and j.counters.replayed == 1
    spool.spool.close()


# -- intake ------------------------------------------------------------------------------------
def test_intake_batches_raw_bytes_per_kind_and_hands_worker_records_over(tmp_path: Path) -> None:
    arena = Arena.create(str(tmp_path / "a.arena"), slots=2, ring_capacity=64 * 1024)
    try:
        j = journal(batch_max_records=2)
        readers = [arena.reader(s) for s in range(arena.slots)]
        ledger = Ledger(lambda slot, pos: readers[slot].commit(pos))
        d = Delivery(j, ledger, MemorySender(), None, StopState())
        workers: list[tuple[int, list[Any]]] = []
        intake = Intake(
            arena,
            readers,
            ledger,
            journal=j,
            delivery=d,
            stop=StopState(),
            on_worker_record=lambda t, rec: workers.append((t, rec)),
            spill=None,
            drained_for_stop=lambda now: True,
        )
        w = arena.claim_slot()
        assert w is not None
        segs = [segment("a"), segment("b"), segment("c")]
        for p in segs:
            assert w.write(R.SEGMENT, p)
        log = log_record("x")
        assert w.write(R.LOG, log)
        assert w.write(R.WORKER_START, worker_start(1, w.slot))
        assert w.write(77, b"[]")
        assert intake.drain_pass() == 6
        full = d.queues["segment"]
        assert len(full) == 1 and full[0].payloads == segs[:2]  # sealed at batch_max_records
        assert intake.open["segment"].payloads == segs[2:]
        assert intake.open["log"].payloads == [log]
        assert [t for t, _ in workers] == [R.WORKER_START]
        assert drops(j) == {"invalid": 1}
        assert ledger.pending_bytes == sum(map(len, segs)) + len(log)
        intake.seal_all()
        assert len(d.queues["segment"]) == 2 and len(d.queues["log"]) == 1
        arena.release_slot()
    finally:
        arena.close()


def test_a_batch_given_up_reaches_the_spool_as_its_ring_bytes(tmp_path: Path) -> None:
    # No re-serialization on the way to disk, even after the batch was decoded for its sends.
    j = journal(spool_dir=str(tmp_path / "spool"), retry_max_attempts=2)
    spool = SpoolWriter.open(j)
    assert spool is not None
    d, _ = _delivery(j, MemorySender(fail_next=5), spool)
    payloads = [segment(f"raw{i}") + b"  " for i in range(5)]  # trailing blanks: orjson would drop them
    batch = _batch(d.ledger, "segment", payloads)
    asyncio.run(d.deliver(batch))
    assert batch.decoded == [] and j.counters.spooled == 5
    f = spool.spool.oldest()
    assert f is not None
    items, _ = spool.spool.read(f, 10)
    assert [p for _, p in items] == payloads
    spool.spool.close()


def test_the_keeper_asks_only_for_the_slots_of_its_instances(tmp_path: Path) -> None:
    """Once a second the keeper checks that its workers still hold their slots: only those
    slots, not all of the arena's (a check is about three system calls in a forked reporter:
    with 64 slots that was ~200 a second in an idle reporter)."""
    arena = Arena.create(str(tmp_path / "k.arena"), slots=64, ring_capacity=4096)
    asked: list[int] = []
    real = arena.live_slots

    def counting_live_slots(slots: Iterable[int] | None = None) -> dict[int, int]:
        assert slots is not None, "asked for every slot of the arena"
        slots = list(slots)
        asked.extend(slots)
        return real(slots)

    arena.live_slots = counting_live_slots  # type: ignore[method-assign]
    sender = MemorySender()
    table = Instances(arena, journal(), sender, StopState(), own_process_slots=False, backoff=lambda n: 1.0)
    for slot in (3, 7):  # started, then gone before the first check (no process holds them)
        table.on_record(R.WORKER_START, orjson.loads(worker_start(pid=4_000_000 + slot, slot=slot)))

    async def one_round() -> None:
        task = asyncio.ensure_future(table.run())
        for _ in range(200):  # the first round announces both once, then forgets them
            if len(sender.properties) == 2 and not table.table:
                break
            await asyncio.sleep(0.01)
        task.cancel()

    try:
        asyncio.run(one_round())
        assert [p[1] for p in sender.properties] == ["inst-3", "inst-7"]
        assert not table.table
        assert sorted(set(asked)) == [3, 7]
    finally:
        arena.close()


def test_worker_records_with_a_slot_or_pid_out_of_range_are_refused_and_counted(tmp_path: Path) -> None:
    """A WORKER_START naming a slot past 64 bits reached the keeper's lock query, whose
    ``struct`` packing raised and killed the reporter (a restarted one read it again)."""
    arena = Arena.create(str(tmp_path / "b.arena"), slots=4, ring_capacity=4096)
    j = journal()
    table = Instances(arena, j, MemorySender(), StopState(), own_process_slots=False, backoff=lambda n: 1.0)
    bad = [(4_000_005, 2**64 - 1), (4_000_005, 4096), (4_000_005, -2), (2**63, 1), (0, 1)]
    for pid, slot in bad:
        table.on_record(R.WORKER_START, orjson.loads(worker_start(pid=pid, slot=slot)))
    huge = orjson.loads(worker_start(pid=4_000_005, slot=1))
    huge[R.WS_SLOT] = 1e30  # a float: int() of it is far past 64 bits
    table.on_record(R.WORKER_START, huge)
    table.on_record(R.WORKER_STOP, R.worker_stop(4_000_005, 2**64 - 1))
    try:
        assert table.table_live() == {}  # what each keeper round asks first
        assert table.table == {}
        assert drops(j) == {"invalid": len(bad) + 2}
        table.on_record(R.WORKER_START, orjson.loads(worker_start(pid=4_000_005, slot=3)))
        assert list(table.table) == [3]  # the last slot is one
    finally:
        arena.close()


def test_a_thread_mode_reporter_takes_its_workers_name_slot(tmp_path: Path) -> None:
    """In thread mode each worker's reporter thread drains a one-slot arena of its own; the
    worker's records carry its slot in the application's name registry (or -1)."""
    arena = Arena.create(str(tmp_path / "t.arena"), slots=1, ring_capacity=4096)
    j = journal()
    table = Instances(arena, j, MemorySender(), StopState(), own_process_slots=True, backoff=lambda n: 1.0)
    try:
        for slot in (5, -1):
            table.on_record(R.WORKER_START, orjson.loads(worker_start(pid=os.getpid(), slot=slot)))
        assert sorted(table.table) == [-1, 5] and drops(j) == {}
    finally:
        arena.close()


def test_the_keeper_outlasts_more_than_a_thousand_failed_keep_alives(tmp_path: Path) -> None:
    arena = Arena.create(str(tmp_path / "o.arena"), slots=4, ring_capacity=4096)
    j = journal()
    sender = MemorySender(fail_next=1100)
    table = Instances(arena, j, sender, StopState(), own_process_slots=False, backoff=lambda n: backoff(j, n))
    table.on_record(R.WORKER_START, orjson.loads(worker_start(pid=4_000_004, slot=1)))
    inst = table.table[1]

    async def outage() -> None:
        for _ in range(1101):  # what the keeper does each time the instance is due
            await table.keep_alive(inst)

    try:
        asyncio.run(outage())
        assert sender.failures == 1100 and len(sender.keepalives) == 1 and inst.failures == 0
    finally:
        arena.close()


def test_a_worker_replaced_in_its_slot_before_the_keeper_announced_it_is_announced_too(
    tmp_path: Path,
) -> None:
    """A Celery child recycled after a few tasks can live less than a keeper tick; its
    successor takes the same slot. Both processes are announced (each with its own
    "Process No."), the one that left once."""
    arena = Arena.create(str(tmp_path / "r.arena"), slots=4, ring_capacity=4096)
    sender = MemorySender()
    table = Instances(arena, journal(), sender, StopState(), own_process_slots=False, backoff=lambda n: 1.0)
    table.on_record(R.WORKER_START, orjson.loads(worker_start(pid=4_000_001, slot=2)))
    table.on_record(R.WORKER_STOP, R.worker_stop(4_000_001, 2))
    table.on_record(R.WORKER_START, orjson.loads(worker_start(pid=4_000_002, slot=2)))

    def pids() -> list[str]:
        return [dict(p[2])["Process No."] for p in sender.properties]

    async def one_round() -> None:
        task = asyncio.ensure_future(table.run())
        for _ in range(200):
            if len(sender.properties) == 2:
                break
            await asyncio.sleep(0.01)
        task.cancel()

    try:
        asyncio.run(one_round())
        assert sorted(pids()) == ["4000001", "4000002"]
        assert not table.departed
    finally:
        arena.close()


def test_an_announcement_cut_by_the_stop_is_made_by_the_shutdown_announcement(tmp_path: Path) -> None:
    """A one-shot program's worker left before the keeper's round; the keeper was announcing
    it when the stop cancelled the keeper. The shutdown's announcement still makes it (the
    keeper had taken it out of its table first, and it was lost)."""
    arena = Arena.create(str(tmp_path / "c.arena"), slots=4, ring_capacity=4096)
    sender = MemorySender()
    stop = StopState()
    table = Instances(arena, journal(), sender, stop, own_process_slots=False, backoff=lambda n: 0.01)
    table.on_record(R.WORKER_START, orjson.loads(worker_start(pid=4_000_003, slot=1)))
    table.on_record(R.WORKER_STOP, R.worker_stop(4_000_003, 1))
    sender.block(frozenset({"management"}))

    async def scenario() -> None:
        keeper = asyncio.ensure_future(table.run())
        for _ in range(200):  # the keeper's round: the worker is gone, its announcement waits
            if sender.calls:
                break
            await asyncio.sleep(0.01)
        assert sender.calls == 1 and not table.table
        stop.begin("test", 5.0)
        keeper.cancel()  # what _flush_and_close does to the keeper
        await asyncio.gather(keeper, return_exceptions=True)
        sender.unblock()
        await table.announce_unannounced()

    try:
        asyncio.run(scenario())
        assert [dict(p[2])["Process No."] for p in sender.properties] == ["4000003"]
        assert len(sender.keepalives) == 1
    finally:
        arena.close()
