"""The ``swmp traces`` command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from swmp.ops.fmt import terminal_safe
from swmp.traceview import render
from swmp.traceview.sources import DEFAULT_COLLECTOR, CollectorSource, Filters, OapSource, Source, SourceError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace_id", nargs="?", help="show this trace as a tree (default: list recent traces)")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--collector",
        metavar="URL",
        default=DEFAULT_COLLECTOR,
        help=f"a `swmp collector` (default {DEFAULT_COLLECTOR})",
    )
    src.add_argument("--oap", metavar="URL", help="a SkyWalking OAP's query address, e.g. http://host:12800")
    p.add_argument("--service", default="", help="only traces through this service")
    p.add_argument("--endpoint", default="", help="only traces whose endpoint contains this text")
    p.add_argument("--errors", action="store_true", help="only traces with an error")
    p.add_argument("--min-ms", type=int, default=0, help="only traces at least this long")
    p.add_argument("--limit", type=int, default=20, help="how many traces to list (default 20)")
    p.add_argument("--minutes", type=float, default=30, help="with --oap: how far back to look (default 30)")
    p.add_argument("--last", action="store_true", help="show the newest matching trace as a tree")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument(
        "--color", choices=("auto", "always", "never"), default="auto", help="highlight errors (default auto)"
    )


def run(args: argparse.Namespace) -> int:
    source: Source = OapSource(args.oap) if args.oap else CollectorSource(args.collector)
    filters = Filters(args.service, args.endpoint, args.errors, args.min_ms, max(1, args.limit), args.minutes)
    color = args.color == "always" or (
        args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    )
    try:
        trace_id = args.trace_id
        if trace_id is None and args.last:
            newest = source.recent(Filters(**{**asdict(filters), "limit": 1}))
            if not newest:
                print("no traces", file=sys.stderr)
                return 1
            trace_id = newest[0].trace_id
        if trace_id is None:
            rows = source.recent(filters)
            if args.json:
                print(json.dumps([asdict(r) for r in rows], indent=2))
            else:
                print("\n".join(render.summary_table(rows, color=color)))
            return 0
        spans = source.trace(trace_id)
        if args.json:
            print(
                json.dumps([{k: v for k, v in asdict(s).items() if k != "children"} for s in spans], indent=2)
            )
        else:
            print("\n".join(render.trace_tree(trace_id, spans, color=color)))
        return 0 if spans else 1
    except SourceError as exc:
        print(f"swmp traces: {terminal_safe(exc)}", file=sys.stderr)
        return 1
    except (KeyError, IndexError, TypeError, AttributeError, ValueError, RecursionError) as exc:
        # an answer of the wrong shape (another program on the port, a hostile server)
        where = args.oap or args.collector
        print(
            f"swmp traces: unexpected answer from {terminal_safe(where)}: {terminal_safe(repr(exc))[:300]}",
            file=sys.stderr,
        )
        return 1
