"""The other user's commands start in a process whose libraries cannot survive a fork.

The suite's gRPC collector (``tests.collector``) runs in the test process, and gRPC restarts
its event-engine threads in a forked child (a ``pthread_atfork`` handler). A child forked to
change user before ``exec`` then ran those threads, and under load one of them aborted and
took the child down (SIGSEGV, SIGBUS) before it became the other user's shell: the attacker's
FIFO reader in tests/test_file_security.py never started. Here an at-fork handler that
always aborts stands for gRPC's, so a command that forks the test process fails every time,
not once in a while under load.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests import other_user as users
from tests.other_user import OtherUser

REPO = Path(__file__).resolve().parent.parent
other_user = users.other_user  # fixture

CHILD = textwrap.dedent(
    """
    import ctypes, os, signal, sys, time
    from tests.other_user import OtherUser
    # Every fork() from now on runs abort() in the child; vfork/posix_spawn run no handler.
    libc = ctypes.CDLL(None)
    libc.__register_atfork(None, None, ctypes.cast(libc.abort, ctypes.c_void_p), None)
    user = OtherUser(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    print(user.sh("id -u; id -G").stdout.split())
    reader = user.popen("exec sleep 60")
    try:
        deadline = time.monotonic() + 30
        while open(f"/proc/{reader.pid}/comm").read() != "sleep\\n" and time.monotonic() < deadline:
            time.sleep(0.01)
        print(open(f"/proc/{reader.pid}/status").read().count(f"Uid:\\t{user.uid}\\t"))
    finally:
        os.killpg(reader.pid, signal.SIGKILL)
        print(reader.wait())
    """
)


def test_commands_start_without_forking_the_test_process(other_user: OtherUser) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, other_user.name, str(other_user.uid), str(other_user.gid)],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    uid, gid = str(other_user.uid), str(other_user.gid)
    # As that user, with only its own group; the background command too (killed by us).
    assert out.stdout.splitlines() == [repr([uid, gid]), "1", "-9"]
