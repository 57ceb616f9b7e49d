"""Exec entry: ``python -m reporter_proc --arena PATH [--owner-pid PID] [--settings-file FILE]``.

For launchers that prefer exec to fork (a clean interpreter without the application's
modules). Runs the supervisor in this process (``--no-supervise``: the reporter itself);
the exit status follows the reporter's rules (0, or 70 and up).
"""

from __future__ import annotations

import argparse
import logging
import sys

from ipc import Arena, ArenaError
from reporter_proc.plumbing import reset_signals
from reporter_proc.process import run_reporter_process, run_supervisor, settings_from_json
from reporter_proc.senders.tls import has_secret
from reporter_proc.settings import ReporterSettings


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
            with open(args.settings_file, "rb") as f:
                settings = settings_from_json(f.read())
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
