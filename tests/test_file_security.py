"""Another local user cannot plant files that disable, confuse or misuse the agent (issue 16).

The arena directory (``/dev/shm`` by default) is shared by every local user, and the names
in it are predictable from ``/proc``. A second real user (``tests.other_user``) plays the
attacker: it plants, before the application starts the agent, what it can at every name it
can predict, as the old layout (the arena directory itself) and the new one (the per-user
private directory, which it creates first). The application must still deliver its traces,
say what it refused, and the attacker must gain nothing: no data, no wake-up, no file of
ours written through its link.
"""

from __future__ import annotations

import functools
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from ipc import Arena, DoorbellListener, arena_path, cleanup_stale, discover, process_start_ticks
from ipc.private import UnsafePathError, private_directory
from ipc.wakeup import fifo_path
from tests import other_user as users
from tests.collector import Collector
from tests.other_user import OtherUser

REPO = Path(__file__).resolve().parent.parent
other_user = users.other_user  # fixtures
shared_dir = users.shared_dir
SPANS = 5

# Prints its pid, waits for the attacker to plant its files, then starts the agent. With
# LONE_UWSGI_WORKER it says it is a uWSGI worker without a master (the agent then starts in
# the worker, as under lazy-apps: no stale-arena clean-up runs first, the reporter detaches).
PROGRAM = textwrap.dedent(
    f"""
    import os, sys, types
    if os.environ.get("LONE_UWSGI_WORKER"):
        uwsgi = sys.modules["uwsgi"] = types.ModuleType("uwsgi")
        uwsgi.masterpid = lambda: 0
        uwsgi.worker_id = lambda: 1
    print(os.getpid(), flush=True)
    sys.stdin.readline()
    import swmp
    swmp.start()
    for i in range({SPANS}):
        with swmp.entry_span(f"/job/{{i}}"):
            pass
    """
)


HOLD_SLOT = textwrap.dedent(
    """
    import os, sys
    from ipc import Arena
    arena = Arena.open(sys.argv[1])
    assert arena.claim_slot() is not None
    print(os.getpid(), flush=True)
    sys.stdin.read()
    """
)


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector(enable_http=False) as c:
        yield c


def env_for(shared: Path, collector: Collector) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SW_", "SWMP_", "UWSGI_"))}
    env.update(
        {
            "SW_AGENT_NAME": "victim",
            "SW_AGENT_INSTANCE_NAME": "victim",
            "SW_AGENT_COLLECTOR_BACKEND_SERVICES": collector.grpc_address,
            "SW_AGENT_ARENA_DIR": str(shared),
            "SW_AGENT_REPORTER_FLUSH_INTERVAL": "0.05",
            "SW_AGENT_LOG_REPORTER_ACTIVE": "false",
            "SW_AGENT_METER_REPORTER_ACTIVE": "false",
            "SW_AGENT_PROFILE_ACTIVE": "false",
            "PYTHONPATH": str(REPO),
        }
    )
    return env


def predicted_arenas(shared: Path, pid: int) -> list[str]:
    """What the attacker computes from ``/proc/<pid>/stat`` (world-readable): the arena name
    at the top of the directory and inside the private directory it pre-creates."""
    me = os.getuid()
    name = f"swmp-{me}-{pid}-{process_start_ticks(pid)}.arena"
    return [str(shared / name), str(shared / f"swmp-{me}" / name)]


