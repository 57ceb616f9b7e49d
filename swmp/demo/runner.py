"""``swmp demo``: a first run that ends with trace trees on the screen.

Processes, each in its own session (so Ctrl-C reaches only the demo, which then stops them
in order: applications first, so their reporters flush, then the collector)::

    swmp demo
     |- swmp collector                  (unless --oap)
     |- swmp run -- gunicorn -w 2 examples.inventory:app   service demo-inventory
     `- swmp run -- gunicorn -w 4 examples.app:app          service demo-frontend

Everything temporary (arena directory, ready file, server logs) lives in one temporary
directory that is removed at the end; what stays is the collector's database.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType

import psutil

from swmp.demo.load import Load, request_plan
from swmp.traceview import render
from swmp.traceview.model import TraceSummary
from swmp.traceview.sources import CollectorSource, Filters, OapSource, Source, SourceError

FRONTEND = "demo-frontend"
INVENTORY = "demo-inventory"
_STOP_TIMEOUT_S = 20.0


class DemoError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _examples_root() -> Path:
    """The checkout holding ``examples/`` (swmp is installed editable from it)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "examples" / "app.py").exists():
        raise DemoError(f"examples/ not found next to swmp ({root}); run the demo from a checkout")
    return root


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the demo dies, even by SIGKILL (Linux
    prctl PR_SET_PDEATHSIG), so no server outlives a demo that could not clean up."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


