"""A second local user for tests that play another user on the same machine (an attacker).

The suite runs as root, so it can create a real system user for the session and run
commands as that user; without root the tests that need one are skipped. Use::

    from tests.other_user import OtherUser, other_user, shared_dir  # noqa: F401  (fixtures)

    def test_x(other_user: OtherUser, shared_dir: Path) -> None:
        other_user.sh(f"mkdir {shared_dir}/mine")      # as the other user, /bin/sh

``shared_dir`` is a directory every user may create files in, with the sticky bit, like
``/dev/shm`` and ``/tmp``: the place where one user can plant files for another.
The user is removed at the end of the session if this module created it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import SETPRIV

NAME = "swmpother"


@dataclass(frozen=True)
class OtherUser:
    name: str
    uid: int
    gid: int

    def _as_user(self, argv: list[str]) -> dict[str, Any]:
        """``argv`` as this user, no supplementary groups, a minimal environment, in ``/``.

        ``setpriv`` changes the user after ``exec``, not ``subprocess`` (``user=``, ``group=``)
        in a forked copy of this process: such a fork runs the at-fork handlers of every
        library loaded here, and gRPC's (the test collector is a gRPC server) restarts its
        threads in the child, which under load died of SIGSEGV or SIGBUS before it became the
        shell. Without them ``subprocess`` starts the child with ``vfork``, which runs none.
        """
        ids = ["--reuid", str(self.uid), "--regid", str(self.gid), "--clear-groups"]
        return {
            "args": [SETPRIV, *ids, "--", *argv],
            "env": {"PATH": "/usr/bin:/bin", "HOME": "/"},
            "cwd": "/",
        }

    def sh(self, script: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run ``script`` with ``/bin/sh`` as this user (no supplementary groups, minimal env).

        The script goes through a file, which is what a shell reads best."""
        with tempfile.NamedTemporaryFile("w", prefix="swmp-other-", suffix=".sh") as f:
            f.write(script)
            f.flush()
            os.chmod(f.name, 0o644)  # readable by the other user; the directory is /tmp
            return subprocess.run(
                **self._as_user(["/bin/sh", f.name]),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=check,
            )

    def popen(self, script: str) -> subprocess.Popen[bytes]:
        """Start ``script`` as this user in the background (its own session: stop by pid)."""
        return subprocess.Popen(
            **self._as_user(["/bin/sh", "-c", script]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )


@pytest.fixture(scope="session")
def other_user() -> Iterator[OtherUser]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second local user")
    created = False
    try:
        entry = pwd.getpwnam(NAME)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", NAME],
            check=True,
            capture_output=True,
            timeout=60,
        )
        created = True
        entry = pwd.getpwnam(NAME)
    try:
        yield OtherUser(NAME, entry.pw_uid, entry.pw_gid)
    finally:
        if created:
            subprocess.run(["userdel", NAME], check=False, capture_output=True, timeout=60)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A fresh world-writable sticky directory (mode 1777), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="swmp-shared-", dir="/tmp"))
    try:
        os.chmod(path, 0o1777)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
