"""Exec entry: ``python -m reporter_proc --arena PATH [--owner-pid PID] [--settings-file FILE]``.

For launchers that prefer exec to fork (a clean interpreter without the application's
modules). Runs the supervisor in this process (``--no-supervise``: the reporter itself);
the exit status follows the reporter's rules (0, or 70 and up).
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
import sys

from ipc import Arena, ArenaError
from reporter_proc.plumbing import reset_signals
from reporter_proc.process import run_reporter_process, run_supervisor, settings_from_json
from reporter_proc.senders.tls import has_secret
from reporter_proc.settings import ReporterSettings

_MAX_SETTINGS_BYTES = 1 << 20  # a settings object is a few KiB


def settings_from_file(path: str) -> ReporterSettings:
    """The settings in the file ``path``; ValueError when it is not one to trust.

    A regular file (a FIFO would hold the start forever, a device never end), neither
    another user's (root's is fine: mounted secrets) nor writable by every user: whoever
    can write it chooses where the data and the token go. One that holds a secret and is
    readable by others is used, with a warning (a Kubernetes secret is 0644 by default).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if st.st_uid not in (0, os.geteuid()):
            raise ValueError(f"{path} belongs to uid {st.st_uid}, not to root or to this user")
        if st.st_mode & stat.S_IWOTH:
            raise ValueError(f"{path} is writable by every user (mode {stat.S_IMODE(st.st_mode):04o})")
        data = f.read(_MAX_SETTINGS_BYTES + 1)
    if len(data) > _MAX_SETTINGS_BYTES:
        raise ValueError(f"{path} is larger than {_MAX_SETTINGS_BYTES} bytes")
    settings = settings_from_json(data)
    if has_secret(settings) and st.st_mode & 0o044:
        logging.getLogger("swmp.reporter").warning(
            "%s holds a secret and other users may read it (mode %04o): make it 0600",
            path,
            stat.S_IMODE(st.st_mode),
        )
    return settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reporter_proc", description=__doc__)
    parser.add_argument("--arena", required=True, help="path of the arena file to drain")
    parser.add_argument("--owner-pid", type=int, default=0, help="default: the owner recorded in the arena")
    parser.add_argument("--settings", default="", help="settings JSON (no secrets: use --settings-file)")
    parser.add_argument("--settings-file", default="", help="file holding that JSON object")
    parser.add_argument(
        "--settings-stdin", action="store_true", help="read that JSON object from standard input"
    )
    parser.add_argument("--no-supervise", action="store_true", help="run the reporter without a supervisor")
    parser.add_argument(
        "--adopt", type=int, default=0, help="supervise this running reporter first (replacement supervisor)"
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"
    )
    reset_signals()
    try:
        if args.settings_stdin:
            settings = settings_from_json(sys.stdin.buffer.read())
        elif args.settings_file:
            settings = settings_from_file(args.settings_file)
        elif args.settings:
            settings = settings_from_json(args.settings)
            if has_secret(settings):
                # Anyone on the host can read a command line (ps, /proc/PID/cmdline).
                print(
                    "bad reporter settings: --settings holds a secret (authentication token or Kafka "
                    "password), which every local user could read in the command line; "
                    "use --settings-file with a 0600 file",
                    file=sys.stderr,
                )
                return 78
        else:
            settings = ReporterSettings()
    except (OSError, ValueError, TypeError) as exc:
        print(f"bad reporter settings: {exc}", file=sys.stderr)
        return 78
    owner = args.owner_pid
    if owner <= 0:
        try:
            with Arena.open(args.arena) as arena:
                owner = arena.info().owner_pid
        except (OSError, ArenaError) as exc:
            print(f"cannot open {args.arena}: {exc}", file=sys.stderr)
            return 70
    if args.no_supervise:
        return run_reporter_process(args.arena, settings, owner)
    return run_supervisor(args.arena, settings, owner, adopt=args.adopt)


if __name__ == "__main__":
    sys.exit(main())
