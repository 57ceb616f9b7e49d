"""Real processes for the CLI tests: a stand-in reporter and ring writers.

Run as a script (``python tests/test_cli_support.py reporter|writer ...``) these are the
other side of an arena, built on ``ipc`` directly: the reporter takes the reporter lock,
heartbeats, optionally drains the rings and publishes the status document a control file
describes; a writer claims a slot and writes records. Imported (as
``tests.test_cli_support``; its fixtures are in ``tests/cli_fixtures.py``) it offers the
helpers that start, wait for and clean up after them. It holds no tests.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import orjson  # noqa: E402

import ipc  # noqa: E402

SEGMENT = 1


# -- helpers for the tests ------------------------------------------------------------------
def env(**extra: str) -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = str(REPO) + (os.pathsep + out["PYTHONPATH"] if out.get("PYTHONPATH") else "")
    out.pop("SW_AGENT_ARENA_DIR", None)
    out.update(extra)
    return out


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """Poll until ``predicate()`` is truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def cli(
    *args: str, extra_env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the real ``swmp`` command line (``python -m swmp.cli``) as a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "swmp.cli", *args],
        check=False,
        cwd=REPO,
        env=env(**(extra_env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cli_json(*args: str, extra_env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    proc = cli(*args, "--json", extra_env=extra_env)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"not JSON (rc {proc.returncode}): {proc.stdout!r} {proc.stderr!r}") from exc


def make_arena(directory: Path, meta: dict[str, Any] | None = None, **kw: Any) -> ipc.Arena:
    """An arena owned by the test process (alive for the whole test), as the agent makes it."""
    kw.setdefault("slots", 4)
    kw.setdefault("ring_capacity", 64 * 1024)
    m = {"service": "svc", "instance": "inst", "protocol": "grpc", "backends": ["127.0.0.1:11800"]}
    m.update(meta or {})
    owner = kw.get("owner_pid") or os.getpid()
    return ipc.Arena.create(ipc.arena_path(owner, str(directory)), meta=orjson.dumps(m), **kw)


def document(**over: Any) -> dict[str, Any]:
    """A status document in the reporter's published shape, healthy unless overridden."""
    doc: dict[str, Any] = {
        "v": 1,
        "service": "svc",
        "protocol": "grpc",
        "mode": "process",
        "restarts": 0,
        "backend": {
            "address": "127.0.0.1:11800",
            "state": "ok",
            "last_success_ns": 0,
            "last_error": "",
            "last_error_ns": 0,
            "consecutive_failures": 0,
        },
        "read": {"segment": 0},
        "sent": {"segment": 0},
        "retried": 0,
        "failed": 0,
        "dropped": {"invalid": 0, "backend": 0, "unsupported": 0, "spool": 0},
        "spool": {"enabled": False, "bytes": 0, "cap": 0, "records": 0},
        "pending_bytes": 0,
        "instances": {},
        "rates": {"read_per_s": 0.0, "sent_per_s": 0.0},
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    return doc


class Procs:
    """Starts helper processes and always kills them (by pid) at the end of the test."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self._n = 0

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args],
            cwd=REPO,
            env=env(),
            stdin=subprocess.DEVNULL,
        )
        self.procs.append(proc)
        return proc

    def _ready(self, proc: subprocess.Popen[bytes], ready: Path) -> dict[str, Any]:
        def check() -> Any:
            if proc.poll() is not None:
                raise AssertionError(f"helper {proc.args} exited with {proc.returncode}")
            try:
                return json.loads(ready.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                return None

        return dict(wait_for(check, what=f"helper {proc.pid} to be ready"))

    def reporter(self, arena: ipc.Arena, doc: dict[str, Any] | None = None, **control: Any) -> FakeReporter:
        self._n += 1
        ctl = self.tmp / f"reporter{self._n}.json"
        ready = self.tmp / f"reporter{self._n}.ready"
        rep = FakeReporter(arena, ctl)
        rep.set(doc or document(), **control)
        proc = self._spawn("reporter", "--arena", arena.path, "--control", str(ctl), "--ready", str(ready))
        self._ready(proc, ready)
        rep.proc = proc
        rep.wait_published()
        return rep

    def writer(
        self, arena: ipc.Arena, count: int = 0, size: int = 100, rate: float = 0.0, valid: bool = False
    ) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
        self._n += 1
        ready = self.tmp / f"writer{self._n}.ready"
        proc = self._spawn(
            "writer", "--arena", arena.path, "--count", str(count), "--size", str(size),
            "--rate", str(rate), "--ready", str(ready), *(["--valid"] if valid else []),
        )  # fmt: skip
        return proc, self._ready(proc, ready)

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=30)


class FakeReporter:
    """Test-side handle: change what the stand-in reporter publishes and wait for it."""

    def __init__(self, arena: ipc.Arena, control: Path) -> None:
        self.arena = arena
        self.control = control
        self.gen = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def set(
        self,
        doc: dict[str, Any],
        drain: bool = True,
        success_ago_s: float | None = None,
        error_ago_s: float | None = None,
        heartbeat: bool = True,
    ) -> None:
        """Publish ``doc`` from now on. ``*_ago_s`` keep the backend timestamps relative
        to each publication (a success "0.0 s ago" stays fresh while the test runs);
        ``heartbeat=False`` stops the heartbeat (a hung reporter that still publishes)."""
        self.gen += 1
        body = {
            "gen": self.gen,
            "doc": doc,
            "drain": drain,
            "success_ago_s": success_ago_s,
            "error_ago_s": error_ago_s,
            "heartbeat": heartbeat,
        }
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, self.control)

    def wait_published(self) -> dict[str, Any]:
        def published() -> Any:
            raw = self.arena.status.snapshot().document
            if not raw:
                return None
            doc = orjson.loads(raw)
            return doc if doc.get("gen") == self.gen else None

        return dict(wait_for(published, what=f"status document generation {self.gen}"))

    def update(self, doc: dict[str, Any], **control: Any) -> dict[str, Any]:
        self.set(doc, **control)
        return self.wait_published()


# -- the helper processes ------------------------------------------------------------------
_stop = False


def _on_term(signum: int, frame: Any) -> None:
    global _stop
    _stop = True


def _write_ready(path: str, body: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(body, f)
    os.replace(tmp, path)


def run_reporter(args: argparse.Namespace) -> int:
    arena = ipc.Arena.open(args.arena)
    deadline = time.monotonic() + 15
    while not arena.try_become_reporter():
        if time.monotonic() > deadline:
            return 5
        time.sleep(0.02)
    started = time.time_ns()
    readers = [arena.reader(s) for s in range(arena.slots)]
    read = 0
    control: dict[str, Any] = {}
    mtime = -1.0
    _write_ready(args.ready, {"pid": os.getpid()})
    while not _stop:
        try:
            st = os.stat(args.control)
            if st.st_mtime != mtime:
                with open(args.control) as f:
                    control = json.load(f)
                mtime = st.st_mtime
        except (OSError, ValueError):
            pass
        if control.get("heartbeat", True):
            arena.status.heartbeat()
        if control.get("drain", True):
            for r in readers:
                read += len(r.read())
                r.commit()
        doc = dict(control.get("doc") or {})
        now = time.time_ns()
        backend = dict(doc.get("backend") or {})
        if control.get("success_ago_s") is not None:
            backend["last_success_ns"] = now - int(control["success_ago_s"] * 1e9)
        if control.get("error_ago_s") is not None:
            backend["last_error_ns"] = now - int(control["error_ago_s"] * 1e9)
        doc["backend"] = backend
        doc.setdefault("pid", os.getpid())
        doc.setdefault("started_ns", started)
        doc["gen"] = control.get("gen", 0)
        doc["read"] = {"segment": read}  # what this stand-in really drained
        arena.status.publish(orjson.dumps(doc))
        time.sleep(0.02)
    arena.release_reporter()
    arena.close()
    return 0


def run_writer(args: argparse.Namespace) -> int:
    arena = ipc.Arena.open(args.arena)
    writer = arena.claim_slot()
    if writer is None:
        return 6
    n = 0

    def payload() -> bytes:
        nonlocal n
        n += 1
        if not args.valid:
            return b"x" * args.size
        # A well-formed SEGMENT record (reporter_proc.records), for a real reporter.
        now = int(time.time() * 1000)
        span = [0, -1, now, now + 1, "/op", "", 0, 3, 7000, False, False, [], [], []]
        return orjson.dumps([f"t{os.getpid()}.{n}", f"s{os.getpid()}.{n}", "svc", "inst", False, [span]])

    ok = sum(writer.write(SEGMENT, payload()) for _ in range(args.count))
    _write_ready(args.ready, {"pid": os.getpid(), "slot": writer.slot, "ok": ok})
    pause = 1.0 / args.rate if args.rate > 0 else 0.5
    while not _stop:
        if args.rate > 0:
            writer.write(SEGMENT, payload())
        time.sleep(pause)
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["reporter", "writer"])
    p.add_argument("--arena", required=True)
    p.add_argument("--ready", required=True)
    p.add_argument("--control")
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--rate", type=float, default=0.0)
    p.add_argument("--valid", action="store_true", help="write real SEGMENT records")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, _on_term)
    return run_reporter(args) if args.role == "reporter" else run_writer(args)


if __name__ == "__main__":
    sys.exit(main())
