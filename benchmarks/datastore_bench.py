"""Added CPU per database / cache call: swmp's instrumentations against the real local servers.

Every library runs the same small call (``SELECT 1`` and its row; a Redis ``GET``; a
memcached ``get``) against PostgreSQL 15, MariaDB, Redis and memcached started here on
127.0.0.1 (``tests/daemons.py``, private temp dirs, stopped at the end). CPU time of this
process (``time.process_time``: the servers' work and the network wait do not count) per
call, in three modes measured round-robin in one process, so machine noise hits them alike:

* ``off``: swmp not installed (the library's own cost, the baseline);
* ``outside``: swmp installed, the call made outside any trace (one context-variable check);
* ``traced``: swmp installed, calls made inside a trace, ``BATCH`` calls per trace (each
  call is an exit span with its tags, serialized into its segment: all of that is counted;
  the trace's own local span is amortised over the batch).

The apache-skywalking 1.2.0 plugin for the same library (where it has one) runs in a child
process (it cannot share a process with swmp's generated protobuf modules): its baseline
rounds first, then its plugins installed and the same calls inside one of its traces per
batch (segments go to its real queue, drained between rounds; no reporter threads).

Added cost = median over rounds of (mode - off) per call; the table also shows each
mode's median per call.

    python benchmarks/datastore_bench.py [--rounds N] [--calls N] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BATCH = 50  # calls per trace in the traced modes (below the default span limit)


class Call:
    """A workload's calls: ``run(n, ctx)`` makes n calls, entering ``ctx()`` around each group
    of BATCH calls; ``one()`` makes a single call (the per-call timing, :func:`interleaved`)."""

    def __init__(self, one: Callable[[], Any], run: Callable[[int, Callable[[], Any]], None]) -> None:
        self.one = one
        self._run = run

    def __call__(self, n: int, ctx: Callable[[], Any]) -> None:
        self._run(n, ctx)


# -- workloads -------------------------------------------------------------------------------
# make(servers) -> (run, close). Connections are made by ``make``, after (un)installing swmp.
def _sync(call: Callable[[], Any]) -> Call:
    def run(n: int, ctx: Callable[[], Any]) -> None:
        for _ in range(n // BATCH):
            with ctx():
                for _ in range(BATCH):
                    call()

    return Call(call, run)


def _async(loop: asyncio.AbstractEventLoop, call: Callable[[], Any]) -> Call:
    async def go(n: int, ctx: Callable[[], Any]) -> None:
        for _ in range(n // BATCH):
            with ctx():
                for _ in range(BATCH):
                    await call()

    def run(n: int, ctx: Callable[[], Any]) -> None:
        loop.run_until_complete(go(n, ctx))

    def one() -> Any:
        # The task copies the context current here: the caller's trace, or none.
        return loop.run_until_complete(call())

    return Call(one, run)


def make_psycopg2(s: dict[str, Any]) -> tuple[Call, Callable[[], None]]:
    import psycopg2

    p = s["pg"]
    conn = psycopg2.connect(
        host=p["host"], port=p["port"], user=p["user"], password=p["password"], dbname=p["database"]
    )
    conn.autocommit = True
    cur = conn.cursor()

    def call() -> Any:
        cur.execute("SELECT 1")
        return cur.fetchone()

    return _sync(call), conn.close


def _pg3_kwargs(s: dict[str, Any]) -> dict[str, Any]:
    """psycopg 3's connection arguments (sync and async alike)."""
    p = s["pg"]
    return {
        "host": p["host"],
        "port": p["port"],
        "user": p["user"],
        "password": p["password"],
        "dbname": p["database"],
        "autocommit": True,
    }


def make_psycopg(s: dict[str, Any]) -> tuple[Call, Callable[[], None]]:
    import psycopg

    conn = psycopg.connect(**_pg3_kwargs(s))
    cur = conn.cursor()

    def call() -> Any:
        cur.execute("SELECT 1")
        return cur.fetchone()

    return _sync(call), conn.close