class _Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> None:
        self.name = name
        self.log = log
        with open(log, "wb") as out:
            self.popen = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                # the demo starts its processes before it starts any thread
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,  # noqa: PLW1509
            )

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, sig)

    def wait(self, timeout: float) -> bool:
        try:
            self.popen.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = sys.stdout
        self.procs: list[_Proc] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="swmp-demo-"))
        self.arenas = self.tmp / "arenas"
        self.arenas.mkdir(mode=0o700)
        self.collector_url = ""
        self.keep_collector = False
        self.load = Load(self.out, args.concurrency)

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    # -- the steps -------------------------------------------------------------------------
    def run(self) -> int:
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        code = 1
        try:
            code = self._run()
        except KeyboardInterrupt:
            self.say("\ninterrupted: stopping the demo's processes")
            code = 130
        except DemoError as exc:
            self.say(f"swmp demo: {exc}")
            code = 1
        finally:
            self.load.stop()
            try:
                self._stop_all()
                self.load.join()
            finally:
                signal.signal(signal.SIGTERM, previous)
        return code

    def _run(self) -> int:
        t0 = time.monotonic()
        root = _examples_root()
        missing = [m for m in ("gunicorn", "flask") if importlib.util.find_spec(m) is None]
        if missing:
            raise DemoError(
                f"the demo needs {' and '.join(missing)}: run `bash scripts/install.sh` "
                "(or pip install -e '.[demo]')"
            )
        a = self.args
        if a.oap:
            backend = a.oap
            host = a.oap.rsplit(":", 1)[0]
            query_url = a.oap_query or f"http://{host}:12800"
            source: Source = OapSource(query_url)
            self.say(f"Reporting to the SkyWalking OAP at {backend}")
        else:
            backend, http = self._start_collector()
            self.collector_url = f"http://{http}"
            source = CollectorSource(self.collector_url)
            self.say(f"Collector: gRPC {backend}, page {self.collector_url}/")
        if a.protocol == "http":
            backend = f"{a.oap.rsplit(':', 1)[0]}:12800" if a.oap else http
        inv_port, app_port = _free_port(), _free_port()
        common = {
            "SW_AGENT_COLLECTOR_BACKEND_SERVICES": backend,
            "SW_AGENT_PROTOCOL": a.protocol,
            "SW_AGENT_ARENA_DIR": str(self.arenas),
            "SW_AGENT_REPORTER_FLUSH_INTERVAL": "0.2",
        }
        inventory = "examples.inventory:app"
        self._start_app(INVENTORY, inventory, port=inv_port, workers=2, extra=common, root=root)
        self._start_app(
            FRONTEND,
            "examples.app:app",
            port=app_port,
            workers=a.workers,
            extra={**common, "DOWNSTREAM_URL": f"http://127.0.0.1:{inv_port}/stock"},
            root=root,
        )
        base = f"http://127.0.0.1:{app_port}"
        for port in (inv_port, app_port):
            self._wait_http(
                f"http://127.0.0.1:{port}/pid" if port == app_port else f"http://127.0.0.1:{port}/stock"
            )
        self.say(
            f"Started {FRONTEND} ({a.workers} workers, {base}) and {INVENTORY} (2 workers) under swmp run"
        )

        plan = request_plan(max(1, a.requests))
        failed = self.load.send(base, plan)
        fanouts = sum(1 for p in plan if p.startswith("/call"))
        expected = len(plan) + fanouts  # one segment per request per process it went through
        self.say(
            f"Sent {len(plan)} requests ({fanouts} fan out to {INVENTORY}, {failed} answered with an error)"
        )
        self._wait_delivered(source, expected)

        self.say("\n$ swmp status")
        from swmp import cli  # noqa: PLC0415 (the CLI imports the demo lazily too)

        cli.main(["status", "--dir", str(self.arenas), "--interval", "0.5"])
        crossing, failing = self._pick_traces(source)
        for title, trace in (("A trace across both services", crossing), ("A trace with an error", failing)):
            if trace is None:
                self.say(f"\n{title}: none found")
                continue
            self.say(f"\n{title}:  swmp traces {trace.trace_id}" + (f" --oap {query_url}" if a.oap else ""))
            spans = source.trace(trace.trace_id)
            color = self.out.isatty() and not os.environ.get("NO_COLOR")
            self.say("\n".join(render.trace_tree(trace.trace_id, spans, color=color)))
        if self.collector_url and crossing is not None:
            self.say(f"\nTrace page: {self.collector_url}/#/trace/{crossing.trace_id}")
        self.say(f"\nDemo done in {time.monotonic() - t0:.1f} s.")
        if self.collector_url:
            if a.keep:
                self.keep_collector = True
            else:
                again = "swmp collector" + (f" --db {a.db}" if a.db else "")
                if a.http_port != 12800 or a.grpc_port != 11800:
                    again += f" --grpc-port 0 --http-port {self.collector_url.rsplit(':', 1)[1]}"
                self.say(
                    f"The collector stopped with the demo; its data stays. Browse it again: `{again}`, "
                    f"then open the page (or run `swmp demo --keep`)."
                )
        return 0

    # -- processes -------------------------------------------------------------------------
    def _start_collector(self) -> tuple[str, str]:
        a = self.args
        ready = self.tmp / "collector.ready"
        argv = [
            sys.executable,
            "-m",
            "swmp.collector",
            "--grpc-port",
            str(a.grpc_port),
            "--http-port",
            str(a.http_port),
            "--ready-file",
            str(ready),
        ]
        if a.db:
            argv += ["--db", a.db]
        proc = _Proc("collector", argv, dict(os.environ), self.tmp / "collector.log", Path.cwd())
        self.procs.append(proc)
        deadline = time.monotonic() + 20
        while not ready.exists():
            if proc.popen.poll() is not None:
                raise DemoError(
                    f"the collector did not start:\n{proc.tail()}\n(ports {a.grpc_port}/{a.http_port} taken? "
                    "Try `swmp demo --grpc-port 0 --http-port 0`, or `--oap HOST:PORT` for a running OAP)"
                )
            if time.monotonic() > deadline:
                raise DemoError(f"the collector did not become ready in 20 s:\n{proc.tail()}")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        return f"127.0.0.1:{info['grpc_port']}", f"127.0.0.1:{info['http_port']}"

    def _start_app(
        self, service: str, app: str, *, port: int, workers: int, extra: dict[str, str], root: Path
    ) -> None:
        env = {**os.environ, **extra, "SW_AGENT_NAME": service}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
        argv = [
            sys.executable,
            "-m",
            "swmp.cli",
            "run",
            "--",
            sys.executable,
            "-m",
            "gunicorn",
            "-w",
            str(workers),
            "-b",
            f"127.0.0.1:{port}",
            "--graceful-timeout",
            "5",
            app,
        ]
        self.procs.append(_Proc(service, argv, env, self.tmp / f"{service}.log", root))

    def _wait_http(self, url: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for p in self.procs:
                if p.popen.poll() is not None:
                    raise DemoError(f"{p.name} exited with status {p.popen.returncode}:\n{p.tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise DemoError(f"{url} did not answer within {timeout:.0f} s")
            time.sleep(0.1)

    def _stop_all(self) -> None:
        apps = [p for p in self.procs if p.name != "collector"]
        for p in apps:
            p.signal(signal.SIGTERM)
        for p in apps:
            if not p.wait(_STOP_TIMEOUT_S):
                self.say(f"{p.name} did not stop in {_STOP_TIMEOUT_S:.0f} s: killing it")
                p.signal(signal.SIGKILL)
                p.wait(5)
        self._wait_agents()
        collector = [p for p in self.procs if p.name == "collector"]
        if collector and self.keep_collector and collector[0].popen.poll() is None:
            self.say(f"Collector still running at {self.collector_url}/ : Ctrl-C to stop it.")
            with contextlib.suppress(KeyboardInterrupt):
                while collector[0].popen.poll() is None:
                    time.sleep(0.5)
        for p in collector:
            p.signal(signal.SIGTERM)
            if not p.wait(10):
                p.signal(signal.SIGKILL)
                p.wait(5)
        # The agents' files are in their private directory inside (which stays: it is empty).
        leftovers = sorted(str(x.relative_to(self.arenas)) for x in self.arenas.rglob("*") if not x.is_dir())
        if leftovers:
            self.say(
                f"warning: the agents left files behind in their arena directory: {', '.join(leftovers)}"
            )
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _agent_processes(self) -> list[psutil.Process]:
        """The agents' supervisors and reporters: their titles name the arena directory."""
        found = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if str(self.arenas) in " ".join(p.cmdline()):
                    found.append(p)
        return found

    def _wait_agents(self, timeout: float = _STOP_TIMEOUT_S) -> None:
        """A reporter outlives its server by its flush deadline; wait for it (it is still
        sending to the collector), and kill what is left after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._agent_processes():
                return
            time.sleep(0.1)
        for p in self._agent_processes():
            self.say(f"agent process {p.pid} did not stop in {timeout:.0f} s: killing it")
            with contextlib.suppress(psutil.Error):
                p.kill()

    # -- results ---------------------------------------------------------------------------
    def _wait_delivered(self, source: Source, expected: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        if isinstance(source, CollectorSource):
            got = 0
            while time.monotonic() < deadline:
                with (
                    contextlib.suppress(OSError, ValueError),
                    urllib.request.urlopen(self.collector_url + "/api/stats", timeout=5) as resp,
                ):
                    got = int(json.load(resp)["received"].get("segment", 0))
                if got >= expected:
                    self.say(f"The collector has all {got} segments.")
                    return
                time.sleep(0.2)
            self.say(f"warning: the collector has {got} of {expected} segments after {timeout:.0f} s")
            return
        while time.monotonic() < deadline:  # an OAP: wait until both kinds of trace are queryable
            with contextlib.suppress(SourceError):
                if all(self._pick_traces(source)):
                    return
            time.sleep(1.0)
        self.say(f"warning: the OAP does not show both traces after {timeout:.0f} s")

    def _pick_traces(self, source: Source) -> tuple[TraceSummary | None, TraceSummary | None]:
        """(a successful trace through both services, a trace with an error, preferably across both)."""
        calls = source.recent(Filters(endpoint="/call", limit=100, minutes=15))
        crossing = failing = None
        for t in calls:
            if crossing is not None and failing is not None:
                break
            services = set(t.services) or {s.service for s in source.trace(t.trace_id)}
            if not {FRONTEND, INVENTORY} <= services:
                continue
            if t.is_error and failing is None:
                failing = t
            elif not t.is_error and crossing is None:
                crossing = t
        if failing is None:
            errors = source.recent(Filters(errors_only=True, limit=1, minutes=15))
            failing = errors[0] if errors else None
        return crossing, failing


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
