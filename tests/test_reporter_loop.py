"""The drain/batch/send loop, in-process (thread mode) with the MemorySender.

Writers are real forked processes writing into a real arena; the reporter runs on a
background thread with its own event loop, exactly as ``SW_AGENT_REPORTER_PROCESS=false``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from ipc import Arena
from reporter_proc import records as R
from reporter_proc.loop import Reporter
from reporter_proc.process import ReporterThread
from reporter_proc.senders.base import KINDS, Record
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from tests.test_reporter_helpers import (
    log_record,
    meter_record,
    segment,
    spawn_writer,
    status_doc,
    wait_for,
    write_all,
)

FAST = dict(
    flush_interval_s=0.02,
    poll_interval_s=0.02,
    retry_backoff_base_s=0.01,
    retry_backoff_max_s=0.05,
    shutdown_deadline_s=3.0,
    status_interval_s=0.05,
    keepalive_interval_s=0.2,
    send_timeout_s=2.0,
)


def settings(**kw: Any) -> ReporterSettings:
    return ReporterSettings(**{**FAST, **kw})


@pytest.fixture
def arena(tmp_path: Any) -> Iterator[Arena]:
    a = Arena.create(str(tmp_path / "t.arena"), slots=4, ring_capacity=64 * 1024)
    yield a
    a.close()


class Running:
    def __init__(self, arena: Arena, sender: MemorySender, s: ReporterSettings) -> None:
        self.sender = sender
        self.handle = ReporterThread(arena.path, s, arena=arena, sender=sender)
        self.handle.start()
        wait_for(lambda: self.reporter.ready, 5, "reporter ready")

    @property
    def reporter(self) -> Reporter:
        assert self.handle.reporter is not None
        return self.handle.reporter

    def stop(self) -> None:
        assert self.handle.stop(10)


@pytest.fixture
def run(arena: Arena) -> Iterator[Any]:
    started: list[Running] = []

    def start(sender: MemorySender | None = None, **kw: Any) -> Running:
        r = Running(arena, sender or MemorySender(), settings(**kw))
        started.append(r)
        return r

    yield start
    for r in started:
        r.handle.stop(10)


def segments_for(tag: str, n: int) -> list[tuple[int, bytes]]:
    return [(R.SEGMENT, segment(f"{tag}-{i}")) for i in range(n)]


def test_records_from_several_writers_are_delivered_exactly_once(arena: Arena, run: Any) -> None:
    r = run(batch_max_records=50)
    writers = []
    for w in range(3):
        recs = segments_for(f"w{w}", 400)
        recs += [(R.LOG, log_record(f"log-{w}-{i}")) for i in range(50)]
        recs += [(R.METER, meter_record(f"m-{w}-{i}")) for i in range(20)]
        writers.append(spawn_writer(arena.path, recs))
    for w in writers:
        w.wait_written()
        assert w.release() == 0
    sender = r.sender
    wait_for(lambda: len(sender.segments) >= 1200 and len(sender.logs) >= 150 and len(sender.meters) >= 60)
    r.stop()
    ids = [s[0] for s in sender.segments]
    assert sorted(ids) == sorted(f"w{w}-{i}" for w in range(3) for i in range(400))
    assert sorted(lg[5] for lg in sender.logs) == sorted(f"log-{w}-{i}" for w in range(3) for i in range(50))
    assert len(sender.meters) == 60
    c = r.reporter.counters
    assert c.sent == {"segment": 1200, "log": 150, "meter": 60}
    assert c.read["segment"] == 1200
    assert c.retried == 0 and c.failed == 0
    # Everything was committed: the rings are empty for the writer.
    assert all(arena.reader(s).backlog() == 0 for s in range(arena.slots))


def test_failed_sends_are_retried_and_delivered(arena: Arena, run: Any) -> None:
    sender = MemorySender(fail_next=4)
    r = run(sender, batch_max_records=100, retry_max_attempts=10)
    write_all(arena.path, segments_for("a", 300))
    wait_for(lambda: len(sender.segments) >= 300)
    r.stop()
    assert sorted(s[0] for s in sender.segments) == sorted(f"a-{i}" for i in range(300))
    c = r.reporter.counters
    assert c.retried == 4
    assert c.failed == 0
    assert c.backend_state == "ok" and c.consecutive_failures == 0
    assert "told to fail" in c.last_error


def test_without_a_spool_a_batch_is_dropped_and_counted_once_memory_is_full(arena: Arena, run: Any) -> None:
    # Memory for one record only: after its retry budget each batch (of one record) is given
    # up, since no memory is left to keep it in.
    sender = MemorySender(fail_next=1000)
    r = run(sender, batch_max_records=10, retry_max_attempts=2, max_pending_bytes=1)
    write_all(arena.path, segments_for("x", 25))
    wait_for(lambda: r.reporter.counters.dropped["backend"] == 25)
    c = r.reporter.counters
    assert c.failed == 25
    assert c.retried == 25
    assert c.backend_state == "failing"
    wait_for(lambda: all(arena.reader(s).backlog() == 0 for s in range(arena.slots)), 5, "commit")
    doc = wait_for(lambda: (d := status_doc(arena))["dropped"]["backend"] == 25 and d, 5, "status")
    assert doc["backend"]["state"] == "failing" and doc["failed"] == 25
    r.stop()


def test_commit_waits_for_delivery(arena: Arena, run: Any) -> None:
    sender = MemorySender()
    sender.block()
    r = run(sender, batch_max_records=20)
    slot = write_all(arena.path, segments_for("b", 50))
    wait_for(lambda: r.reporter.counters.read.get("segment") == 50)
    # Read, but nothing is sent: the ring still holds every record for a successor.
    assert arena.reader(slot).backlog() > 0
    assert r.reporter.pending_bytes > 0
    sender.unblock()
    wait_for(lambda: len(sender.segments) == 50)
    wait_for(lambda: arena.reader(slot).backlog() == 0, 5, "commit")
    r.stop()


def test_a_new_reporter_rereads_what_a_dead_one_did_not_send(arena: Arena, run: Any) -> None:
    first = MemorySender()
    first.block()
    r1 = run(first, batch_max_records=20)
    write_all(arena.path, segments_for("c", 40))
    wait_for(lambda: r1.reporter.counters.read.get("segment") == 40)
    # Crash stand-in: the first reporter gives up its role without sending or committing.
    r1.handle.reporter.stop_threadsafe("test")  # type: ignore[union-attr]
    r1.handle.stop(0.2)
    # (it is still blocked in send; a successor must still see every record)
    first_sent = len(first.segments)
    assert first_sent == 0
    second = MemorySender()
    fresh = Arena.open(arena.path)
    try:
        wait_for(lambda: not r1.handle.alive or r1.reporter.counters.dropped.get("shutdown"), 10)
        first.unblock()  # lets the first thread finish; its batch was left uncommitted
        wait_for(lambda: not r1.handle.alive, 10, "first reporter to end")
        h2 = ReporterThread(arena.path, settings(batch_max_records=20), arena=fresh, sender=second)
        h2.start()
        wait_for(lambda: len(second.segments) >= 40)
        assert h2.stop(10)
    finally:
        fresh.close()
    assert sorted(s[0] for s in second.segments)[:40] == sorted(f"c-{i}" for i in range(40))


def test_memory_bound_stops_reading_until_sends_complete(arena: Arena, run: Any) -> None:
    sender = MemorySender()
    sender.block()
    r = run(sender, batch_max_records=10, max_pending_bytes=4000)
    w = spawn_writer(arena.path, segments_for("m", 200))
    wait_for(lambda: r.reporter.counters.read.get("segment", 0) > 0)
    # The reporter stopped reading at the bound: the rest waits in the ring (or in the writer).
    seg_size = len(segment("m-0"))
    wait_for(lambda: r.reporter.pending_bytes >= 4000 - seg_size)
    read_so_far = r.reporter.counters.read["segment"]
    assert r.reporter.pending_bytes <= 4000 + seg_size
    assert read_so_far < 200
    sender.unblock()
    w.wait_written()
    assert w.release() == 0
    wait_for(lambda: len(sender.segments) == 200)
    r.stop()
    assert sorted(s[0] for s in sender.segments) == sorted(f"m-{i}" for i in range(200))


def test_garbage_records_are_counted_not_fatal(arena: Arena, run: Any) -> None:
    r = run()
    recs = [
        (R.SEGMENT, b"{not json"),
        (R.SEGMENT, orjson.dumps({"a": 1})),  # not a positional record
        (R.LOG, orjson.dumps([1, 2])),  # too short
        (99, orjson.dumps([1])),  # unknown type
        (R.WORKER_START, orjson.dumps(["x", "y", 1, 2, 3, 4, 5])),  # bad field types
        *segments_for("ok", 5),
    ]
    write_all(arena.path, recs)
    sender = r.sender
    wait_for(lambda: len(sender.segments) == 5)
    wait_for(lambda: r.reporter.counters.dropped["invalid"] == 5)
    assert r.handle.alive
    write_all(arena.path, segments_for("later", 3))
    wait_for(lambda: len(sender.segments) == 8)
    r.stop()


class PickySender(MemorySender):
    """Raises an unexpected error (an encoder bug stand-in) on records marked 'bad'."""

    async def send_segments(self, records: list[Record]) -> None:
        if any(rec[0].startswith("bad") for rec in records):
            raise TypeError("cannot encode")
        await super().send_segments(records)


def test_a_record_the_encoder_rejects_costs_only_itself(arena: Arena, run: Any) -> None:
    sender = PickySender()
    r = run(sender, batch_max_records=50)
    recs = segments_for("good", 20)
    recs.insert(7, (R.SEGMENT, segment("bad-1")))
    write_all(arena.path, recs)
    wait_for(lambda: len(sender.segments) == 20)
    wait_for(lambda: r.reporter.counters.dropped["invalid"] == 1)
    r.stop()
    assert sorted(s[0] for s in sender.segments) == sorted(f"good-{i}" for i in range(20))


def test_unsupported_kinds_are_counted(arena: Arena, run: Any) -> None:
    sender = MemorySender(supports=frozenset({"segment", "management"}))
    r = run(sender)
    write_all(
        arena.path,
        [
            *segments_for("s", 3),
            (R.LOG, log_record("l")),
            (R.METER, meter_record("m")),
            (R.METER, meter_record("n")),
        ],
    )
    wait_for(lambda: len(sender.segments) == 3)
    wait_for(lambda: r.reporter.counters.dropped["unsupported"] == 3)
    # Never even tried the unsupported kinds: a call of one would be a failure. (The three
    # segments may come in one read or in more, as the reporter's tick meets the writes.)
    assert sender.failures == 0 and 1 <= sender.calls <= 3
    r.stop()


def test_disabled_kinds_are_counted(arena: Arena, run: Any) -> None:
    r = run(log_enabled=False)
    write_all(arena.path, [*segments_for("s", 2), (R.LOG, log_record("l"))])
    wait_for(lambda: len(r.sender.segments) == 2 and r.reporter.counters.dropped.get("disabled") == 1)
    r.stop()


def test_fatal_errors_drop_without_retry(arena: Arena, run: Any) -> None:
    sender = MemorySender()
    sender.fail_next(1, fatal=True)
    r = run(sender, retry_max_attempts=5)
    write_all(arena.path, segments_for("f", 4))
    # The refused send is the first batch: all four records, or fewer when the reporter read
    # the ring between the writes (the rest then go in the next batch, which succeeds).
    counters = r.reporter.counters
    wait_for(lambda: counters.dropped.get("rejected", 0) + len(sender.segments) == 4)
    rejected = counters.dropped["rejected"]
    assert rejected >= 1 and counters.retried == 0
    write_all(arena.path, segments_for("g", 2))
    wait_for(lambda: len(sender.segments) == 4 - rejected + 2)
    assert counters.dropped["rejected"] == rejected and counters.retried == 0
    r.stop()


def test_instances_are_announced_kept_alive_and_forgotten(arena: Arena, run: Any) -> None:
    sender = MemorySender()
    r = run(sender, keepalive_interval_s=0.1, properties_every_n_keepalives=3)
    w = spawn_writer(arena.path, segments_for("i", 2), announce=True, hold=True)
    slot = w.wait_written()
    wait_for(lambda: len(sender.keepalives) >= 4, 10, "keep-alives")
    service, instance, props, _layer = sender.properties[0]
    assert (service, instance) == ("svc", f"inst-{slot}")
    p = dict(props)
    assert p["language"] == "python"
    assert p["Process No."] == str(w.pid)
    assert p["slot"] == str(slot)
    assert p["extra"] == "yes"  # merged from the record
    for key in ("OS Name", "hostname", "ipv4", "python_version", "python_implementation"):
        assert key in p
    wait_for(lambda: len(sender.properties) >= 2, 10, "properties re-sent")
    doc = status_doc(arena)
    wait_for(lambda: str(slot) in status_doc(arena)["instances"], 5)
    doc = status_doc(arena)
    assert doc["instances"][str(slot)]["pid"] == w.pid
    assert w.release() == 0
    # The slot's lock is free: no more keep-alives for it.
    wait_for(lambda: not r.reporter.instances, 5, "instance forgotten")
    count = len(sender.keepalives)
    wait_for(lambda: str(slot) not in status_doc(arena)["instances"], 5)
    import time

    time.sleep(0.3)  # several keep-alive periods: none may come
    assert len(sender.keepalives) == count
    r.stop()


def test_a_worker_gone_before_its_first_keepalive_is_still_announced(arena: Arena, run: Any) -> None:
    # Keep-alives far apart: the worker is gone long before the keeper's first round for it.
    sender = MemorySender()
    r = run(sender, keepalive_interval_s=30.0)
    w = spawn_writer(arena.path, segments_for("short", 1), announce=True)
    slot = w.wait_written()
    assert w.release() == 0
    wait_for(lambda: sender.properties, 10, "properties of the short-lived worker")
    service, instance, _props, _layer = sender.properties[0]
    assert (service, instance) == ("svc", f"inst-{slot}")
    wait_for(lambda: slot not in r.reporter.instances, 5, "instance forgotten")
    r.stop()


def test_an_unannounced_instance_is_announced_at_shutdown_while_the_last_sends_hang(
    arena: Arena, run: Any
) -> None:
    # The keeper's first announcement fails and its retry is far off; the worker's segment
    # send hangs through the whole shutdown deadline. The announcement must not wait behind
    # it (it used to: the deadline was gone by then, and the instance never reached the OAP).
    sender = MemorySender(fail_next=1)
    sender.block(frozenset({"segment"}))
    far = {"keepalive_interval_s": 30.0, "retry_backoff_base_s": 30.0, "retry_backoff_max_s": 30.0}
    r = run(sender, shutdown_deadline_s=2.0, **far)
    w = spawn_writer(arena.path, segments_for("stuck", 1), announce=True, hold=True)
    slot = w.wait_written()
    try:
        wait_for(lambda: sender.failures >= 1, 10, "the first announcement to fail")
        assert sender.properties == []
        r.stop()
        assert [p[1] for p in sender.properties] == [f"inst-{slot}"]
        assert sender.segments == []  # still hanging when the deadline passed
    finally:
        sender.unblock()
        w.release()


def test_an_announcement_that_fails_at_shutdown_is_tried_again_within_the_deadline(
    arena: Arena, run: Any
) -> None:
    # A short-lived program: the keeper's first announcement fails (its retry is ~1-2 s
    # away), then the shutdown's first attempt fails too (a connection still being made).
    # It is tried again after the backoff, inside the deadline, like a batch of records.
    sender = MemorySender(fail_next=1)
    r = run(
        sender,
        keepalive_interval_s=30.0,
        retry_backoff_base_s=2.0,
        retry_backoff_max_s=2.0,
        shutdown_deadline_s=6.0,
    )
    w = spawn_writer(arena.path, segments_for("brief", 1), announce=True, hold=True)
    slot = w.wait_written()
    try:
        wait_for(lambda: sender.failures >= 1, 10, "the keeper's announcement to fail")
        sender.fail_next(1)
        r.stop()
        assert sender.failures == 2, sender.failures
        assert [p[1] for p in sender.properties] == [f"inst-{slot}"]
    finally:
        w.release()


def test_a_worker_that_says_goodbye_before_its_first_keepalive_is_still_announced(
    arena: Arena, run: Any
) -> None:
    sender = MemorySender()
    r = run(sender, keepalive_interval_s=30.0)
    w = spawn_writer(arena.path, [], announce=True, hold=True)
    slot = w.wait_written()
    bye = spawn_writer(arena.path, [(R.WORKER_STOP, orjson.dumps([w.pid, slot]))])
    bye.wait_written()
    assert bye.release() == 0
    assert w.release() == 0
    wait_for(lambda: sender.properties, 10, "properties of the worker that left")
    assert sender.properties[0][1] == f"inst-{slot}"
    r.stop()


def test_worker_stop_and_replacement(arena: Arena, run: Any) -> None:
    sender = MemorySender()
    r = run(sender, keepalive_interval_s=0.1)
    w = spawn_writer(arena.path, [], announce=True, hold=True)
    slot = w.wait_written()
    wait_for(lambda: slot in r.reporter.instances)
    # A WORKER_STOP from someone else's pid does not end it; the owner's does.
    stop = spawn_writer(arena.path, [(R.WORKER_STOP, orjson.dumps([12345, slot]))])
    stop.wait_written()
    assert stop.release() == 0
    wait_for(lambda: r.reporter.counters.read.get("worker_stop") == 1)
    assert slot in r.reporter.instances
    w.release()
    wait_for(lambda: slot not in r.reporter.instances)
    r.stop()


def test_status_document_has_the_documented_keys(arena: Arena, run: Any) -> None:
    r = run()
    write_all(arena.path, segments_for("s", 3))
    wait_for(lambda: len(r.sender.segments) == 3)
    wait_for(lambda: status_doc(arena).get("sent", {}).get("segment") == 3)
    snap = arena.status.snapshot()
    age = snap.heartbeat_age_s()
    assert age is not None and age < 1.0
    doc = orjson.loads(snap.document)
    for key in (
        "v",
        "pid",
        "service",
        "protocol",
        "mode",
        "started_ns",
        "restarts",
        "backend",
        "read",
        "sent",
        "retried",
        "failed",
        "dropped",
        "spool",
        "pending_bytes",
        "instances",
        "rates",
    ):
        assert key in doc, key
    assert doc["v"] == 1 and doc["pid"] == os.getpid() and doc["mode"] == "thread"
    assert set(doc["backend"]) >= {
        "address",
        "state",
        "last_success_ns",
        "last_error",
        "last_error_ns",
        "consecutive_failures",
    }
    assert doc["backend"]["state"] == "ok"
    assert set(doc["dropped"]) >= {"invalid", "backend", "unsupported", "spool"}
    assert set(doc["spool"]) >= {"enabled", "bytes", "cap", "records"}
    assert set(doc["rates"]) == {"read_per_s", "sent_per_s"}
    assert doc["read"]["segment"] == 3
    r.stop()


def test_status_document_stays_under_the_block_limit() -> None:
    from reporter_proc.status import Counters, InstanceView, Rates, build_document

    c = Counters()
    c.last_error = "x" * 5000
    many = [InstanceView(i, 100000 + i, "instance-name-" + "y" * 60 + str(i), 0) for i in range(4096)]
    doc = build_document(
        pid=1,
        service="s",
        protocol="grpc",
        mode="process",
        started_ns=0,
        restarts=0,
        address="a",
        counters=c,
        spool_enabled=False,
        spool_bytes=0,
        spool_cap=0,
        spool_records=0,
        pending_bytes=0,
        instances=many,
        max_instances=4096,
        rates=Rates(),
    )
    assert len(doc) < 8192 - 128
    parsed = orjson.loads(doc)
    assert parsed["instances_total"] == 4096 and 0 < len(parsed["instances"]) < 4096


def test_sigterm_style_stop_flushes_what_is_in_the_rings(arena: Arena, run: Any) -> None:
    sender = MemorySender()
    sender.block()
    r = run(sender, batch_max_records=1000, flush_interval_s=60)  # nothing would flush on its own
    write_all(arena.path, segments_for("t", 120))
    wait_for(lambda: r.reporter.counters.read.get("segment") == 120)
    sender.unblock()
    r.stop()  # seals the open batch, sends it, then ends
    assert len(sender.segments) == 120
    assert sender.closed


def test_a_large_batch_goes_on_the_next_read_tick_a_small_one_waits_for_the_flush_tick(
    arena: Arena, run: Any
) -> None:
    """Below saturation a send costs about the same whatever it carries: a batch is sent
    early (on a read tick) only once it holds ``send_early_records``; the rest waits for the
    flush tick (here never: 60 s) or the stop.

    The 150 are in the ring before the reporter starts, so its first pass reads them all: a
    read tick in the middle of a writer still writing would send what it had read and hold
    the rest (fewer than 100) for the flush tick, as designed, and the count would not be 150.
    """
    write_all(arena.path, segments_for("big", 150))
    r = run(batch_max_records=1000, flush_interval_s=60, send_early_records=100)
    wait_for(lambda: len(r.sender.segments) == 150, 10, "the large batch sent before any flush tick")
    write_all(arena.path, segments_for("small", 30))
    wait_for(lambda: r.reporter.counters.read.get("segment") == 180, 10, "the small batch read")
    passes = r.reporter.intake.passes
    wait_for(lambda: r.reporter.intake.passes >= passes + 5, 10, "five more read ticks")
    assert len(r.sender.segments) == 150  # 30 < 100: held until the flush tick
    r.stop()  # the stop sends what is held
    assert len(r.sender.segments) == 180


def test_memory_sender_supports_everything_by_default() -> None:
    assert MemorySender().supports == KINDS


def test_spool_takes_over_when_the_backend_is_down_then_replays(
    arena: Arena, run: Any, tmp_path: Any
) -> None:
    sender = MemorySender(fail_next=10**6)
    r = run(sender, batch_max_records=10, retry_max_attempts=1, spool_dir=str(tmp_path / "spool"))
    write_all(arena.path, segments_for("s", 50))
    wait_for(lambda: r.reporter.counters.spooled == 50, 10, "spooled")
    assert r.reporter.counters.dropped["backend"] == 0
    wait_for(lambda: all(arena.reader(s).backlog() == 0 for s in range(arena.slots)), 5, "commit")
    assert not sender.segments
    sender.fail_next(0)  # the backend is back
    wait_for(lambda: len(sender.segments) == 50, 10, "replay")
    assert sorted(s[0] for s in sender.segments) == sorted(f"s-{i}" for i in range(50))
    wait_for(lambda: r.reporter.spool is not None and r.reporter.spool.total_records == 0)
    doc = wait_for(lambda: (d := status_doc(arena))["spool"]["replayed"] == 50 and d)
    assert doc["spool"]["enabled"] is True and doc["spool"]["records"] == 0
    r.stop()


def test_full_memory_spills_to_the_spool_instead_of_stopping(arena: Arena, run: Any, tmp_path: Any) -> None:
    sender = MemorySender()
    sender.block()
    r = run(sender, batch_max_records=10, max_pending_bytes=3000, spool_dir=str(tmp_path / "spool"))
    write_all(arena.path, segments_for("d", 200))
    # Nothing was sent, yet the whole ring could be read and released: the rest is on disk.
    wait_for(lambda: r.reporter.counters.read.get("segment") == 200, 10, "all read")
    assert r.reporter.counters.spooled > 100
    wait_for(lambda: all(arena.reader(s).backlog() < 3000 for s in range(arena.slots)), 10, "ring released")
    sender.unblock()
    wait_for(lambda: len(sender.segments) >= 200, 10, "delivery")
    r.stop()
    assert sorted(set(s[0] for s in sender.segments)) == sorted(f"d-{i}" for i in range(200))