def make_psycopg_async(s: dict[str, Any]) -> tuple[Call, Callable[[], None]]:
    import psycopg

    loop = asyncio.new_event_loop()
    conn = loop.run_until_complete(psycopg.AsyncConnection.connect(**_pg3_kwargs(s)))
    cur = conn.cursor()

    async def call() -> Any:
        await cur.execute("SELECT 1")
        return await cur.fetchone()

    def close() -> None:
        loop.run_until_complete(conn.close())
        loop.close()

    return _async(loop, call), close


def make_asyncpg(s: dict[str, Any]) -> tuple[Call, Callable[[], None]]:
    import asyncpg

    p = s["pg"]
    loop = asyncio.new_event_loop()
    conn = loop.run_until_complete(
        asyncpg.connect(
            host=p["host"], port=p["port"], user=p["user"], password=p["password"], database=p["database"]
        )
    )

    def call() -> Any:
        return conn.fetchval("SELECT 1")

    def close() -> None:
        loop.run_until_complete(conn.close())
        loop.close()

    return _async(loop, call), close


def _my_kwargs(s: dict[str, Any]) -> dict[str, Any]:
    m = s["mysql"]
    return {"host": m["host"], "port": m["port"], "user": m["user"], "password": m["password"]}


def make_pymysql(s: dict[str, Any]) -> tuple[Call, Callable[[], None]]:
    import pymysql

    conn = pymysql.connect(**_my_kwargs(s), database=s["mysql"]["database"])
    cur = conn.cursor()

    def call() -> Any:
        cur.execute("SELECT 1")
        return cur.fetchone()

    return _sync(call), conn.close


def make_mysqlclient(s: dict[str, Any]) -> tuple[Call, Callable[[], None]]:
    import MySQLdb

    conn = MySQLdb.connect(**_my_kwargs(s), database=s["mysql"]["database"])
    cur = conn.cursor()

    def call() -> Any:
        cur.execute("SELECT 1")
        return cur.fetchone()

    return _sync(call), conn.close


def make_aiomysql(s: dict[str, Any]) -> tuple[Call, Callable[[], None]]:
    import aiomysql

    loop = asyncio.new_event_loop()
    conn = loop.run_until_complete(aiomysql.connect(**_my_kwargs(s), db=s["mysql"]["database"]))

    async def cursor() -> Any:
        return await conn.cursor()

    cur = loop.run_until_complete(cursor())

    async def call() -> Any:
        await cur.execute("SELECT 1")
        return await cur.fetchone()

    def close() -> None:
        conn.close()
        loop.run_until_complete(asyncio.sleep(0))  # let the transport finish closing
        loop.close()

    return _async(loop, call), close


def make_redis(s: dict[str, Any]) -> tuple[Call, Callable[[], None]]:
    import redis

    r = redis.Redis(host=s["redis"]["host"], port=s["redis"]["port"])
    r.set("bench:k", "v")

    def call() -> Any:
        return r.get("bench:k")

    return _sync(call), r.close


def make_redis_asyncio(s: dict[str, Any]) -> tuple[Call, Callable[[], None]]:
    import redis.asyncio as aredis

    loop = asyncio.new_event_loop()
    r = aredis.Redis(host=s["redis"]["host"], port=s["redis"]["port"])

    def call() -> Any:
        return r.get("bench:k")

    def close() -> None:
        loop.run_until_complete(r.aclose())
        loop.close()

    return _async(loop, call), close


def make_pymemcache(s: dict[str, Any]) -> tuple[Call, Callable[[], None]]:
    from pymemcache.client.base import Client

    mc = Client((s["memcached"]["host"], s["memcached"]["port"]))
    mc.set("bench:k", b"v")

    def call() -> Any:
        return mc.get("bench:k")

    return _sync(call), mc.close


WORKLOADS: dict[str, Callable[[dict[str, Any]], tuple[Call, Callable[[], None]]]] = {
    "psycopg2": make_psycopg2,
    "psycopg": make_psycopg,
    "psycopg.async": make_psycopg_async,
    "asyncpg": make_asyncpg,
    "pymysql": make_pymysql,
    "mysqlclient": make_mysqlclient,
    "aiomysql": make_aiomysql,
    "redis": make_redis,
    "redis.asyncio": make_redis_asyncio,
    "pymemcache": make_pymemcache,
}
# apache-skywalking 1.2.0 plugin module per library (None: it has none).
PEER_PLUGIN = {
    "psycopg2": "sw_psycopg2",
    "psycopg": "sw_psycopg",
    "psycopg.async": "sw_psycopg",
    "asyncpg": "sw_asyncpg",
    "pymysql": "sw_pymysql",
    "mysqlclient": "sw_mysqlclient",
    "aiomysql": None,
    "redis": "sw_redis",
    "redis.asyncio": None,
    "pymemcache": None,
}


