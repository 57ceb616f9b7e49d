"""More of what the agent and its tools create on disk: private whatever the umask, bad input
refused and said, never a crash (issue 16's review, continued in tests/test_file_security.py
and tests/test_spool_security.py)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ipc import Arena, arena_path, cleanup_stale, process_start_ticks
from ipc.private import UnsafePathError, make_directories
from reporter_proc import spooldir
from reporter_proc.instances import Instances
from reporter_proc.journal import Journal
from reporter_proc.lifecycle import StopState
from reporter_proc.protocol.generated import tracing_pb2, tracing_pb2_grpc
from reporter_proc.senders.memory import MemorySender
from reporter_proc.settings import ReporterSettings
from reporter_proc.spool import MAGIC, Spool
from reporter_proc.spooldir import SpoolUnsafe
from reporter_proc.spooling import SpoolWriter
from swmp.collector.options import default_path
from swmp.collector.store import Store
from tests import other_user as users
from tests.collector import Collector
from tests.localcollector import local_collector
from tests.other_user import OtherUser

REPO = Path(__file__).resolve().parent.parent
SPANS = 3
other_user = users.other_user  # fixtures
shared_dir = users.shared_dir

UMASK_0_APP = textwrap.dedent(
    f"""
    import os
    os.umask(0)
    import swmp
    swmp.start()
    for i in range({SPANS}):
        with swmp.entry_span(f"/job/{{i}}"):
            pass
    """
)


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector(enable_http=False) as c:
        yield c


def modes_below(top: Path, leaf: Path) -> dict[str, int]:
    """The permission bits of every directory from ``top`` (excluded) down to ``leaf``."""
    out = {}
    p = leaf
    while p != top:
        out[str(p)] = stat.S_IMODE(os.lstat(p).st_mode)
        p = p.parent
    return out


def test_arena_directories_the_agent_creates_are_private_under_umask_000(
    tmp_path: Path, collector: Collector
) -> None:
    """``SW_AGENT_ARENA_DIR`` that does not exist yet, in an application run with umask 000:
    the agent made it (and its parents) 0777, then refused it as writable by every user and
    ran disabled ("the agent could not start"). Each directory it makes is 0700 now."""
    arena_dir = tmp_path / "run" / "swmp-arenas"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SW_", "SWMP_", "UWSGI_"))}
    env.update(
        {
            "SW_AGENT_NAME": "umask0",
            "SW_AGENT_COLLECTOR_BACKEND_SERVICES": collector.grpc_address,
            "SW_AGENT_ARENA_DIR": str(arena_dir),
            "SW_AGENT_SPOOL_DIR": "off",
            "SW_AGENT_REPORTER_FLUSH_INTERVAL": "0.05",
            "SW_AGENT_LOG_REPORTER_ACTIVE": "false",
            "SW_AGENT_METER_REPORTER_ACTIVE": "false",
            "SW_AGENT_PROFILE_ACTIVE": "false",
            "PYTHONPATH": str(REPO),
        }
    )
    out = subprocess.run(
        [sys.executable, "-c", UMASK_0_APP], check=False, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "could not start" not in out.stderr, out.stderr
    assert collector.wait_for(lambda: len(collector.segments) >= SPANS, 30), out.stderr
    assert modes_below(tmp_path, arena_dir) == {str(arena_dir): 0o700, str(arena_dir.parent): 0o700}


def test_collector_data_directories_are_private_under_umask_000(tmp_path: Path) -> None:
    """``swmp collector`` with its default ``~/.local/share/swmp/collector.db`` in a fresh home
    under umask 000 made ``~/.local`` and ``~/.local/share`` 0777: any local user could then
    rename and replace them (and ``~/.local/bin``, in many a PATH, with them)."""
    db = tmp_path / ".local" / "share" / "swmp" / "collector.db"
    old = os.umask(0)
    try:
        Store(db).close()
    finally:
        os.umask(old)
    assert modes_below(tmp_path, db.parent) == {
        str(tmp_path / ".local"): 0o700,
        str(tmp_path / ".local" / "share"): 0o700,
        str(db.parent): 0o700,
    }
    assert stat.S_IMODE(os.lstat(db).st_mode) == 0o600


def test_a_zero_filled_spool_tail_is_no_records_and_is_said(tmp_path: Path, caplog: Any) -> None:
    """A crash can leave a file's new size on disk without its data: a tail of zeros. Every
    12 zero bytes passed as a record (length 0, and the crc of nothing is 0), so 64 KiB of
    them replayed as 5,461 "invalid" records dropped, records that never existed."""
    s = Spool(str(tmp_path), max_bytes=1 << 24)
    s.append([(1, b"[1,2,3]")] * 5)
    path = s.files[-1].path
    s.close()
    os.truncate(path, os.path.getsize(path) + 65536)
    caplog.set_level(logging.WARNING, logger="swmp.reporter")
    s = Spool(str(tmp_path), max_bytes=1 << 24)
    try:
        assert s.total_records == 5 and s.torn_tails == 1
        assert [m for m in caplog.messages if "65536 bytes after its last whole record" in m], caplog.messages
    finally:
        s.close()


def test_a_damaged_spool_file_is_said_and_one_with_nothing_readable_removed(
    tmp_path: Path, caplog: Any
) -> None:
    """A record damaged mid-file ends the file's valid part there: what follows was ignored
    without a word. A file whose first bytes are damaged held nothing readable: it was
    removed without a word."""
    s = Spool(str(tmp_path), max_bytes=1 << 24, segment_bytes=4096)
    s.append([(1, b"[1,2,3]")] * 5)
    first = s.files[-1].path
    s.seal()
    s.append([(1, b"[4,5,6]")] * 5)
    second = s.files[-1].path
    s.close()
    with open(first, "r+b") as f:
        f.seek(len(MAGIC) + 2 * (12 + 7) + 12)  # the third record's payload
        f.write(b"X")
    with open(second, "r+b") as f:
        f.write(b"garbage!")  # the magic word
    caplog.set_level(logging.WARNING, logger="swmp.reporter")
    s = Spool(str(tmp_path), max_bytes=1 << 24)
    try:
        assert s.total_records == 2 and s.torn_tails == 2
        assert not os.path.exists(second)
        said = "\n".join(caplog.messages)
        assert f"{first}: {3 * (12 + 7)} bytes after its last whole record" in said, said
        assert f"{second}: " in said and "is removed" in said, said
    finally:
        s.close()


def test_a_broken_stale_arena_whose_pid_was_reused_is_removed(tmp_path: Path) -> None:
    """An application killed while it created its arena (before the header was complete)
    leaves a file no one can open as an arena. Clean-up removed it only when no process has
    its pid; once the pid was reused (soon, in a container) it stayed until a reboot. Its name
    carries the owner's start time, which tells the new process from the dead one."""
    live = os.getpid()
    ticks = process_start_ticks(live)
    private = Path(arena_path(live, str(tmp_path))).parent
    dead = private / f"swmp-{os.getuid()}-{live}-{ticks + 1}.arena"  # same pid, another process
    ours = private / f"swmp-{os.getuid()}-{live}-{ticks}.arena"  # same pid and start: alive
    for p in (dead, ours):
        fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.ftruncate(fd, 1 << 16)
        os.close(fd)
        os.utime(p, (1.0, 1.0))  # older than any creator could still be working on it
    assert cleanup_stale(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and ours.exists()


@pytest.mark.parametrize("content", [b"[{}]", b'[{"1": 1}, [1, 2]]'])
def test_a_damaged_instance_table_is_ignored_not_a_reporter_crash(tmp_path: Path, content: bytes) -> None:
    """The instance table beside the arena (a file of ours, 0600) holding an object where a
    list belongs: ``restore`` raised KeyError, which stopped the reporter at its start, and
    every reporter started after it, since the file stays."""
    arena = Arena.create(str(tmp_path / "k.arena"), slots=4, ring_capacity=4096)
    try:
        fd = os.open(arena.path + ".instances", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.write(fd, content)
        os.close(fd)
        table = Instances(
            arena,
            Journal(ReporterSettings()),
            MemorySender(),
            StopState(),
            own_process_slots=False,
            backoff=lambda n: 1.0,
        )
        table.restore()
        assert table.table == {}
    finally:
        arena.close()
        arena.unlink()


def test_a_link_another_user_plants_on_the_way_to_the_spool_is_refused(
    other_user: OtherUser, shared_dir: Path, tmp_path: Path, caplog: Any
) -> None:
    """The default spool of a user without a usable home is ``/var/tmp/swmp-<uid>/spool``:
    another user who creates ``swmp-<uid>`` first as a link to a directory of ours (one a web
    server of ours serves, say) chose where our telemetry went. Only where links lead was
    checked (owned by root or us, not writable by others: all true of that directory)."""
    ours = tmp_path / "www"
    ours.mkdir(mode=0o755)
    other_user.sh(f"ln -s {ours} {shared_dir}/swmp-{os.getuid()}")
    base = shared_dir / f"swmp-{os.getuid()}" / "spool"
    with pytest.raises(SpoolUnsafe, match=f"swmp-{os.getuid()} is a symbolic link of uid {other_user.uid}"):
        Spool(str(base / "svc"), 1 << 20)
    with caplog.at_level(logging.ERROR, "swmp.reporter"):
        assert SpoolWriter.open(Journal(ReporterSettings(service="svc", spool_dir=str(base)))) is None
    assert "spool disabled, its directory is not private" in caplog.text
    assert list(ours.iterdir()) == []


def test_links_of_our_own_or_roots_on_the_way_are_followed(tmp_path: Path) -> None:
    """A spool directory reached through links of our own (or root's: ``/var/run`` and the
    like) is used as before, relative, absolute or through ``..``."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "abs").symlink_to(real)
    (tmp_path / "rel").symlink_to("real/../real")
    for link in ("abs", "rel"):
        s = Spool(str(tmp_path / link / "spool" / link), 1 << 20)
        s.append([(1, b"[1]")])
        s.close()
    assert sorted(p.name for p in (real / "spool").iterdir()) == ["abs", "rel"]


def test_a_link_another_user_plants_at_the_arena_directory_is_refused(
    other_user: OtherUser, shared_dir: Path, tmp_path: Path
) -> None:
    """``SW_AGENT_ARENA_DIR`` in a shared directory, planted first as a link by another user:
    the arenas (every worker's unsent telemetry) went into whatever directory of ours the
    link named. Deeper down, the agent created the missing directories through it."""
    ours = tmp_path / "www"
    ours.mkdir(mode=0o755)
    other_user.sh(f"ln -s {ours} {shared_dir}/arenas")
    problem = f"{shared_dir}/arenas is a symbolic link of uid {other_user.uid}"
    with pytest.raises(UnsafePathError, match=problem):
        arena_path(os.getpid(), str(shared_dir / "arenas"))
    with pytest.raises(UnsafePathError, match=problem):
        make_directories(str(shared_dir / "arenas" / "app" / "shm"))
    assert list(ours.iterdir()) == []
    (tmp_path / "mine").symlink_to(ours)  # a link of our own is ours to choose
    assert arena_path(os.getpid(), str(tmp_path / "mine")).startswith(f"{tmp_path}/mine/swmp-{os.getuid()}/")


def run_reporter_with(settings_file: Path) -> subprocess.CompletedProcess[str]:
    """``python -m reporter_proc --settings-file`` for an arena that is not there: exit 70
    says the settings were taken, 78 that they were refused."""
    return subprocess.run(
        [sys.executable, "-m", "reporter_proc", "--arena", str(settings_file.parent / "none.arena"),
         "--settings-file", str(settings_file), "--no-supervise"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip


def test_a_settings_file_anyone_could_have_written_is_refused(tmp_path: Path) -> None:
    """``--settings-file`` was read whatever it was: a FIFO held the reporter's start forever;
    a file every user may write, or another user's, was trusted, though whoever writes it
    chooses the backend the data (and the token) go to."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo, 0o600)
    loose = tmp_path / "loose.json"
    loose.write_text('{"protocol": "grpc"}')
    os.chmod(loose, 0o666)
    theirs = tmp_path / "theirs.json"
    theirs.write_text('{"protocol": "grpc"}')
    os.chown(theirs, 65534, 65534)
    for path, why in (
        (fifo, "is not a regular file"),
        (loose, "is writable by every user (mode 0666)"),
        (theirs, "belongs to uid 65534, not to root or to this user"),
    ):
        out = run_reporter_with(path)
        assert out.returncode == 78 and f"bad reporter settings: {path} {why}" in out.stderr, out.stderr


def test_a_settings_file_with_a_secret_others_may_read_is_used_with_a_warning(tmp_path: Path) -> None:
    """docs/security.md asks for a 0600 file for a secret; a 0644 one (a Kubernetes secret's
    default mode) is still used, but said."""
    settings = tmp_path / "settings.json"
    settings.write_text('{"protocol": "grpc", "authentication": "s3cret"}')
    os.chmod(settings, 0o644)
    out = run_reporter_with(settings)
    assert out.returncode == 70, out.stderr  # taken: it went on to open the arena
    assert f"{settings} holds a secret and other users may read it (mode 0644): make it 0600" in out.stderr
    assert "s3cret" not in out.stderr
    os.chmod(settings, 0o600)
    out = run_reporter_with(settings)
    assert out.returncode == 70 and "holds a secret" not in out.stderr, out.stderr


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tiny"
    mnt.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def segments_json(n: int) -> bytes:
    return json.dumps(
        [
            {"traceId": uuid.uuid4().hex, "traceSegmentId": uuid.uuid4().hex, "service": "s",
             "serviceInstance": "i", "spans": [{"spanId": 0, "parentSpanId": -1, "startTime": 1,
             "endTime": 2, "operationName": "op" * 500, "spanType": "Entry", "spanLayer": "Http"}]}
            for _ in range(n)
        ]
    ).encode()  # fmt: skip


def test_the_collector_on_a_full_disk_refuses_and_counts_and_keeps_running(tiny_disk: Path) -> None:
    """``swmp collector`` with its database on a full disk: each HTTP call that stored data
    lost its connection (the handler raised) and printed two tracebacks, a gRPC call failed
    with UNKNOWN; the error shown was "cannot rollback - no transaction is active" (SQLite
    had ended the transaction itself). Now: 507 / UNAVAILABLE (an agent sends it again
    later), counted as ``store_failed``, logged once."""
    with local_collector(tiny_disk) as col:
        codes = Counter(col.post("/v3/segments", segments_json(20))[0] for _ in range(100))
        assert codes[507] > 0 and set(codes) <= {200, 507}, codes
        span = tracing_pb2.SpanObject(spanId=0, parentSpanId=-1, operationName="op" * 5000)
        bodies = [
            tracing_pb2.SegmentObject(traceId=f"t{i}", traceSegmentId=f"s{i}", service="s", spans=[span])
            for i in range(200)
        ]
        with grpc.insecure_channel(col.grpc_address) as channel:
            stub = tracing_pb2_grpc.TraceSegmentReportServiceStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.collect(iter(bodies), timeout=30)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
            assert "database or disk is full" in (info.value.details() or "")
        stats = col.stats()
        assert stats["refused"]["store_failed"] == codes[507] + 1, stats
        log = col.log()
    assert log.count("store_failed: the database refused the write: database or disk is full") == 1, log
    assert "Traceback" not in log, log


def test_a_relative_xdg_data_home_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The XDG spec calls a relative ``$XDG_DATA_HOME`` invalid: the collector put its
    database under whatever directory it was started in (the spool already ignored one)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", "data")
    assert default_path() == tmp_path / ".local" / "share" / "swmp" / "collector.db"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "swmp" / "collector.db"


def test_spool_records_removed_or_cut_under_the_reporter_are_counted_as_dropped(
    tmp_path: Path, caplog: Any
) -> None:
    """A spool file removed (a tmp cleaner, an operator freeing room) or cut short while the
    reporter runs: its records were retired as if replayed, neither sent nor counted as
    dropped, without a word (the module promises "never silently")."""
    caplog.set_level(logging.WARNING, logger="swmp.reporter")
    s = Spool(str(tmp_path / "spool"), max_bytes=1 << 24, segment_bytes=4096)
    try:
        s.append([(1, b"[1,2,3]")] * 5)
        s.seal()
        s.append([(1, b"[4,5,6]")] * 5)
        s.seal()
        first, second = s.files
        os.unlink(first.path)
        os.truncate(second.path, len(MAGIC) + 2 * (12 + 7) + 5)  # two whole records kept
        got = []
        while (f := s.oldest()) is not None:
            out, end = s.read(f, 100)
            got += out
            s.ack(f, end, len(out))
        assert len(got) == 2 and s.dropped_records == 5 + 3 and not s.files
        said = "\n".join(caplog.messages)
        assert f"{first.path}: 5 records could not be read back ([Errno 2]" in said, said
        assert f"{second.path}: 3 records could not be read back (cut short" in said, said
    finally:
        s.close()


def test_another_users_squat_on_the_shared_spool_name_does_not_turn_the_spool_off(
    other_user: OtherUser, shared_dir: Path, tmp_path: Path, monkeypatch: Any, caplog: Any
) -> None:
    """A user without a usable home spools to ``/var/tmp/swmp-<uid>/spool``: another user who
    made ``swmp-<uid>`` first (a directory or a link of theirs) turned the spool off for good.
    Now the spool goes to this user's randomly named private directory there, as the arenas
    do; the squatted entry is never written to, and a later reporter finds the same place."""
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(shared_dir / "no-such-home"))
    monkeypatch.setattr(spooldir, "SHARED_TMP", str(shared_dir))
    squat = shared_dir / f"swmp-{os.getuid()}"
    ours = tmp_path / "www"  # a directory of ours the link leads to (one a web server serves)
    ours.mkdir(mode=0o755)
    for how in (f"mkdir -m 777 {squat}", f"ln -s {ours} {squat}"):
        other_user.sh(how)
        with caplog.at_level(logging.ERROR, "swmp.reporter"):
            first = SpoolWriter.open(Journal(ReporterSettings(service="svc", spool_dir="auto")))
        assert first is not None, caplog.text
        chosen = Path(first.spool.directory)  # <random dir>/spool/svc
        private = chosen.parent.parent
        assert private.parent == shared_dir and private.name.startswith(squat.name + "."), chosen
        st = os.lstat(private)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
        first.write([(1, b"[1]")])
        first.spool.close()
        again = SpoolWriter.open(Journal(ReporterSettings(service="svc", spool_dir="auto")))
        assert again is not None and again.spool.directory == str(chosen) and again.spool.total_records == 1
        again.spool.close()
        assert list(squat.iterdir()) == [] and list(ours.iterdir()) == []
        other_user.sh(f"rm -rf {squat}")
        shutil.rmtree(private)
