"""The disk spool: append, replay, cap, torn tails, one owner per directory."""

from __future__ import annotations

import os
from typing import Any

import pytest

from reporter_proc.journal import Journal
from reporter_proc.settings import ReporterSettings
from reporter_proc.spool import Spool, SpoolBusy
from reporter_proc.spooling import SpoolWriter


def items(prefix: str, n: int, size: int = 100) -> list[tuple[int, bytes]]:
    return [(1, f"{prefix}-{i}-".encode().ljust(size, b".")) for i in range(n)]


def replay_all(spool: Spool) -> list[bytes]:
    out = []
    while (f := spool.oldest()) is not None:
        recs, end = spool.read(f, 7)
        out.extend(p for _t, p in recs)
        spool.ack(f, end, len(recs))
    return out


def test_records_come_back_in_order_and_files_go_away(tmp_path: Any) -> None:
    s = Spool(str(tmp_path), max_bytes=1 << 20, segment_bytes=4096)
    data = items("a", 100)
    assert s.append(data[:60]) == 60
    assert s.append(data[60:]) == 40
    assert s.total_records == 100 and s.total_bytes > 100 * 100
    assert len(s.files) > 1  # rolled over at the segment size
    assert replay_all(s) == [p for _t, p in data]
    assert s.total_records == 0 and not s
    assert [n for n in os.listdir(tmp_path) if n.endswith(".spool")] == []
    s.close()


def test_cap_drops_the_oldest_and_counts(tmp_path: Any) -> None:
    s = Spool(str(tmp_path), max_bytes=20_000, segment_bytes=4096)
    for i in range(10):
        s.append(items(f"b{i}", 30))
    assert s.total_bytes <= 20_000
    assert s.dropped_records > 0
    assert s.dropped_records + s.total_records == 300
    got = replay_all(s)
    assert len(got) == s.total_records + len(got)  # everything left was readable
    assert got[-1].startswith(b"b9-29-")  # the newest survived
    s.close()


def test_a_torn_tail_is_ignored_and_the_rest_survives_a_restart(tmp_path: Any) -> None:
    s = Spool(str(tmp_path), max_bytes=1 << 20)
    s.append(items("c", 10))
    path = s.files[-1].path
    s.close()
    with open(path, "ab") as f:
        f.write(b"\x50\x00\x00\x00\x01\x00")  # half a header: a crash mid-write
    s2 = Spool(str(tmp_path), max_bytes=1 << 20)
    assert s2.total_records == 10 and s2.torn_tails == 1
    s2.append(items("d", 2))  # goes to a new file, never after a torn tail
    assert len(s2.files) == 2
    assert [p[:4] for p in replay_all(s2)] == [b"c-%d-" % i for i in range(10)] + [b"d-0-", b"d-1-"]
    s2.close()


def test_a_corrupt_record_ends_the_file_there(tmp_path: Any) -> None:
    s = Spool(str(tmp_path), max_bytes=1 << 20)
    s.append(items("e", 5, size=50))
    path = s.files[-1].path
    s.close()
    with open(path, "r+b") as f:  # flip a byte in the third record's payload
        f.seek(8 + 2 * (12 + 50) + 12 + 10)
        f.write(b"X")
    s2 = Spool(str(tmp_path), max_bytes=1 << 20)
    assert s2.total_records == 2
    assert len(replay_all(s2)) == 2
    s2.close()


def test_one_owner_per_directory(tmp_path: Any) -> None:
    s = Spool(str(tmp_path), max_bytes=1 << 20)
    with pytest.raises(SpoolBusy):
        pid = os.fork()
        if pid == 0:  # flock is per open file description: test from another process
            try:
                Spool(str(tmp_path), max_bytes=1 << 20)
                os._exit(0)
            except SpoolBusy:
                os._exit(9)
            finally:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) == 9:
            raise SpoolBusy("as expected")
    s.close()
    s3 = Spool(str(tmp_path), max_bytes=1 << 20)  # free again after close
    s3.close()


def test_the_cap_never_drops_the_records_being_replayed(tmp_path: Any) -> None:
    s = Spool(str(tmp_path), max_bytes=20_000, segment_bytes=4096)
    s.append(items("a", 40))
    f = s.oldest()
    assert f is not None
    recs, end = s.read(f, 10)  # on their way to the backend
    for i in range(10):  # the backend fails again meanwhile: far over the cap
        s.append(items(f"b{i}", 30))
    assert s.files[0] is f and s.total_bytes <= 20_000
    s.ack(f, end, len(recs))  # their send succeeded
    # Every record written is delivered, dropped or still held: exactly one of them.
    assert len(recs) + s.dropped_records + s.total_records == 40 + 300
    assert replay_all(s)[-1].startswith(b"b9-29-")  # the newest survived
    s.close()


def test_the_cap_drops_the_unsent_rest_of_the_file_being_replayed_from_disk_too(tmp_path: Any) -> None:
    s = Spool(str(tmp_path), max_bytes=20_000, segment_bytes=4096)
    s.append(items("a", 150))  # one file
    f = s.oldest()
    assert f is not None
    recs, _end = s.read(f, 100)
    s.append(items("b", 50))  # over the cap: the oldest records not in flight go
    assert s.files[0] is f and f.records == 100 and s.dropped_records == 50
    held = s.total_records  # the 100 in flight (not acknowledged yet) and the 50 new ones
    assert held == 150
    s.close()
    s2 = Spool(str(tmp_path), max_bytes=20_000, segment_bytes=4096)  # a restart before the ack
    assert s2.total_records == held  # what was counted dropped is not replayed
    got = replay_all(s2)
    assert got[:100] == [p for _t, p in recs] and got[-1].startswith(b"b-49-")
    s2.close()


def test_the_cap_leaves_the_records_in_flight_when_nothing_else_is_left(tmp_path: Any) -> None:
    s = Spool(str(tmp_path), max_bytes=20_000, segment_bytes=4096)
    s.append(items("a", 150))
    f = s.oldest()
    assert f is not None
    recs, end = s.read(f, 150)  # the whole file in flight
    s.append(items("b", 50))
    assert [g.seq for g in s.files] == [f.seq] and s.dropped_records == 50
    s.ack(f, end, len(recs))
    assert len(recs) + s.dropped_records + s.total_records == 200 and not s.files
    s.close()


def test_a_short_write_counts_as_dropped_only_what_did_not_reach_the_disk(
    tmp_path: Any, monkeypatch: Any
) -> None:
    j = Journal(ReporterSettings())
    w = SpoolWriter(Spool(str(tmp_path), max_bytes=1 << 20), j)
    w.write(items("a", 5))
    real_write = os.write

    def short(fd: int, data: Any) -> int:  # the disk fills up in the middle of a record
        return real_write(fd, bytes(data[: len(data) // 2 + 7]) if fd == w.spool._fd else data)

    monkeypatch.setattr(os, "write", short)
    w.write(items("b", 10))
    monkeypatch.undo()
    assert j.counters.spooled + w.dropped == 15 and w.dropped > 0
    assert w.spool.total_records == j.counters.spooled
    w.spool.close()
    again = Spool(str(tmp_path), max_bytes=1 << 20)  # a restart replays what counted as spooled
    assert again.total_records == j.counters.spooled
    again.close()