def measure(run: Call, calls: int, ctx: Callable[[], Any]) -> float:
    """CPU ns per call of ``calls`` calls."""
    t0 = time.process_time_ns()
    run(calls, ctx)
    return (time.process_time_ns() - t0) / calls


# -- swmp (this process) ---------------------------------------------------------------------
def run_swmp(
    servers: dict[str, Any], libs: list[str], rounds: int, calls: int
) -> dict[str, dict[str, list[float]]]:
    from swmp import _sink, instrument, tracing
    from swmp.config import load
    from swmp.tracing.context import new_local_span

    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    cfg = load({}, agent_log_reporter_active=False)
    tracing.configure(cfg)

    def traced_ctx() -> Any:
        return new_local_span("batch")

    out: dict[str, dict[str, list[float]]] = {lib: {"off": [], "outside": [], "traced": []} for lib in libs}
    for lib in libs:  # warm up: imports, first connections, statement caches
        for installed in (False, True):
            if installed:
                instrument.install_all(cfg)
            run, close = WORKLOADS[lib](servers)
            run(BATCH * 2, traced_ctx)
            close()
            instrument.uninstall_all()
    for _ in range(rounds):
        for lib in libs:
            for mode in ("off", "outside", "traced"):
                if mode == "off":
                    instrument.uninstall_all()
                else:
                    instrument.install_all(cfg)
                run, close = WORKLOADS[lib](servers)
                ctx = traced_ctx if mode == "traced" else contextlib.nullcontext
                out[lib][mode].append(measure(run, calls, ctx))
                close()
                sink.clear()
        instrument.uninstall_all()
    _sink.set_sink(None)
    return out


class TraceInContext:
    """A context copy with a trace open in it (a local span): calls made through :meth:`run`
    are inside that trace; :meth:`rotate` closes it (its segment serialized and written) and
    opens the next, so that a long run stays below the span limit."""

    def __init__(self) -> None:
        import contextvars

        self.context = contextvars.copy_context()
        self._spans: list[Any] = []
        self.context.run(self._open)

    def _open(self) -> None:
        from swmp.tracing.context import new_local_span

        span = new_local_span("batch")
        span.__enter__()
        self._spans.append(span)

    def _close(self) -> None:
        self._spans.pop().__exit__(None, None, None)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.context.run(fn, *args)

    def rotate(self) -> None:
        self.context.run(self._close)
        self.context.run(self._open)

    def close(self) -> None:
        self.context.run(self._close)


def _per_call(one: Callable[[], Any], pairs: int, drain: Callable[[], object]) -> dict[str, float]:
    """:func:`interleaved` for one workload: ``pairs`` calls inside a trace and as many outside."""
    import contextvars

    from benchmarks._abba import alternate

    clock = time.thread_time_ns
    outside_ctx = contextvars.copy_context()
    trace = TraceInContext()
    for _ in range(BATCH * 4):  # warm up: statement caches, first spans
        outside_ctx.run(one)
        trace.run(one)
    rotations: list[int] = []

    def rotate(i: int) -> None:  # every BATCH pairs: the trace closed and a new one opened
        if i % BATCH == BATCH - 1:
            t0 = clock()
            trace.rotate()
            rotations.append(clock() - t0)
            drain()  # the reporter's part: not this process's cost

    outside, traced = alternate(
        lambda: outside_ctx.run(one), lambda: trace.run(one), pairs, clock=clock, between=rotate
    )
    trace.close()
    span = statistics.median(t - o for t, o in zip(traced, outside, strict=True))
    share = statistics.median(rotations) / BATCH
    return {
        "outside_ns": statistics.median(outside),
        "traced_ns": statistics.median(traced),
        "span_ns": span,
        "segment_share_ns": share,
        "added_traced_ns": span + share,
        "pairs": pairs,
    }


