"""The ``swmp`` console script: ``run``, ``health``, ``status``, ``collector``, ``traces``, ``demo``.

``health`` is built to be a probe: exit status 0 healthy, 1 unhealthy (one line per
failed check on stdout), 2 no agent found or usage error. ``status`` is the at-a-glance
table. Both read the arenas of the current user and nothing else; neither needs root.
``swmp.ops`` needs only the standard library, orjson and ``ipc``; the agent itself is
imported only by ``run``, so a probe starts fast. ``collector``, ``traces`` and ``demo``
(development tools: docs/collector.md, docs/quickstart.md) import their packages on use.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from swmp.ops import checks, locate, render, report, sample

EXIT_USAGE = 2

_HEALTH_EPILOG = """\
exit status: 0 healthy, 1 unhealthy (one line per failed check), 2 no agent found or
usage error. --liveness checks what a restart fixes (reporter alive, heartbeat fresh,
rings drained); --readiness adds the backend; the default adds the drop ratio and the
spool. See docs/operations.md for probe examples and the --json shape.
"""


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _ratio(text: str) -> float:
    value = _non_negative(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def _add_selection(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("which agent (default: every agent of this user on this host)")
    g.add_argument(
        "--dir",
        metavar="DIR",
        help="arena directory (default: $SW_AGENT_ARENA_DIR, else /dev/shm)",
    )
    g.add_argument("--arena", metavar="PATH", help="one arena file")
    g.add_argument("--service", metavar="NAME", help="only agents of this service")
    g.add_argument(
        "--pid", type=_positive_int, metavar="PID", help="the agent with this owner, reporter or worker pid"
    )
    p.add_argument("--json", action="store_true", help="print JSON (shape in docs/operations.md)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swmp", description="SkyWalking agent for prefork Python servers: run, check and inspect it."
    )
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True

    run = sub.add_parser(
        "run",
        help="run a command with the agent loaded (swmp run -- gunicorn app:app)",
        description="Run COMMAND with the agent started in it, for example: "
        "swmp run -- gunicorn app:app -w 4",
    )
    run.add_argument("command", nargs=argparse.REMAINDER, help="the command line to run, after --")

    health = sub.add_parser(
        "health",
        help="check the agents; exit status for liveness/readiness probes",
        description="Check the agents running on this host.",
        epilog=_HEALTH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_selection(health)
    modes = health.add_mutually_exclusive_group()
    modes.add_argument(
        "--liveness", dest="mode", action="store_const", const="liveness", help="reporter, heartbeat, rings"
    )
    modes.add_argument(
        "--readiness", dest="mode", action="store_const", const="readiness", help="liveness + backend"
    )
    health.set_defaults(mode="all")
    health.add_argument(
        "--interval",
        type=_non_negative,
        default=1.0,
        metavar="S",
        help="seconds between the two readings that rates, drops and stuck rings are measured over; "
        "0 = one reading, drops over totals, no stuck-ring check (default 1)",
    )
    # The thresholds' defaults are declared once, in checks.Thresholds (which the checks
    # use when called without a CLI): the options and their help texts read them there.
    limits = checks.Thresholds()
    health.add_argument(
        "--max-heartbeat-age",
        type=_non_negative,
        default=limits.max_heartbeat_age_s,
        metavar="S",
        help="the reporter's last heartbeat must be younger than this "
        f"(default {limits.max_heartbeat_age_s:g})",
    )
    health.add_argument(
        "--backend-window",
        type=_non_negative,
        default=limits.backend_window_s,
        metavar="S",
        help="the backend must have been reached within this many seconds; also the grace period "
        f"of a new reporter (default {limits.backend_window_s:g})",
    )
    health.add_argument(
        "--backend-failures",
        type=_count,
        default=limits.backend_failures,
        metavar="N",
        help="fail at once when the reporter reports the backend failing N times in a row "
        f"(default {limits.backend_failures}; 0 = only the window counts)",
    )
    health.add_argument(
        "--max-drop-ratio",
        type=_ratio,
        default=limits.max_drop_ratio,
        metavar="R",
        help=f"largest share of records dropped over the interval (default {limits.max_drop_ratio:g})",
    )
    health.add_argument("-v", "--verbose", action="store_true", help="show every check, and skipped arenas")

    status = sub.add_parser(
        "status",
        help="a table of the agents: backend, reporter, rings, rates",
        description="Show the agents running on this host.",
    )
    _add_selection(status)
    status.add_argument(
        "--interval",
        type=_non_negative,
        default=1.0,
        metavar="S",
        help="seconds between readings for the per-slot rates, and the refresh period of --watch; "
        "0 = one reading, no rates (default 1)",
    )
    status.add_argument("--watch", action="store_true", help="refresh in place until Ctrl-C (like top)")
    status.add_argument(
        "--count", type=_positive_int, metavar="N", help="with --watch: stop after N refreshes"
    )

    collector = sub.add_parser(
        "collector",
        help="run a local SkyWalking backend with a trace page (development and CI)",
        description="A local SkyWalking backend: gRPC and HTTP receivers, SQLite storage, a web page "
        "with traces, services and logs. A development tool, not an OAP (docs/collector.md).",
    )
    importlib.import_module("swmp.collector.options").add_arguments(collector)

    traces = sub.add_parser(
        "traces",
        help="recent traces, or one trace as a tree, from `swmp collector` or an OAP",
        description="List recent traces, or print one as a tree (durations, errors, instance per segment).",
    )
    importlib.import_module("swmp.traceview.command").add_arguments(traces)

    demo = sub.add_parser(
        "demo",
        help="see traces in a minute: collector + example services + load, then trace trees",
        description="Start a local collector (or use --oap), run the example application under "
        "`swmp run -- gunicorn -w 4` and a second service, send requests, print the status table "
        "and two trace trees, then stop everything.",
    )
    importlib.import_module("swmp.demo.command").add_arguments(demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "run": _cmd_run,
        "health": _cmd_health,
        "status": _cmd_status,
        "collector": _lazy("swmp.collector.server"),
        "traces": _lazy("swmp.traceview.command"),
        "demo": _lazy("swmp.demo.command"),
    }
    if args.cmd == "status" and args.watch and args.interval <= 0:
        print("swmp status: error: --watch needs --interval > 0", file=sys.stderr)
        return EXIT_USAGE
    try:
        return handlers[args.cmd](args)
    except BrokenPipeError:
        # `swmp status | head`: the reader left; say nothing more, and keep the interpreter
        # from complaining about the closed stdout at exit.
        _silence_stdout()
        return 0
    except KeyboardInterrupt:
        return 130


def _lazy(module: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        return int(importlib.import_module(module).run(args))

    return handler


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


# -- run ----------------------------------------------------------------------------------
def _cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("swmp run: error: nothing to run (usage: swmp run -- COMMAND [ARGS...])", file=sys.stderr)
        return EXIT_USAGE
    try:
        # Imported only here: the launcher pulls in the agent, which health and status
        # (run by probes every few seconds) have no use for.
        launcher = importlib.import_module("swmp.launcher")
    except ImportError as exc:
        print(f"swmp run: not available in this installation ({exc})", file=sys.stderr)
        return EXIT_USAGE
    return int(launcher.run(command))  # replaces this process; returns only on failure


# -- health -------------------------------------------------------------------------------
def _emit(lines: list[str], stream: IO[str]) -> None:
    if lines:
        stream.write("\n".join(lines) + "\n")
        stream.flush()


def _emit_json(doc: dict[str, Any], compact: bool = False) -> None:
    text = json.dumps(doc, separators=(",", ":")) if compact else json.dumps(doc, indent=2)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _cmd_health(args: argparse.Namespace) -> int:
    limits = checks.Thresholds(
        max_heartbeat_age_s=args.max_heartbeat_age,
        backend_window_s=args.backend_window,
        backend_failures=args.backend_failures,
        max_drop_ratio=args.max_drop_ratio,
    )
    directory = locate.arena_directory(args.dir)
    sel = locate.select(directory, args.arena, args.service, args.pid)
    try:
        results = []
        if sel.targets:
            before = [sample.take(t) for t in sel.targets] if args.interval > 0 else None
            if before is not None:
                time.sleep(args.interval)
            after = [sample.take(t) for t in sel.targets]
            for i, a in enumerate(after):
                b = before[i] if before is not None else None
                results.append((a, checks.evaluate(b, a, limits, args.mode)))
        doc = report.health_report(
            results, mode=args.mode, limits=limits, interval_s=args.interval, notes=sel.notes, error=sel.error
        )
    finally:
        locate.close_all(sel.targets)
    if args.json:
        _emit_json(doc)
    else:
        _emit(render.health_text(doc, verbose=args.verbose), sys.stdout)
    _emit(render.problems_text("health", doc, verbose=args.verbose), sys.stderr)
    return int(doc["exit_code"])


# -- status -------------------------------------------------------------------------------
def _cmd_status(args: argparse.Namespace) -> int:
    if args.watch:
        return _status_watch(args)
    sel = locate.select(locate.arena_directory(args.dir), args.arena, args.service, args.pid)
    try:
        pairs: list[tuple[Any, Any]] = []
        if sel.targets:
            before = [sample.take(t) for t in sel.targets] if args.interval > 0 else None
            if before is not None:
                time.sleep(args.interval)
            for i, t in enumerate(sel.targets):
                pairs.append((before[i] if before is not None else None, sample.take(t)))
        doc = report.status_report(pairs, interval_s=args.interval, notes=sel.notes, error=sel.error)
    finally:
        locate.close_all(sel.targets)
    if args.json:
        _emit_json(doc)
    else:
        _emit(render.status_text(doc), sys.stdout)
    _emit(render.problems_text("status", doc), sys.stderr)
    return EXIT_USAGE if doc["error"] else 0


def _status_watch(args: argparse.Namespace) -> int:
    """Refresh every --interval. Agents are looked up again each time, so an application
    that restarts (new arena) shows up without restarting the watch."""
    directory = locate.arena_directory(args.dir)
    in_place = sys.stdout.isatty() and not args.json
    previous: dict[tuple[str, int], Any] = {}
    frames = 0
    code = 0
    # The first frame already needs a "before" reading for its rates.
    sel = locate.select(directory, args.arena, args.service, args.pid)
    try:
        for t in sel.targets:
            previous[(t.path, t.info.created_ns)] = sample.take(t)
    finally:
        locate.close_all(sel.targets)
    try:
        while args.count is None or frames < args.count:
            time.sleep(args.interval)
            sel = locate.select(directory, args.arena, args.service, args.pid)
            try:
                current = {(t.path, t.info.created_ns): sample.take(t) for t in sel.targets}
            finally:
                locate.close_all(sel.targets)
            pairs = [(previous.get(key), s) for key, s in current.items()]
            previous = current
            doc = report.status_report(pairs, interval_s=args.interval, notes=sel.notes, error=sel.error)
            code = EXIT_USAGE if doc["error"] else 0
            frames += 1
            if args.json:
                _emit_json(doc, compact=True)  # JSON Lines: one document per refresh
                continue
            stamp = time.strftime("%H:%M:%S")
            head = [f"swmp status  {stamp}  every {args.interval:g}s  (Ctrl-C to quit)", ""]
            body = render.status_text(doc) + render.problems_text("status", doc, verbose=False)
            if in_place:
                sys.stdout.write("\x1b[H\x1b[2J")  # home + clear: redraw like top
            elif frames > 1:
                sys.stdout.write("\n")
            _emit(head + body, sys.stdout)
    except KeyboardInterrupt:
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
