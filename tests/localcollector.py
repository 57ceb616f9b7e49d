"""``swmp collector`` (the product's local backend) as a process, for tests.

    with local_collector(tmp_path) as col:        # free ports, database in tmp_path
        col.get("/api/stats")

Started as ``python -m swmp.collector`` with a ready file; stopped by pid (SIGTERM, then
SIGKILL) also when the test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.servers import REPO_ROOT, Proc


def swmp_traces(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """``swmp traces ARGS`` as a user runs it (exit status 0 asserted unless ``ok=False``)."""
    out = subprocess.run(
        [sys.executable, "-m", "swmp.cli", "traces", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
        check=False,
    )
    if ok:
        assert out.returncode == 0, out.stderr
    return out


@dataclass
class LocalCollector:
    proc: Proc
    grpc_address: str
    http_address: str
    db: Path | None

    @property
    def url(self) -> str:
        return f"http://{self.http_address}"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as resp:
            return json.load(resp)

    def post(self, path: str, body: bytes, content_type: str = "application/json") -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path, body, {"Content-Type": content_type}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def stats(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.get("/api/stats")
        return doc

    def log(self) -> str:
        return self.proc.log()


@contextlib.contextmanager
def local_collector(workdir: Path, *args: str, memory: bool = False) -> Iterator[LocalCollector]:
    workdir.mkdir(parents=True, exist_ok=True)
    ready = workdir / "collector.ready"
    db = None if memory else workdir / "data" / "collector.db"
    argv = [sys.executable, "-m", "swmp.collector", "--grpc-port", "0", "--http-port", "0"]
    argv += ["--ready-file", str(ready), *(["--memory"] if memory else ["--db", str(db)]), *args]
    proc = Proc(argv, {**os.environ, "PYTHONUNBUFFERED": "1"}, workdir / "collector.log")
    proc.start()
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.alive(), f"collector exited:\n{proc.tail()}"
            assert time.monotonic() < deadline, f"collector not ready:\n{proc.tail()}"
            time.sleep(0.02)
        info = json.loads(ready.read_text())
        yield LocalCollector(proc, f"127.0.0.1:{info['grpc_port']}", f"127.0.0.1:{info['http_port']}", db)
    finally:
        proc.stop()