def interleaved(servers: dict[str, Any], libs: list[str], pairs: int) -> dict[str, dict[str, float]]:
    """Per call, the CPU time of this thread (``time.thread_time_ns``: the server's work and the
    wait for it do not count), swmp installed: a call inside a trace and a call outside any trace
    alternated call by call (ABBA), so both see the caches as the previous round trip left
    them, and drift hits both alike. Medians per call, and the median of the pairs' differences:
    steady to ~0.1 us, where the rounds above move by microseconds.

    Every BATCH traced calls the trace is closed and a new one opened (timed apart: the
    segment's serialization and its write into a real shared-memory ring, as in a worker, plus
    the trace's own local span); its share per call is reported next to the span's cost. What
    a call outside a trace costs over no agent is the ``+outside`` column above (in instructions:
    ``datastore_cachegrind.py --outside``, a few hundred)."""
    from benchmarks._ring import Ring
    from swmp import instrument, tracing
    from swmp.config import load

    cfg = load({}, agent_log_reporter_active=False)
    tracing.configure(cfg)
    ring = Ring()
    instrument.install_all(cfg)
    out: dict[str, dict[str, float]] = {}
    try:
        for lib in libs:
            calls, close = WORKLOADS[lib](servers)
            try:
                ring.warm()  # resident, as a busy worker's ring is (benchmarks/_ring.py)
                out[lib] = _per_call(calls.one, pairs, ring.drain)
            finally:
                close()
    finally:
        instrument.uninstall_all()
        ring.close()
    return out


def noop_cursor() -> tuple[Callable[..., Any], Any]:
    """``(wrapped, cursor)``: the DB-API ``execute`` wrapper of the data-store instrumentation
    around a cursor method that does nothing, and such a cursor (``wrapped(cursor, query,
    args)``; ``cursor.execute`` is the unwrapped call). The wrapper's own work, without I/O."""
    from swmp.config import load
    from swmp.instrument import _datastore as ds
    from swmp.tracing.constants import Component

    ds.configure(load({}, agent_log_reporter_active=False))

    class Connection:
        db = "app"

    class Cursor:
        connection = Connection()

        def execute(self, query: Any, args: Any = None) -> None:
            return None

    def where(cursor: Any) -> tuple[str, str]:
        # PyMySQL's memo on the connection (its db then, (peer, database)): after the first
        # call the native form (SqlCall) reads it without calling here, as with the driver.
        conn = cursor.connection
        memo = getattr(conn, ds.WHERE, None)
        if memo is not None and memo[0] is conn.db:
            return memo[1]  # type: ignore[no-any-return]
        pair = ("127.0.0.1:3306", conn.db)
        ds.remember(conn, (conn.db, pair))
        return pair

    method = ds.cursor_method("execute", "Mysql/PyMsql/", Component.PYMYSQL, "mysql", where, memo_key="db")
    return method(Cursor.execute), Cursor()


def wrapper_overhead(reps: int = 100_000, rounds: int = 7) -> dict[str, float]:
    """The ns a wrapper adds to one call without any I/O (the patched method is a no-op):
    outside a trace (the one check), and inside one (the exit span with its SQL tags,
    serialized with its segment, BATCH spans per segment). Min over rounds: the uncontended
    cost. Against the real servers these are mixed with the calls' own noise."""
    from swmp import _sink, tracing
    from swmp.config import load
    from swmp.tracing.context import new_local_span

    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    tracing.configure(load({}, agent_log_reporter_active=False))
    wrapped, obj = noop_cursor()
    plain = obj.execute

    def loop(fn: Callable[[], Any], ctx: Callable[[], Any]) -> float:
        t0 = time.process_time_ns()
        for _ in range(reps // BATCH):
            with ctx():
                for _ in range(BATCH):
                    fn()
        return (time.process_time_ns() - t0) / reps

    cases: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "direct": (lambda: plain("SELECT 1", None), contextlib.nullcontext),
        "outside": (lambda: wrapped(obj, "SELECT 1", None), contextlib.nullcontext),
        "direct_in_trace": (lambda: plain("SELECT 1", None), lambda: new_local_span("batch")),
        "traced": (lambda: wrapped(obj, "SELECT 1", None), lambda: new_local_span("batch")),
    }
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(rounds):
        for name, (fn, ctx) in cases.items():
            best[name] = min(best[name], loop(fn, ctx))
            sink.clear()
    _sink.set_sink(None)
    return {"outside": best["outside"] - best["direct"], "traced": best["traced"] - best["direct_in_trace"]}