def run_victim(
    shared: Path,
    collector: Collector,
    plant: str,
    attacker: OtherUser,
    after_plant: Callable[[list[str]], None] | None = None,
    **extra_env: str,
) -> tuple[str, list[str]]:
    """Start the program, let ``attacker`` run ``plant`` (``{0}``/``{1}``: the predicted arena
    paths), then let the program run; returns its stderr and the predicted paths."""
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM],
        env={**env_for(shared, collector), **extra_env},
        cwd=str(REPO),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        pid = int(proc.stdout.readline())
        paths = predicted_arenas(shared, pid)
        attacker.sh(f"mkdir -m 777 {shared}/swmp-{os.getuid()}\n" + plant.format(*paths))
        if after_plant is not None:
            after_plant(paths)
        _, err = proc.communicate("go\n", timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    return err, paths


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def attack_and_deliver(
    shared: Path,
    collector: Collector,
    plant: str,
    attacker: OtherUser,
    after_plant: Callable[[list[str]], None] | None = None,
    **extra_env: str,
) -> list[str]:
    """:func:`run_victim`, then: every segment delivered, the attacker's private directory
    refused (said once), ours private. Returns the predicted paths."""
    err, paths = run_victim(shared, collector, plant, attacker, after_plant, **extra_env)
    collector.wait_for(lambda: len(collector.segments) >= SPANS, 30)
    assert len(collector.segments) == SPANS, err
    me = os.getuid()
    assert err.count(f"refusing the private directory {shared}/swmp-{me} ") == 1
    ours = [p for p in shared.glob(f"swmp-{me}.*")]
    assert len(ours) == 1
    st = os.lstat(ours[0])
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == me and stat.S_IMODE(st.st_mode) == 0o700
    return paths


@pytest.mark.parametrize("reporter_process", ["true", "false"], ids=["process", "thread"])
def test_pre_created_arena_and_private_directory(
    shared_dir: Path, collector: Collector, other_user: OtherUser, reporter_process: str
) -> None:
    # Their own "arena" at both names: on the old layout the agent refused it and ran disabled.
    plant = "head -c 65536 /dev/zero > {0}\nhead -c 65536 /dev/zero > {1}\nchmod 666 {0} {1}\n"
    paths = attack_and_deliver(
        shared_dir, collector, plant, other_user, SW_AGENT_REPORTER_PROCESS=reporter_process
    )
    for planted in paths:  # untouched: never opened, never unlinked
        st = os.lstat(planted)
        assert st.st_uid == other_user.uid and st.st_size == 65536
        assert Path(planted).read_bytes() == bytes(65536)


def test_regular_file_planted_at_the_doorbell(
    shared_dir: Path, collector: Collector, other_user: OtherUser
) -> None:
    # On the old layout the reporter died on it in a loop and delivered nothing.
    plant = "for p in {0} {1}; do echo planted > $p.wake; chmod 666 $p.wake; done\n"
    paths = attack_and_deliver(shared_dir, collector, plant, other_user)
    for planted in paths:
        assert Path(fifo_path(planted)).read_text() == "planted\n"  # never written to


def test_fifo_planted_at_the_doorbell_gets_no_wake_up(
    shared_dir: Path, collector: Collector, other_user: OtherUser
) -> None:
    # The attacker waits on its FIFOs for a writer: our reporter (or a worker) opening one
    # would let it read every wake-up. Its "opened" marker must never appear.
    plant = "for p in {0} {1}; do mkfifo -m 666 $p.wake; done\n"
    readers: list[subprocess.Popen[bytes]] = []

    evidence = shared_dir / "evidence"  # the attacker's own directory: our clean-up leaves it

    def listen(paths: list[str]) -> None:
        other_user.sh(f"mkdir {evidence}")
        for i, path in enumerate(paths):
            script = f"exec 3<{fifo_path(path)}; echo opened > {evidence}/{i}; cat <&3 >/dev/null"
            readers.append(other_user.popen(script))
        for r in readers:  # each is waiting in open() for a writer before the program starts
            wait_until(lambda r=r: read_text(f"/proc/{r.pid}/wchan") == "wait_for_partner", "reader")

    try:
        # As a lone uWSGI worker: on the old layout no clean-up removed the planted FIFO first.
        paths = attack_and_deliver(
            shared_dir, collector, plant, other_user, after_plant=listen, LONE_UWSGI_WORKER="1"
        )
        assert len(paths) == 2 and not list(evidence.iterdir()), "the attacker's FIFO was opened"
    finally:
        for r in readers:
            os.killpg(r.pid, signal.SIGKILL)
            r.wait()


def test_symlinks_planted_at_arena_instances_and_temporary_names(
    shared_dir: Path, collector: Collector, other_user: OtherUser, tmp_path: Path
) -> None:
    # A file only we may write: following any of the links would clobber or read it.
    victim = tmp_path / "precious"
    victim.write_text("precious\n")
    links = "".join(
        f"ln -s {victim} {{{i}}}{suffix}\n"
        for i in (0, 1)
        for suffix in ("", ".wake", ".instances", *(f".instances.{n}.tmp" for n in range(1, 400)))
    )
    paths = attack_and_deliver(shared_dir, collector, links, other_user)
    assert victim.read_text() == "precious\n"
    for path in paths:
        assert os.path.islink(path)  # left alone, not followed, not replaced


def test_the_other_user_cannot_read_or_enter_our_files(
    shared_dir: Path, collector: Collector, other_user: OtherUser
) -> None:
    base = private_directory(str(shared_dir))
    arena = Arena.create(os.path.join(base, f"swmp-{os.getuid()}-{os.getpid()}-1.arena"), 1, 4096)
    try:
        writer = arena.claim_slot()
        assert writer is not None
        for target in (base, arena.path, fifo_path(arena.path)):
            assert other_user.sh(f"ls -l {target}; cat {target} </dev/null", check=False).returncode != 0
        listed = other_user.sh(f"ls {shared_dir}/swmp-{os.getuid()}/", check=False)
        assert listed.returncode != 0 and listed.stdout == ""
        # Not even the names: which applications run, their pids and start times.
        assert other_user.sh(f"ls -a {shared_dir}").stdout.split() == [".", "..", f"swmp-{os.getuid()}"]
    finally:
        arena.close()
        arena.unlink()


# -- the same checks where the private directory cannot help: files opened by path ---------


def test_a_doorbell_planted_beside_an_arena_is_refused_not_used(
    shared_dir: Path, other_user: OtherUser
) -> None:
    """An arena created straight in a shared directory (not the private one): a regular file
    or another user's FIFO at its doorbell is refused by both the reader and the writers."""
    for kind, plant in (("file", "echo planted > {0}; chmod 666 {0}"), ("fifo", "mkfifo -m 666 {0}")):
        path = str(shared_dir / f"planted-{kind}.arena")
        other_user.sh(plant.format(fifo_path(path)))
        # The attacker keeps a read end open, so a writer's open would succeed (no ENXIO).
        reader = other_user.popen(f"exec 3<>{fifo_path(path)}; exec sleep 60") if kind == "fifo" else None
        if reader is not None:
            wait_until(functools.partial(os.path.exists, f"/proc/{reader.pid}/fd/3"), "the FIFO held open")
        arena = Arena.create(path, 1, 4096)
        try:
            with pytest.raises(UnsafePathError, match=r"not a fifo file|belongs to uid"):
                DoorbellListener(path)
            ring = arena._doorbell
            ring()
            assert ring.refused == 1 and ring.rings == 0
            if kind == "file":
                assert Path(fifo_path(path)).read_text() == "planted\n"
        finally:
            if reader is not None:
                os.killpg(reader.pid, signal.SIGKILL)
                reader.wait()
            arena.close()
            os.unlink(path)


def test_instance_table_planted_or_linked_is_never_trusted_nor_written_through(
    shared_dir: Path, other_user: OtherUser, tmp_path: Path
) -> None:
    from reporter_proc.instances import Instances
    from reporter_proc.journal import Journal
    from reporter_proc.lifecycle import StopState
    from reporter_proc.senders.memory import MemorySender
    from reporter_proc.settings import ReporterSettings

    victim = tmp_path / "precious"
    victim.write_text("precious\n")
    path = str(shared_dir / "table.arena")
    arena = Arena.create(path, 1, 4096)
    # A live worker holds slot 0, so a forged table naming it would be believed.
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_SLOT, path],
        cwd=str(REPO),
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        worker = int(holder.stdout.readline())
        forged = orjson.dumps([[worker, 0, "forged", "forged", [], "", ""]]).decode()
        # The old temporary name was "<table>.<reporter pid>.tmp": links for the pids to come.
        pids = " ".join(str(n) for n in range(os.getpid(), os.getpid() + 50))
        other_user.sh(
            f"echo '{forged}' > {path}.instances; chmod 666 {path}.instances\n"
            f"for n in {pids}; do ln -s {victim} {path}.instances.$n.tmp; done"
        )
        journal = Journal(ReporterSettings())
        table = Instances(
            arena, journal, MemorySender(), StopState(), own_process_slots=False, backoff=lambda n: 1.0
        )
        assert table.live_slots() == {0: worker}
        table.restore()
        assert table.table == {}  # the planted table is not ours: ignored
        table.save()
        assert victim.read_text() == "precious\n"
        st = os.lstat(path + ".instances")
        assert stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o600
        assert orjson.loads(Path(path + ".instances").read_bytes()) == []
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(timeout=30)
        arena.close()
        arena.unlink()


