"""The status publisher skips the document when nothing in it changed, never the heartbeat.

A real arena, journal, ledger, spool and instance table, the in-memory sender, and the
publisher called tick by tick as its task does: an idle tick writes the heartbeat and
neither builds nor publishes the document; any change to what the document shows (or the
counter table stores) is published on the next tick, and a reporter whose traffic stopped
keeps publishing until its rates are at rest.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from ipc import Arena
from reporter_proc import publisher as P
from reporter_proc import records as R
from reporter_proc import status as S
from reporter_proc.instances import Instance, Instances
from reporter_proc.journal import Journal
from reporter_proc.ledger import Ledger
from reporter_proc.lifecycle import StopState
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from reporter_proc.spool import Spool
from reporter_proc.spooling import SpoolWriter
from tests.test_reporter_helpers import log_record


def _instance(slot: int, pid: int, keepalive_ns: int) -> Instance:
    return Instance(
        record=[],
        pid=pid,
        slot=slot,
        service="svc",
        instance=f"i{slot}",
        layer="",
        properties=[],
        last_keepalive_ns=keepalive_ns,
    )


class Rig:
    """A publisher over real parts, counting builds, publications and heartbeats."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.arena = Arena.create(str(tmp_path / "t.arena"), slots=4, ring_capacity=64 * 1024)
        self.journal = Journal(ReporterSettings(service="svc"))
        self.stop = StopState()
        self.sender = MemorySender()
        self.spool = SpoolWriter(Spool(str(tmp_path / "spool"), 1 << 20, 1 << 16), self.journal)
        self.ledger = Ledger(lambda slot, pos: None)
        self.instances = Instances(
            self.arena, self.journal, self.sender, self.stop, own_process_slots=True, backoff=lambda n: 1.0
        )
        for slot in (0, 1):
            self.instances.table[slot] = _instance(slot, 4000 + slot, 1_000 + slot)
        self.supervisor = {"pid": 77, "start_ticks": 5, "replaced": 0}
        self.parts = P.Parts(
            sender=self.sender,
            spool=self.spool,
            ledger=self.ledger,
            instances=self.instances,
            read_counts={R.SEGMENT: 10, R.LOG: 3},
            supervisor=lambda: dict(self.supervisor),
        )
        self.journal.counters.sent.update(segment=9, log=3, keepalive=2)
        self.publisher = P.StatusPublisher(
            self.arena, self.journal, self.stop, mode="thread", restarts=0, parts=self.parts
        )
        self.publisher.carry_over()
        self.step: Callable[[], None] = lambda: None  # before each tick (a clock moves)
        self.builds = 0
        self.publications = 0
        self.heartbeats = 0
        build = P.build_document

        def counting_build(**kw: Any) -> bytes:
            self.builds += 1
            return build(**kw)

        monkeypatch.setattr(P, "build_document", counting_build)
        status = self.arena.status
        publish, heartbeat = status.publish, status.heartbeat

        def counting_publish(doc: bytes, counters: Any = None) -> bool:
            self.publications += 1
            return publish(doc, counters)

        def counting_heartbeat() -> None:
            self.heartbeats += 1
            heartbeat()

        monkeypatch.setattr(status, "publish", counting_publish)
        monkeypatch.setattr(status, "heartbeat", counting_heartbeat)

    def tick(self) -> tuple[int, int]:
        """One status tick; ``(builds, publications)`` it made."""
        self.step()
        builds, publications = self.builds, self.publications
        self.publisher.publish()
        return self.builds - builds, self.publications - publications

    def settle(self) -> None:
        """Tick until a tick publishes nothing (the rates at rest): at most three ticks."""
        for _ in range(3):
            if self.tick() == (0, 0):
                return
        raise AssertionError("the document never settled")

    def doc(self) -> dict[str, Any]:
        loaded: dict[str, Any] = orjson.loads(self.arena.status.snapshot().document)
        return loaded

    def close(self) -> None:
        self.spool.spool.close()
        self.arena.close()


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    r = Rig(tmp_path, monkeypatch)
    yield r
    r.close()


def test_an_idle_tick_heartbeats_but_does_not_rebuild_the_document(rig: Rig) -> None:
    assert rig.tick() == (1, 1)  # the first tick always publishes
    rig.settle()
    doc, counters = rig.arena.status.snapshot().document, rig.arena.status.snapshot().counters
    beat = rig.arena.status.snapshot().heartbeat_ns
    heartbeats = rig.heartbeats
    for _ in range(5):
        time.sleep(0.002)
        assert rig.tick() == (0, 0)
        now = rig.arena.status.snapshot().heartbeat_ns
        assert now > beat  # the heartbeat is written on every tick
        beat = now
    assert rig.heartbeats == heartbeats + 5
    snap = rig.arena.status.snapshot()
    assert snap.document == doc and snap.counters == counters
    assert rig.publisher.document() == doc  # what a rebuild would give: skipping hid nothing


def _keepalive(r: Rig) -> None:
    r.instances.table[1].last_keepalive_ns += 30_000_000_000