# -- apache-skywalking (child process) -------------------------------------------------------
def peer_child(servers: dict[str, Any], libs: list[str], rounds: int, calls: int) -> dict[str, Any]:
    import importlib
    import logging

    from skywalking import config

    config.init(
        agent_name="bench",
        agent_protocol="grpc",
        agent_collector_backend_services="127.0.0.1:1",
        agent_profile_active=False,
        agent_meter_reporter_active=False,
        agent_log_reporter_active=False,
    )
    from skywalking.agent import agent
    from skywalking.trace.context import get_context

    logging.getLogger("skywalking").setLevel(logging.ERROR)
    agent._SkyWalkingAgent__init_queues()  # its real queue, no reporter threads
    queue = agent._SkyWalkingAgent__segment_queue

    def drain() -> None:
        while not queue.empty():
            queue.get_nowait()

    def traced_ctx() -> Any:
        return get_context().new_local_span(op="batch")

    out: dict[str, Any] = {lib: {"off": [], "traced": []} for lib in libs}
    for lib in libs:  # its baseline first: its plugins cannot be taken out again
        run, close = WORKLOADS[lib](servers)
        run(BATCH * 2, contextlib.nullcontext)
        for _ in range(rounds):
            out[lib]["off"].append(measure(run, calls, contextlib.nullcontext))
        close()
    for lib in libs:
        importlib.import_module(f"skywalking.plugins.{PEER_PLUGIN[lib]}").install()  # type: ignore[attr-defined]
    for lib in libs:
        try:
            run, close = WORKLOADS[lib](servers)
            run(BATCH * 2, traced_ctx)
        except Exception as e:  # its plugin does not work with this library version
            out[lib] = {"off": out[lib]["off"], "traced": [], "error": f"{type(e).__name__}: {e}"[:200]}
            continue
        drain()
        for _ in range(rounds):
            out[lib]["traced"].append(measure(run, calls, traced_ctx))
            drain()
        close()
    return out