def test_a_private_directory_planted_as_a_link_is_refused_and_discovery_follows_us(
    shared_dir: Path, other_user: OtherUser
) -> None:
    me = os.getuid()
    theirs = shared_dir / "theirs"
    other_user.sh(f"mkdir -m 777 {theirs} && ln -s {theirs} {shared_dir}/swmp-{me}")
    path = arena_path(os.getpid(), str(shared_dir))
    home = os.path.dirname(path)
    assert home.startswith(f"{shared_dir}/swmp-{me}.") and os.lstat(home).st_uid == me
    gone = Arena.create(os.path.join(home, f"swmp-{me}-999999999-1.arena"), 1, 4096, owner_pid=999999999)
    gone.close()
    arena = Arena.create(path, 1, 4096)
    try:
        assert sorted(discover(str(shared_dir))) == sorted([path, gone.path])
        assert cleanup_stale(str(shared_dir), min_age_s=0) == [gone.path]  # clean-up looks there too
        assert arena_path(os.getpid(), str(shared_dir)) == path  # every process settles on it
        status = subprocess.run(
            [sys.executable, "-m", "swmp.cli", "status", "--json", "--dir", str(shared_dir)],
            cwd=str(REPO),
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,  # 1 or 2: no reporter serves the arena; the document is still printed
        )
        doc = orjson.loads(status.stdout)
        assert [a["arena"] for a in doc["agents"]] == [path]  # swmp status finds it there
        assert f"{shared_dir}/swmp-{me} is refused (it is a symbolic link)" in " ".join(doc["notes"])
        assert list(theirs.iterdir()) == []  # nothing of ours went through their link
    finally:
        arena.close()
        arena.unlink()


