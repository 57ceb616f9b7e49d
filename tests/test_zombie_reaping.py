"""The suite reaps the orphans pytest adopts as a child subreaper (tests/zombies.py), and
leaves alone the children that ``Popen`` objects still have to wait for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Run by a pytest session of its own, with the suite's conftest as a plugin: the first test
# makes an orphan that pytest adopts and lets it exit, and an owned child that exits without
# being waited for; the second one looks at both after the first one's teardown. A lazy
# proxy lives in the session as Django's settings did in the suite (every teardown errored).
SESSION = '''
import ctypes
import os
import subprocess
import sys
import time

STATE = {}


class Proxy:
    """As Django's settings or werkzeug's LocalProxy: reading ``__class__`` makes the object
    behind it, which fails here. The reaper's scan of live objects meets it."""

    @property
    def __class__(self):
        raise RuntimeError("a lazy object that cannot be made")


PROXY = Proxy()


def state(pid):
    """(state letter, parent pid) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1])


def wait_zombie(pid):
    deadline = time.monotonic() + 30
    while state(pid) != ("Z", os.getpid()):
        assert time.monotonic() < deadline, state(pid)
        time.sleep(0.01)


def test_an_orphan_is_adopted_and_exits():
    assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    # The middle process forks a grandchild that waits for its stdin to close, says its
    # pid and exits: the grandchild is re-parented to pytest.
    middle = subprocess.Popen(
        [sys.executable, "-c",
         "import os, sys\\n"
         "pid = os.fork()\\n"
         "if pid == 0:\\n"
         "    os.read(0, 1)\\n"
         "    os._exit(0)\\n"
         "print(pid, flush=True)\\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    orphan = int(middle.stdout.readline())
    assert middle.wait() == 0
    middle.stdin.close()  # the grandchild reads EOF and exits
    wait_zombie(orphan)
    owned = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    wait_zombie(owned.pid)
    STATE.update(orphan=orphan, owned=owned)


def test_after_the_teardown_the_orphan_is_reaped_and_the_owned_child_is_not():
    orphan, owned = STATE["orphan"], STATE["owned"]
    gone = state(orphan)
    assert gone is None or gone[1] != os.getpid(), gone  # no longer a child of pytest
    assert state(owned.pid) == ("Z", os.getpid())
    assert owned.wait() == 7  # its real exit status: nobody else waited for it
'''


def test_pytest_reaps_the_orphans_it_adopts_and_not_the_children_it_owns(tmp_path: Path) -> None:
    test_file = tmp_path / "test_adopted.py"
    test_file.write_text(SESSION)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "-c",
            str(tmp_path / "pytest.ini"),
            "-q",
            str(test_file),
        ],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout, proc.stdout
    assert "error" not in proc.stdout, proc.stdout