def _new_instance(r: Rig) -> None:
    r.instances.table[2] = _instance(2, 4002, 5)


def _pid_change(r: Rig) -> None:
    r.instances.table[0].pid = 5000


def _spool_write(r: Rig) -> None:
    r.spool.write([(R.LOG, log_record("to disk"))])


def _spool_append(r: Rig) -> None:
    r.spool.spool.append([(R.LOG, log_record("to disk"))])  # the spool alone, no count moves


def _spool_drop(r: Rig) -> None:
    r.spool.write_drops += 3


def _failure(r: Rig) -> None:
    r.journal.counters.failure("UNAVAILABLE: connection refused")


def _success(r: Rig) -> None:
    r.journal.counters.success()
    r.journal.counters.last_success_ns += 1  # distinct from any earlier success, whatever the clock


def _sent(r: Rig) -> None:
    r.journal.counters.sent["segment"] += 1


def _sent_new_kind(r: Rig) -> None:
    r.journal.counters.sent["properties"] = 1


def _read(r: Rig) -> None:
    r.parts.read_counts[R.SEGMENT] += 1


def _error_text(r: Rig) -> None:
    r.journal.counters.last_error = "DEADLINE_EXCEEDED"  # the text alone


def _restarts(r: Rig) -> None:
    r.publisher.restarts = 2


def _supervisor(r: Rig) -> None:
    r.supervisor.update(pid=78, replaced=1)


def _address(r: Rig) -> None:
    r.sender.address = "oap-2:11800"  # a backend failover


def _pending(r: Rig) -> None:
    r.ledger.pending_bytes += 4096


def _bump(attr: str) -> Callable[[Rig], None]:
    def change(r: Rig) -> None:
        setattr(r.journal.counters, attr, getattr(r.journal.counters, attr) + 1)

    return change


def _dropped(r: Rig) -> None:
    r.journal.dropped("backend", 2)


# change, then what the published document must show
CHANGES: dict[str, tuple[Callable[[Rig], None], Callable[[dict[str, Any]], bool]]] = {
    "sent": (_sent, lambda d: d["sent"]["segment"] == 10),
    "sent-new-kind": (_sent_new_kind, lambda d: d["sent"]["properties"] == 1),
    "read": (_read, lambda d: d["read"]["segment"] == 11),
    "retried": (_bump("retried"), lambda d: d["retried"] == 1),
    "failed": (_bump("failed"), lambda d: d["failed"] == 1),
    "spooled": (_bump("spooled"), lambda d: d["spool"]["spooled"] == 1),
    "replayed": (_bump("replayed"), lambda d: d["spool"]["replayed"] == 1),
    "profile-refused": (
        _bump("profile_commands_refused"),
        lambda d: d["profile"] == {"commands_refused": 1},
    ),
    "dropped": (_dropped, lambda d: d["dropped"]["backend"] == 2),
    "backend-failure": (
        _failure,
        lambda d: (
            d["backend"]["state"] == "failing"
            and d["backend"]["last_error"].startswith("UNAVAILABLE")
            and d["backend"]["consecutive_failures"] == 1
        ),
    ),
    "backend-success": (
        _success,
        lambda d: d["backend"]["state"] == "ok" and d["backend"]["last_success_ns"] > 0,
    ),
    "keepalive": (_keepalive, lambda d: d["instances"]["1"]["last_keepalive_ns"] == 30_000_001_001),
    "new-instance": (_new_instance, lambda d: "2" in d["instances"] and d["instances_total"] == 3),
    "instance-pid": (_pid_change, lambda d: d["instances"]["0"]["pid"] == 5000),
    "spool-write": (_spool_write, lambda d: d["spool"]["records"] == 1 and d["spool"]["bytes"] > 0),
    "spool-append": (_spool_append, lambda d: d["spool"]["records"] == 1 and d["spool"]["bytes"] > 0),
    "spool-drop": (_spool_drop, lambda d: d["dropped"]["spool"] == 3),
    "pending-bytes": (_pending, lambda d: d["pending_bytes"] == 4096),
    "last-error-text": (_error_text, lambda d: d["backend"]["last_error"] == "DEADLINE_EXCEEDED"),
    "restarts": (_restarts, lambda d: d["restarts"] == 2),
    "stopping": (lambda r: r.stop.begin("SIGTERM", 5.0), lambda d: d["stopping"] == "SIGTERM"),
    "supervisor": (_supervisor, lambda d: d["supervisor"] == {"pid": 78, "start_ticks": 5, "replaced": 1}),
    "address": (_address, lambda d: d["backend"]["address"] == "oap-2:11800"),
}


def _shown(check: Callable[[dict[str, Any]], bool], doc: dict[str, Any]) -> bool:
    try:
        return check(doc)
    except KeyError:  # not in the document (yet)
        return False


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_a_change_is_published_on_the_next_tick(rig: Rig, name: str) -> None:
    change, shows = CHANGES[name]
    rig.settle()
    assert not _shown(shows, rig.doc())
    change(rig)
    assert rig.tick() == (1, 1)
    assert _shown(shows, rig.doc()), rig.doc()
    # The counter table (what a restarted reporter continues from) went with it.
    assert rig.arena.status.snapshot().counters == rig.journal.counters.flat()
    rig.settle()  # and then quiet again (a count also moves the rates once)
    assert _shown(shows, rig.doc())