def test_a_loose_private_directory_of_ours_is_not_used(shared_dir: Path) -> None:
    loose = shared_dir / f"swmp-{os.getuid()}"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)  # group and others may enter: someone may have read or put things there
    home = private_directory(str(shared_dir))
    assert home != str(loose) and stat.S_IMODE(os.lstat(home).st_mode) == 0o700


def test_an_arena_directory_anyone_may_rename_in_is_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)  # no sticky bit: anyone could swap our private directory
    with pytest.raises(UnsafePathError, match="sticky bit"):
        arena_path(os.getpid(), str(open_dir))
    os.chmod(open_dir, 0o1777)
    assert os.path.dirname(arena_path(os.getpid(), str(open_dir))) == f"{open_dir}/swmp-{os.getuid()}"


@pytest.mark.servers
@pytest.mark.timeout(180)
def test_uwsgi_lazy_apps_workers_agree_on_one_fallback_directory(
    shared_dir: Path, other_user: OtherUser, tmp_path: Path
) -> None:
    """uWSGI lazy-apps: every worker imports the application and starts the agent at once.
    With the private directory taken, they must still find one arena and one reporter."""
    from tests.collector import free_port
    from tests.servers import (
        agent_env,
        check_announced,
        collector_process,
        load,
        quiet_for,
        run_server,
        segments_of,
        uwsgi_command,
        wait_segments,
        wait_until,
    )

    me = os.getuid()
    other_user.sh(f"mkdir -m 777 {shared_dir}/swmp-{me}")
    with collector_process(tmp_path) as col:
        port = free_port()
        env = agent_env(tmp_path, col.grpc_address, service="u")
        env["SW_AGENT_ARENA_DIR"] = str(shared_dir)
        cmd = uwsgi_command(port, module="examples.started_app:app", workers=4, lazy_apps=True)
        with run_server("uwsgi", tmp_path, cmd, env, port=port, workers=4, swmp_run=False) as srv:
            results = load(port, ["/cpu", "/io"], 200, concurrency=8)
            assert all(r.status == 200 for r in results)
            wait_segments(col, 200, "u")
            quiet_for(col, 0.5)
            assert len(segments_of(col, "u")) == 200
            check_announced(col, srv, "u")
            assert len(srv.reporters()) == 1
            homes = {os.path.dirname(p) for p in srv.arena_files()}
            assert len(homes) == 1 and homes.pop().startswith(f"{shared_dir}/swmp-{me}.")
            assert list((shared_dir / f"swmp-{me}").iterdir()) == []
        wait_until(lambda: not srv.reporters(), 20, "the reporter to leave with the master")
        wait_until(lambda: not srv.arena_files(), 20, "the arena to be removed")


def test_processes_that_fall_back_at_once_share_one_directory(
    shared_dir: Path, other_user: OtherUser
) -> None:
    """Eight processes released together (as lazy-apps workers are) all pick the same fallback."""
    other_user.sh(f"mkdir -m 777 {shared_dir}/swmp-{os.getuid()}")
    script = textwrap.dedent(
        """
        import sys, time
        from ipc.private import private_directory
        start = float(sys.argv[2])
        time.sleep(max(0.0, start - time.time() - 0.05))
        while time.time() < start:  # the last moment spinning, to be released together
            pass
        print(private_directory(sys.argv[1]))
        """
    )
    start = str(time.time() + 2.0)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(shared_dir), start], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(8)
    ]
    chosen = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(chosen) == 1 and chosen.pop().startswith(f"{shared_dir}/swmp-{os.getuid()}.")
    assert len(list(shared_dir.glob(f"swmp-{os.getuid()}.*"))) == 1


def test_the_memory_senders_output_file_is_never_written_through_a_link(tmp_path: Path) -> None:
    import asyncio

    from reporter_proc.senders.memory import MemorySender

    target = tmp_path / "victim"
    target.write_text("")
    link = tmp_path / "calls.jsonl"
    link.symlink_to(target)
    with pytest.raises(OSError):
        asyncio.run(MemorySender(path=str(link)).start())
    assert target.read_text() == ""