def run_peer(servers: dict[str, Any], libs: list[str], rounds: int, calls: int) -> dict[str, Any]:
    libs = [lib for lib in libs if PEER_PLUGIN[lib]]
    if not libs:
        return {}
    arg = json.dumps({"servers": servers, "libs": libs, "rounds": rounds, "calls": calls})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, __file__, "--peer-child", arg],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        check=False,
    )
    if proc.returncode != 0:
        print(f"apache-skywalking child failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
        return {}
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- servers ---------------------------------------------------------------------------------
@contextlib.contextmanager
def servers_running(libs: list[str]) -> Iterator[dict[str, Any]]:
    from tests import daemons

    need = {
        "pg": any(lib in {"psycopg2", "psycopg", "psycopg.async", "asyncpg"} for lib in libs),
        "mysql": any(lib in {"pymysql", "mysqlclient", "aiomysql"} for lib in libs),
        "redis": any(lib.startswith("redis") for lib in libs),
        "memcached": "pymemcache" in libs,
    }
    starters = {
        "pg": daemons.start_postgres,
        "mysql": daemons.start_mariadb,
        "redis": daemons.start_redis,
        "memcached": daemons.start_memcached,
    }
    started: list[Any] = []
    out: dict[str, Any] = {}
    try:
        for key, wanted in need.items():
            if wanted:
                d, info = starters[key]()
                started.append(d)
                out[key] = {k: getattr(info, k) for k in ("host", "port", "user", "password", "database")}
        yield out
    finally:
        for d in started:
            d.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=1000, help=f"calls per round and mode (multiple of {BATCH})")
    ap.add_argument("--libs", default=",".join(WORKLOADS), help="comma-separated subset")
    ap.add_argument("--no-peer", action="store_true", help="skip apache-skywalking")
    ap.add_argument(
        "--pairs", type=int, default=6000, help="per-call interleaved pairs per library (0: skip that table)"
    )
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 rounds x 100 calls, 400 pairs")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--peer-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peer_child:
        spec = json.loads(args.peer_child)
        print(json.dumps(peer_child(spec["servers"], spec["libs"], spec["rounds"], spec["calls"])))
        return 0
    if args.quick:
        args.rounds, args.calls, args.pairs = 2, 100, 400
    libs = [lib for lib in args.libs.split(",") if lib]
    calls = max(BATCH, args.calls // BATCH * BATCH)
    with servers_running(libs) as servers:
        ours = run_swmp(servers, libs, args.rounds, calls)
        peer = {} if args.no_peer else run_peer(servers, libs, args.rounds, calls)
        per_call = interleaved(servers, libs, args.pairs) if args.pairs > 0 else {}

    def med(xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")

    rows = []
    for lib in libs:
        o = ours[lib]
        added_out = med([b - a for a, b in zip(o["off"], o["outside"], strict=True)])
        added_tr = med([b - a for a, b in zip(o["off"], o["traced"], strict=True)])
        p = peer.get(lib)
        peer_added = (
            med([b - a for a, b in zip(p["off"], p["traced"], strict=True)]) if p and p["traced"] else None
        )
        rows.append(
            {
                "library": lib,
                "off_ns": med(o["off"]),
                "outside_ns": med(o["outside"]),
                "traced_ns": med(o["traced"]),
                "added_outside_ns": added_out,
                "added_traced_ns": added_tr,
                "skywalking_added_traced_ns": peer_added,
                "skywalking_error": (p or {}).get("error", "" if p else "no plugin"),
                "rounds": args.rounds,
                "calls": calls,
            }
        )
    load1 = os.getloadavg()[0]
    py = sys.version.split()[0]
    print(f"CPU per call, {args.rounds} rounds x {calls} calls, Python {py}, load {load1:.1f}")
    head = ("library", "off us", "outside", "traced", "+outside", "+traced", "+skywalking")
    print(f"{head[0]:<15}{head[1]:>9}{head[2]:>9}{head[3]:>9}{head[4]:>10}{head[5]:>9}{head[6]:>13}")
    for r in rows:
        sky = r["skywalking_added_traced_ns"]
        print(
            f"{r['library']:<15}{r['off_ns'] / 1000:>9.1f}"
            f"{r['outside_ns'] / 1000:>9.1f}{r['traced_ns'] / 1000:>9.1f}"
            f"{r['added_outside_ns'] / 1000:>10.2f}{r['added_traced_ns'] / 1000:>9.2f}"
            f"{(f'{sky / 1000:.2f}' if sky is not None else '-'):>13}"
        )
    for r in rows:
        if r["skywalking_error"] and r["skywalking_error"] != "no plugin":
            print(f"  {r['library']}: the apache-skywalking plugin failed: {r['skywalking_error']}")
    if per_call:
        print(
            f"\nper call, interleaved ({args.pairs} pairs, thread CPU time, medians): a call inside a "
            f"trace vs outside one, swmp installed; + the segment's share ({BATCH} spans per segment)"
        )
        print(f"{'library':<15}{'outside us':>11}{'traced us':>10}{'+span':>8}{'+segment':>10}{'+traced':>9}")
        for lib, r in per_call.items():
            print(
                f"{lib:<15}{r['outside_ns'] / 1000:>11.1f}{r['traced_ns'] / 1000:>10.1f}"
                f"{r['span_ns'] / 1000:>8.2f}{r['segment_share_ns'] / 1000:>10.2f}"
                f"{r['added_traced_ns'] / 1000:>9.2f}"
            )
    hot = wrapper_overhead()
    print(
        f"the wrapper alone, no I/O (min over rounds): outside a trace +{hot['outside']:.0f} ns, "
        f"traced +{hot['traced']:.0f} ns per call"
    )
    if args.json:
        result = {
            "load": load1,
            "batch": BATCH,
            "rows": rows,
            "raw": ours,
            "peer": peer,
            "hot_ns": hot,
            "interleaved": per_call,
        }
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