def test_the_counter_table_follows_a_count(rig: Rig) -> None:
    rig.settle()
    rig.journal.counters.sent["segment"] += 5
    rig.journal.dropped("invalid")
    rig.tick()
    counters = rig.arena.status.snapshot().counters
    assert counters["sent.segment"] == 14 and counters["dropped.invalid"] == 1


@pytest.mark.parametrize("moved", ["read", "sent", "both"])
def test_rates_are_published_until_they_decay_to_zero(rig: Rig, moved: str) -> None:
    rig.settle()
    assert rig.doc()["rates"] == {"read_per_s": 0.0, "sent_per_s": 0.0}
    if moved in ("read", "both"):
        rig.parts.read_counts[R.SEGMENT] += 50
    if moved in ("sent", "both"):
        rig.journal.counters.sent["segment"] += 50
    time.sleep(0.01)
    assert rig.tick() == (1, 1)
    rates = rig.doc()["rates"]
    assert (rates["read_per_s"] > 0) == (moved != "sent")
    assert (rates["sent_per_s"] > 0) == (moved != "read")
    time.sleep(0.01)
    assert rig.tick() == (1, 1)  # no new records: the rates fall to zero, and that is news
    assert rig.doc()["rates"] == {"read_per_s": 0.0, "sent_per_s": 0.0}
    assert rig.tick() == (0, 0)  # at rest


def _clock(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A monotonic clock the publisher and its rates read, one second further at each of the
    rig's ticks as in the reporter (call before the rig's first tick)."""
    now = [1000.0]
    fake = SimpleNamespace(monotonic=lambda: now[0], time_ns=time.time_ns)
    monkeypatch.setattr(P, "time", fake)
    monkeypatch.setattr(S, "time", fake)
    rig.publisher.rates = S.Rates()  # its period starts on the new clock

    def step() -> None:
        now[0] += 1.0

    rig.step = step
    return now


def test_a_rate_after_idle_ticks_is_over_the_last_tick_only(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clock(rig, monkeypatch)
    rig.settle()
    for _ in range(10):  # ten idle ticks, skipped
        assert rig.tick() == (0, 0)
    rig.parts.read_counts[R.SEGMENT] += 20
    rig.journal.counters.sent["segment"] += 20
    assert rig.tick() == (1, 1)
    assert rig.doc()["rates"] == {"read_per_s": 20.0, "sent_per_s": 20.0}  # not 20 over 11 s


def test_rates_that_could_not_take_their_totals_are_not_at_rest(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = _clock(rig, monkeypatch)
    rig.settle()
    rig.parts.read_counts[R.SEGMENT] += 20
    rig.step = lambda: None  # the clock stands still: no rate can be computed
    assert rig.tick() == (1, 1)  # the count
    assert rig.doc()["rates"]["read_per_s"] == 0.0
    now[0] += 2.0
    assert rig.tick() == (1, 1)  # the 20 records, over the last 2 s
    assert rig.doc()["rates"]["read_per_s"] == 10.0


def test_rates_decayed_by_another_caller_are_still_published(rig: Rig) -> None:
    rig.settle()
    rig.parts.read_counts[R.SEGMENT] += 50
    time.sleep(0.01)
    assert rig.tick() == (1, 1)
    assert rig.doc()["rates"]["read_per_s"] > 0
    time.sleep(0.01)
    rig.publisher.document()  # e.g. the exit summary's totals(): the rates fall to 0 there
    assert rig.tick() == (1, 1)  # the arena still showed the old rate
    assert rig.doc()["rates"] == {"read_per_s": 0.0, "sent_per_s": 0.0}
    assert rig.tick() == (0, 0)


def test_an_unchanged_document_is_still_rebuilt_every_rebuild_s(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = _clock(rig, monkeypatch)
    rig.settle()
    built = []
    for _ in range(int(3 * P.REBUILD_S)):
        if rig.tick() == (1, 1):
            built.append(now[0])
    assert len(built) >= 2 and all(b - a == P.REBUILD_S for a, b in itertools.pairwise(built))


def test_a_failed_publication_is_retried_on_the_next_tick(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    rig.settle()
    rig.journal.counters.sent["segment"] += 1
    status = rig.arena.status
    working = status.publish

    def broken(doc: bytes, counters: Any = None) -> bool:
        raise OSError("mapping gone")

    monkeypatch.setattr(status, "publish", broken)
    rig.publisher.publish()  # logged once, never raised
    monkeypatch.setattr(status, "publish", working)
    assert rig.doc()["sent"]["segment"] == 9
    assert rig.tick()[0] == 1  # nothing changed since, but the last attempt failed
    assert rig.doc()["sent"]["segment"] == 10
