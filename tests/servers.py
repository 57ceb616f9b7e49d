"""Launch Gunicorn / uWSGI (with the agent) and drive them, for tests and benchmarks.

Every process a helper starts is stopped by pid, also when the test fails: the server's
own process tree, plus every process whose command line mentions the test's private arena
directory (a reporter double-forked into its own session is nobody's child, but its title
names its arena). Readiness is waited for on real signals (log lines, a listening port,
the workers' ring-slot claims), never on a fixed sleep.

    with collector_process(tmp) as col, gunicorn(tmp, col, workers=4) as srv:
        results = load(srv.url, ["/cpu", "/io"], total=400)
        wait_segments(col, 400)
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.collector import CollectorProcess, read_dump

REPO_ROOT = Path(__file__).resolve().parent.parent
SWMP_RUN = [sys.executable, "-m", "swmp.cli", "run", "--"]
GUNICORN = [sys.executable, "-m", "gunicorn"]


def _which(name: str) -> str:
    """The console script next to this interpreter (pyenv shims are shell scripts)."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


UWSGI = _which("uwsgi")


class NotReady(AssertionError):
    pass


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise NotReady(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


# -- processes -------------------------------------------------------------------------------
def belongs(p: psutil.Process, marker: str) -> bool:
    """Does ``p`` carry ``marker`` (our arena directory) in its command line or environment?

    The environment is what a process was exec'd with: every process forked from our
    server has it, whatever title it set (or failed to set) for itself.
    """
    try:
        if marker in " ".join(p.cmdline()):
            return True
        return marker in p.environ().get("SW_AGENT_ARENA_DIR", "")
    except psutil.Error:
        return False


def is_swmp(p: psutil.Process, title: str = "swmp-") -> bool:
    """Is ``p`` one of the agent's own processes (``swmp-reporter``, ``swmp-supervisor``)?

    The kernel's name (``/proc/PID/comm``, 15 bytes) is checked as well as the command line:
    the command-line title cannot always be set (an interpreter embedded in uWSGI).
    """
    try:
        return p.name().startswith(title[:15]) or " ".join(p.cmdline()).startswith(title)
    except psutil.Error:
        return False


class Proc:
    """A child process with its output in a log file, stopped by pid, strays included."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], log_path: Path, marker: str = "") -> None:
        self.argv = list(argv)
        self.env = env
        self.log_path = log_path
        self.marker = marker  # a string in the command line of every process that belongs to us
        self.popen: subprocess.Popen[bytes] | None = None
        self._seen: set[int] = set()

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def start(self) -> Proc:
        with open(self.log_path, "ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # our own process group: a ^C of pytest does not race us
            )
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_log(self, pattern: str, count: int = 1, timeout: float = 30.0) -> None:
        rx = re.compile(pattern)

        def seen() -> bool:
            if not self.alive():
                raise NotReady(
                    f"{self.argv[:4]} exited ({self.popen and self.popen.returncode}):\n{self.tail()}"
                )
            return len(rx.findall(self.log())) >= count

        try:
            wait_until(seen, timeout, f"{count} x {pattern!r}")
        except NotReady as exc:
            raise NotReady(f"{exc}\n--- log tail ---\n{self.tail()}") from None

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def send(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def family(self) -> list[psutil.Process]:
        """Our processes now: the tree under the child, and anything carrying the marker."""
        found: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.pid)
            found[root.pid] = root
            for p in root.children(recursive=True):
                found[p.pid] = p
        if self.marker:
            for p in psutil.process_iter(["cmdline"]):
                if belongs(p, self.marker):
                    found[p.pid] = p
        found.pop(os.getpid(), None)
        return list(found.values())

    def wait_exit(self, timeout: float) -> int | None:
        assert self.popen is not None
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        """Ask with ``sig``, then SIGKILL whatever of ours is left (by pid)."""
        if self.popen is None:
            return
        family = self.family()
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
            self.wait_exit(timeout)
        # The reporter outlives the master by its drain deadline at most.
        family += self.family()
        deadline = time.monotonic() + timeout
        for p in family:
            with contextlib.suppress(psutil.Error):
                p.wait(max(0.0, deadline - time.monotonic()))
        self.kill_all(family)

    def kill_all(self, extra: Sequence[psutil.Process] = ()) -> None:
        procs = {p.pid: p for p in [*extra, *self.family()]}
        for p in procs.values():
            with contextlib.suppress(psutil.Error):
                p.kill()
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            if self.popen is not None:
                self.popen.wait(10)
        psutil.wait_procs(list(procs.values()), timeout=10)


# -- the agent's side of a server ------------------------------------------------------------
def agent_env(
    workdir: Path,
    backend: str,
    *,
    service: str = "app",
    instance: str = "",
    reporter_process: bool = True,
    extra: dict[str, str] | None = None,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """Environment for an application run under the agent, reporting to ``backend``."""
    env = dict(os.environ if base is None else base)
    for key in list(env):
        if key.startswith(("SW_", "SWMP_", "UWSGI_")):
            del env[key]
    arena_dir = workdir / "shm"
    arena_dir.mkdir(parents=True, exist_ok=True)
    env.update(
        {
            "SW_AGENT_NAME": service,
            "SW_AGENT_INSTANCE_NAME": instance or service,
            "SW_AGENT_COLLECTOR_BACKEND_SERVICES": backend,
            "SW_AGENT_ARENA_DIR": str(arena_dir),
            "SW_AGENT_REPORTER_PROCESS": "true" if reporter_process else "false",
            "SW_AGENT_REPORTER_FLUSH_INTERVAL": "0.05",
            "SW_AGENT_COLLECTOR_HEARTBEAT_PERIOD": "1",
            "SW_AGENT_LOG_REPORTER_ACTIVE": "false",
            "SW_AGENT_METER_REPORTER_ACTIVE": "false",
            "SW_AGENT_PROFILE_ACTIVE": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    paths = [str(REPO_ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra or {})
    return env


def two_app_envs(
    tmp_path: Path, col: CollectorProcess, b_port: int, *, reporter_process: bool = True
) -> tuple[dict[str, str], dict[str, str]]:
    """The environments of the two applications of :func:`check_two_apps`: service ``a``,
    whose ``/call`` calls ``/cpu`` of service ``b`` listening on ``b_port``."""
    env_b = agent_env(tmp_path / "b", col.grpc_address, service="b", reporter_process=reporter_process)
    downstream = {"DOWNSTREAM_URL": f"http://127.0.0.1:{b_port}/cpu"}
    env_a = agent_env(
        tmp_path / "a", col.grpc_address, service="a", extra=downstream, reporter_process=reporter_process
    )
    return env_a, env_b


@dataclass
class Server:
    kind: str  # "gunicorn" | "uwsgi"
    proc: Proc
    port: int
    arena_dir: Path
    workers: int
    env: dict[str, str]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def arena_files(self) -> list[Path]:
        return sorted(p for p in self.arena_dir.glob("*/*.arena"))

    def arena_path(self) -> Path:
        """The application's shared arena (thread mode: the one that only names workers).

        Its name carries the master's start time, read once while the master is alive.
        """
        if "arena" not in self.info:
            import ipc
            from swmp.ops.locate import registry_path

            path = ipc.arena_path(self.pid, str(self.arena_dir))
            if self.env.get("SW_AGENT_REPORTER_PROCESS") == "false":
                path = registry_path(path)
            self.info["arena"] = Path(path)
        return Path(self.info["arena"])

    def live_slots(self) -> dict[int, int]:
        """``{slot: pid}`` held in the application's arena (empty when it does not exist)."""
        from ipc import Arena, ArenaError

        try:
            with Arena.open(str(self.arena_path()), wait_s=0) as arena:
                return arena.live_slots()
        except (OSError, ArenaError):
            return {}

    def reporter_lock_holder(self) -> int | None:
        """Pid of the process holding the arena's reporter lock (the one draining it)."""
        from ipc import Arena, ArenaError

        try:
            with Arena.open(str(self.arena_path()), wait_s=0) as arena:
                return arena.reporter_pid()
        except (OSError, ArenaError):
            return None

    def named_processes(self, title: str) -> list[psutil.Process]:
        """Live processes titled ``title`` (e.g. swmp-reporter) serving our arena dir."""
        out = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if is_swmp(p, title) and p.status() != "zombie" and belongs(p, str(self.arena_dir)):
                    out.append(p)
        return out

    def reporters(self) -> list[psutil.Process]:
        return self.named_processes("swmp-reporter")

    def worker_pids(self) -> list[int]:
        """The server's worker processes (children of the master that are not ours)."""
        out = []
        with contextlib.suppress(psutil.Error):
            for p in psutil.Process(self.pid).children():
                with contextlib.suppress(psutil.Error):
                    if not is_swmp(p) and p.status() != "zombie":
                        out.append(p.pid)
        return sorted(out)

    def wait_workers_claimed(self, n: int | None = None, timeout: float = 30.0) -> None:
        """Wait until ``n`` (default: all) workers hold a ring slot of the master's arena."""
        want = self.workers if n is None else n

        def claimed() -> bool:
            if not self.proc.alive():
                raise NotReady(f"{self.kind} exited:\n{self.proc.tail()}")
            workers = set(self.worker_pids())
            slots = self.live_slots()
            return len(workers) >= want and len(workers & set(slots.values())) >= want

        try:
            wait_until(claimed, timeout, f"{want} workers holding ring slots", interval=0.05)
        except NotReady as exc:
            raise NotReady(f"{exc}\n--- log tail ---\n{self.proc.tail()}") from None

    def wait_reporter(self, timeout: float = 30.0) -> None:
        wait_until(lambda: len(self.reporters()) >= 1, timeout, "a reporter process")


def gunicorn_command(
    port: int,
    *,
    app: str = "examples.app:app",
    workers: int = 4,
    worker_class: str = "sync",
    threads: int = 0,
    preload: bool = False,
    max_requests: int = 0,
    timeout: int = 30,
    config: str = "",
    extra: Sequence[str] = (),
) -> list[str]:
    cmd = [
        *GUNICORN,
        "-b",
        f"127.0.0.1:{port}",
        "-w",
        str(workers),
        "-k",
        worker_class,
        "--no-control-socket",
        "--timeout",
        str(timeout),
        "--graceful-timeout",
        "20",
        "--log-level",
        "info",
    ]
    if threads:
        cmd += ["--threads", str(threads)]
    if preload:
        cmd.append("--preload")
    if max_requests:
        cmd += ["--max-requests", str(max_requests)]
    if config:
        cmd += ["-c", config]
    return [*cmd, *extra, app]


# Why uWSGI's --py-call-osafterfork cannot run on Python 3.13: swmp/launcher.py's docstring.
OSAFTERFORK_ABORTS = pytest.mark.skipif(
    sys.version_info >= (3, 13), reason="uWSGI's --py-call-osafterfork aborts workers on Python 3.13"
)


def uwsgi_command(
    port: int,
    *,
    module: str = "examples.app:app",
    workers: int = 4,
    lazy_apps: bool = False,
    threads: int = 0,
    osafterfork: bool | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    cmd = [
        UWSGI,
        "--master",
        "--processes",
        str(workers),
        "--http-socket",
        f"127.0.0.1:{port}",
        "--module",
        module,
        "--need-app",
        "--chdir",
        str(REPO_ROOT),
        "--disable-logging",
    ]
    if lazy_apps:
        cmd.append("--lazy-apps")
    if threads:
        cmd += ["--threads", str(threads)]
    if osafterfork:
        cmd.append("--py-call-osafterfork")
    return [*cmd, *extra]


@contextlib.contextmanager
def run_server(
    kind: str,
    workdir: Path,
    command: list[str],
    env: dict[str, str],
    *,
    port: int,
    workers: int,
    swmp_run: bool = True,
    wait_claims: bool = True,
    name: str = "",
) -> Iterator[Server]:
    """Start ``command`` (under ``swmp run`` unless told otherwise) and wait until it serves."""
    argv = [*SWMP_RUN, *command] if swmp_run else command
    log = workdir / f"{name or kind}-{port}.log"
    proc = Proc(argv, env, log, marker=env["SW_AGENT_ARENA_DIR"])
    server = Server(kind, proc, port, Path(env["SW_AGENT_ARENA_DIR"]), workers, env)
    proc.start()
    try:
        server.arena_path()  # while the master is alive
        if kind == "gunicorn":
            proc.wait_log(r"Booting worker with pid", count=workers)
        else:
            proc.wait_log(r"spawned uWSGI worker \d+", count=workers)
            # With lazy-apps every worker imports the app itself; a reload signalled while
            # one still imports is never completed by uWSGI 2.0.
            proc.wait_log(r"WSGI app 0 .* ready", count=workers if "--lazy-apps" in command else 1)
        wait_until(lambda: port_open(port), 30, f"port {port}")
        if wait_claims:
            server.wait_workers_claimed()
        yield server
    finally:
        stop_sig = signal.SIGTERM if kind == "gunicorn" else signal.SIGINT
        proc.stop(stop_sig)


# -- load ------------------------------------------------------------------------------------
def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def sw8_header(trace_id: str, segment_id: str = "client-segment", span_id: int = 0) -> str:
    return "-".join(
        [
            "1",
            b64(trace_id),
            b64(segment_id),
            str(span_id),
            b64("load-client"),
            b64("client-1"),
            b64("/load"),
            b64("x"),
        ]
    )


@dataclass
class Result:
    path: str
    trace_id: str  # "" when the request carried no sw8 header
    status: int  # 0: no answer (connection refused / reset / timeout)
    body: bytes = b""
    error: str = ""
    worker_pid: int = 0  # from the X-Worker-Pid header of examples/app.py


def request(port: int, path: str, trace_id: str = "", timeout: float = 30.0) -> Result:
    headers = {"sw8": sw8_header(trace_id)} if trace_id else {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        worker = resp.getheader("X-Worker-Pid") or "0"
        return Result(path, trace_id, resp.status, body, worker_pid=int(worker) if worker.isdigit() else 0)
    except (OSError, http.client.HTTPException) as exc:
        return Result(path, trace_id, 0, error=f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def load(
    port: int,
    paths: Sequence[str],
    total: int,
    *,
    concurrency: int = 8,
    traced_every: int = 2,
    stop: threading.Event | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> list[Result]:
    """``total`` GET requests over ``paths`` in turn, ``concurrency`` at a time.

    Every ``traced_every``-th request carries an ``sw8`` header with a fresh trace id (0:
    none do), so a test can match answered requests to delivered segments exactly.
    """
    results: list[Result] = []
    lock = threading.Lock()
    counter = iter(range(total))

    def worker() -> None:
        while stop is None or not stop.is_set():
            with lock:
                i = next(counter, None)
            if i is None:
                return
            traced = traced_every > 0 and i % traced_every == 0
            res = request(port, paths[i % len(paths)], uuid.uuid4().hex if traced else "")
            with lock:
                results.append(res)
            if on_result is not None:
                on_result(res)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


# -- the collector's side ----------------------------------------------------------------------
@contextlib.contextmanager
def collector_process(workdir: Path) -> Iterator[CollectorProcess]:
    col_dir = workdir / f"collector-{uuid.uuid4().hex[:6]}"
    col_dir.mkdir()
    col = CollectorProcess(str(col_dir))
    col.start()
    try:
        yield col
    finally:
        col.stop()


def messages(col: CollectorProcess, kind: str) -> list[dict[str, Any]]:
    return [line["message"] for line in read_dump(col.dump_file) if line["kind"] == kind]


def segments_of(col: CollectorProcess, service: str | None = None) -> list[dict[str, Any]]:
    return [m for m in messages(col, "segment") if service is None or m.get("service") == service]


def wait_segments(
    col: CollectorProcess, n: int, service: str | None = None, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """Wait until at least ``n`` segments (of ``service``) arrived; returns them all."""
    got: list[dict[str, Any]] = []

    def enough() -> bool:
        nonlocal got
        got = segments_of(col, service)
        return len(got) >= n

    with contextlib.suppress(NotReady):
        wait_until(enough, timeout, f"{n} segments", interval=0.1)
    return got


def quiet_for(col: CollectorProcess, seconds: float, kind: str = "segment", timeout: float = 30.0) -> None:
    """Wait until no new ``kind`` message arrived for ``seconds`` (the pipe has drained)."""
    last = -1
    since = time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = len(messages(col, kind))
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return
        time.sleep(0.1)


def entry_span(segment: dict[str, Any]) -> dict[str, Any]:
    spans: list[dict[str, Any]] = segment.get("spans", [])
    for span in spans:
        if span.get("spanType", "Entry") == "Entry" and int(span.get("parentSpanId", 0)) == -1:
            return span
    raise AssertionError(f"no entry span in {json.dumps(segment)[:300]}")


def exit_spans(segment: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in segment.get("spans", []) if s.get("spanType") == "Exit"]


# -- assertions shared by the server tests --------------------------------------------------
def check_two_apps(
    col: CollectorProcess,
    a: Server,
    b: Server,
    results: list[Result],
    *,
    a_service: str = "a",
    b_service: str = "b",
) -> None:
    """Exactly one segment per request in each app; B's segments point at A's exit spans."""
    assert all(r.status == 200 for r in results), Counter((r.status, r.error) for r in results)
    calls = sum(r.path == "/call" for r in results)
    a_segs = wait_segments(col, len(results), a_service)
    b_segs = wait_segments(col, calls, b_service)
    quiet_for(col, 0.5)
    a_segs, b_segs = segments_of(col, a_service), segments_of(col, b_service)
    assert len(a_segs) == len(results)
    assert len(b_segs) == calls
    assert len({s["traceSegmentId"] for s in a_segs + b_segs}) == len(a_segs) + len(b_segs)

    # The requests that carried sw8 continue the client's trace, one segment each.
    traced = Counter(r.trace_id for r in results if r.trace_id)
    assert Counter(s["traceId"] for s in a_segs if s["traceId"] in traced) == traced

    # Worker instances: named after their slots, each announced with its pid and slot.
    assert {s["serviceInstance"] for s in a_segs} <= {f"{a_service}-w{i}" for i in range(a.workers)}
    assert {s["serviceInstance"] for s in b_segs} <= {f"{b_service}-w{i}" for i in range(b.workers)}
    for server, service in ((a, a_service), (b, b_service)):
        check_announced(col, server, service)

    # Cross-application references: each /call exit span in A is the parent of one B segment.
    by_parent = {}
    for seg in b_segs:
        refs = entry_span(seg).get("refs", [])
        assert len(refs) == 1, seg
        by_parent[(refs[0]["parentTraceSegmentId"], int(refs[0].get("parentSpanId", 0)))] = (seg, refs[0])
    matched = 0
    for seg in a_segs:
        entry = entry_span(seg)
        exits = exit_spans(seg)
        if entry["operationName"] != "/call":
            assert not exits
            continue
        assert len(exits) == 1, seg
        child, ref = by_parent.pop((seg["traceSegmentId"], int(exits[0].get("spanId", 0))))
        assert child["traceId"] == seg["traceId"]
        assert ref["parentService"] == a_service
        assert ref["parentServiceInstance"] == seg["serviceInstance"]
        assert ref["parentEndpoint"] == "/call"
        assert ref["networkAddressUsedAtPeer"] == f"127.0.0.1:{b.port}"
        assert exits[0]["peer"] == f"127.0.0.1:{b.port}"
        matched += 1
    assert matched == calls and not by_parent


def announced(col: CollectorProcess) -> dict[tuple[str, str], list[dict[str, str]]]:
    """Every instance-properties report, per (service, instance), oldest first."""
    out: dict[tuple[str, str], list[dict[str, str]]] = {}
    for p in messages(col, "properties"):
        props = {kv["key"]: kv.get("value", "") for kv in p.get("properties", [])}
        out.setdefault((p["service"], p["serviceInstance"]), []).append(props)
    return out


def check_announced(col: CollectorProcess, server: Server, service: str, timeout: float = 10.0) -> None:
    """Each live worker was announced as ``<service>-w<slot>`` with its own pid and slot.

    In process mode the slots must also be the ones the workers hold in the arena (in
    thread mode the shared arena only names processes, same rule).
    """
    pids = set(server.worker_pids())

    def by_pid() -> dict[int, tuple[str, dict[str, str]]]:
        latest = {}
        for (svc, inst), reports in announced(col).items():
            if svc == service:
                for props in reports:
                    latest[int(props["Process No."])] = (inst, props)
        return latest

    wait_until(lambda: pids <= set(by_pid()), timeout, f"every worker of {service} announced")
    latest = by_pid()
    names = set()
    for pid in pids:
        inst, props = latest[pid]
        assert props["language"] == "python"
        assert inst == f"{service}-w{props['slot']}", (inst, props)
        names.add(inst)
    assert len(names) == len(pids), names  # one instance per live worker
    for slot, pid in server.live_slots().items():
        if pid in pids:
            assert latest[pid][1]["slot"] == str(slot)
