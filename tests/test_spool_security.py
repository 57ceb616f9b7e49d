"""The spool against other local users, and against a full disk (issue 16).

Directories and files are really chown'ed to ``nobody`` / chmod'ed (the tests run as root,
as the suite does); the full disk is a real 256 KiB tmpfs mounted for the test. The last
tests run the real reporter (``ReporterThread``) over a real arena with writer processes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ipc import Arena
from reporter_proc import records as R
from reporter_proc.journal import Journal
from reporter_proc.process import ReporterThread
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from reporter_proc.spool import MAGIC, Spool
from reporter_proc.spooldir import SpoolUnsafe, default_base
from reporter_proc.spooling import SpoolWriter
from tests.test_reporter_helpers import segment, status_doc, wait_for, write_all

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def spooled_file(path: Path, payloads: list[bytes]) -> None:
    """A well-formed spool file (what a reporter would write) at ``path``."""
    spool_dir = path.parent.parent / f"maker-{uuid.uuid4().hex}"
    s = Spool(str(spool_dir), 1 << 20)
    s.append([(R.SEGMENT, p) for p in payloads])
    s.close()
    (made,) = spool_dir.glob("*.spool")
    path.write_bytes(made.read_bytes())
    os.chmod(path, 0o600)


def journal(**kw: Any) -> Journal:
    return Journal(ReporterSettings(service="svc", **kw))


# -- the directory -----------------------------------------------------------------------------
def test_a_spool_directory_owned_by_another_user_is_refused(tmp_path: Path, caplog: Any) -> None:
    d = tmp_path / "spool" / "svc"
    d.mkdir(parents=True, mode=0o700)
    os.chown(d, NOBODY, NOBODY)
    with pytest.raises(SpoolUnsafe, match="owned by uid 65534"):
        Spool(str(d), 1 << 20)
    with caplog.at_level(logging.ERROR, "swmp.reporter"):
        assert SpoolWriter.open(journal(spool_dir=str(tmp_path / "spool"))) is None
    assert "spool disabled, its directory is not private" in caplog.text
    assert os.listdir(d) == []  # nothing was created in it


def test_an_ancestor_writable_by_others_is_refused_unless_sticky(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # anyone could rename our directory away and plant their own
    with pytest.raises(SpoolUnsafe, match="writable by other users"):
        Spool(str(shared / "me" / "svc"), 1 << 20)
    assert not (shared / "me").exists()
    os.chmod(shared, 0o1777)  # like /tmp: others cannot touch what we create in it
    s = Spool(str(shared / "me" / "svc"), 1 << 20)
    assert (os.stat(shared / "me").st_mode & 0o777) == 0o700
    assert (os.stat(shared / "me" / "svc").st_mode & 0o777) == 0o700
    s.close()


def test_an_ancestor_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(SpoolUnsafe, match="owned by uid 65534"):
        Spool(str(theirs / "svc"), 1 << 20)


def test_a_symlinked_spool_directory_or_lock_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "base").mkdir(mode=0o700)
    (tmp_path / "base" / "svc").symlink_to(real)
    with pytest.raises(SpoolUnsafe, match="symbolic link"):
        Spool(str(tmp_path / "base" / "svc"), 1 << 20)
    d = tmp_path / "locked"
    d.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (d / ".lock").symlink_to(victim)
    with pytest.raises(OSError):
        Spool(str(d), 1 << 20)
    assert victim.read_bytes() == b"keep"


def test_the_default_directory_is_private_per_user(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_base() == str(tmp_path / "state" / "swmp" / "spool")
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "no-such-home"))
    assert default_base(1234) == "/var/tmp/swmp-1234/spool"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    w = SpoolWriter.open(journal(spool_dir="auto"))
    assert w is not None
    assert w.spool.directory == str(tmp_path / "state" / "swmp" / "spool" / "svc")
    for p in (tmp_path / "state" / "swmp", tmp_path / "state" / "swmp" / "spool", Path(w.spool.directory)):
        st = os.stat(p)
        assert st.st_uid == os.geteuid() and (st.st_mode & 0o777) == 0o700, p
    assert SpoolWriter.open(journal(spool_dir="off")) is None
    w.spool.close()


def test_two_applications_of_one_service_get_a_spool_each(tmp_path: Path) -> None:
    j = journal(spool_dir=str(tmp_path / "spool"))
    first, second = SpoolWriter.open(j), SpoolWriter.open(j)
    assert first is not None and second is not None
    assert first.spool.directory.endswith("/svc") and second.spool.directory.endswith("/svc.1")
    first.spool.close()
    second.spool.close()


# -- the files in it ---------------------------------------------------------------------------
def test_files_the_user_did_not_write_are_never_replayed(tmp_path: Path, caplog: Any) -> None:
    d = tmp_path / "spool"
    d.mkdir(mode=0o700)
    foreign = d / "000000000001.spool"  # another user's file, with perfectly valid records
    spooled_file(foreign, [segment("planted-1")])
    os.chown(foreign, NOBODY, NOBODY)
    readable = d / "000000000002.spool"  # ours, but others could have written it (0666)
    spooled_file(readable, [segment("planted-2")])
    os.chmod(readable, 0o666)
    outside = tmp_path / "outside.spool"
    spooled_file(outside, [segment("planted-3")])
    (d / "000000000003.spool").symlink_to(outside)
    os.mkfifo(d / "000000000004.spool")  # a reader would block on it forever
    ours = d / "000000000005.spool"
    spooled_file(ours, [segment("ours")])
    with caplog.at_level(logging.WARNING, "swmp.reporter"):
        s = Spool(str(d), 1 << 20)
    assert s.foreign_files == 4
    assert "skipped 4 files" in caplog.text
    assert [f.path for f in s.files] == [str(ours)]
    f = s.oldest()
    assert f is not None
    items, _ = s.read(f, 100)
    assert [trace_of(p) for _, p in items] == ["ours"]
    # A new file never reuses a planted name, never follows a link, never truncates.
    s.append([(R.SEGMENT, segment("new"))])
    assert outside.read_bytes().startswith(MAGIC) and b"new" not in outside.read_bytes()
    names = sorted(p.name for p in d.glob("*.spool"))
    assert names[-1] == "000000000006.spool"
    st = os.lstat(d / names[-1])
    assert (st.st_mode & 0o777) == 0o600 and st.st_uid == os.geteuid()
    s.close()


def trace_of(payload: bytes) -> str:
    return str(orjson.loads(payload)[R.SEG_TRACE_ID])


def test_a_planted_link_at_the_next_file_name_is_not_followed(tmp_path: Path) -> None:
    d = tmp_path / "spool"
    d.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (d / "000000000001.spool").symlink_to(victim)
    s = Spool(str(d), 1 << 20)
    s.append([(R.SEGMENT, segment("x"))])
    assert victim.read_bytes() == b"precious"
    assert (d / "000000000002.spool").is_file()
    s.close()


# -- a full disk -------------------------------------------------------------------------------
@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tiny"
    mnt.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_is_counted_and_logged_once_and_never_raises(tiny_disk: Path, caplog: Any) -> None:
    j = journal(spool_dir=str(tiny_disk), spool_max_bytes=64 << 20, spool_segment_bytes=64 << 10)
    w = SpoolWriter.open(j)
    assert w is not None
    payload = segment("p", spans=20)
    batch = [(R.SEGMENT, payload)] * 20
    with caplog.at_level(logging.ERROR, "swmp.reporter"):
        for _ in range(200):  # far more than 256 KiB
            w.write(batch)
    assert w.write_drops > 0
    assert caplog.text.count("cannot write to the spool") == 1
    kept = w.spool.total_records
    assert kept > 0 and j.counters.spooled == kept
    # Everything kept is readable: a failed write never leaves a torn record mid-file.
    got = 0
    while (f := w.spool.oldest()) is not None:
        items, end = w.spool.read(f, 10_000)
        assert all(p == payload for _, p in items)
        got += len(items)
        w.spool.ack(f, end, len(items))
    assert got == kept
    # Room again (replay freed it): writes succeed again.
    drops = w.write_drops
    w.write(batch)
    assert w.write_drops == drops and w.spool.total_records == 20
    w.spool.close()


def test_the_reporter_keeps_running_on_a_full_disk(tiny_disk: Path, tmp_path: Path) -> None:
    arena = Arena.create(str(tmp_path / "t.arena"), slots=2, ring_capacity=64 * 1024)
    sender = MemorySender(fail_next=10**9)  # the backend is down for the whole test
    s = ReporterSettings(
        service="svc",
        spool_dir=str(tiny_disk),
        spool_segment_bytes=16 << 10,
        max_pending_bytes=32 << 10,  # memory fills quickly: the spool takes the rest
        flush_interval_s=0.02,
        poll_interval_s=0.02,
        status_interval_s=0.05,
        retry_backoff_base_s=0.01,
        retry_backoff_max_s=0.02,
        retry_max_attempts=2,
        shutdown_deadline_s=2.0,
    )
    handle = ReporterThread(arena.path, s, arena=arena, sender=sender)
    handle.start()
    try:
        for i in range(6):
            write_all(arena.path, [(R.SEGMENT, segment(f"d{i}-{k}", spans=10)) for k in range(150)])
        doc = wait_for(
            lambda: (d := status_doc(arena)).get("dropped", {}).get("spool", 0) > 0 and d, 30, "spool drops"
        )
        assert doc["spool"]["enabled"] and doc["spool"]["spooled"] > 0
        reporter = handle.reporter
        assert reporter is not None and not reporter.finished  # still running
    finally:
        assert handle.stop(10)
        with contextlib.suppress(Exception):
            arena.close()
