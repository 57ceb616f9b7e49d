"""The demo's load: the requests it sends, from a few daemon threads, with a progress line.

Why not a ThreadPoolExecutor: Ctrl-C raises KeyboardInterrupt wherever the main thread is,
and ``pool.map`` spends its first second submitting every request while holding the
executor's locks. Interrupted inside one of those ``with`` blocks, it left
concurrent.futures' global lock held, and the interpreter's exit hook, which takes it, hung
the demo after it had stopped everything (seen in a test run; the same pattern alone hangs
about 2 runs in 100). Here the main thread only sleeps while the load runs, and the load
threads are daemons that stop taking requests once told to.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from typing import TextIO

__all__ = ["Load", "request_plan"]


def request_plan(n: int) -> list[str]:
    """The paths to send: most succeed, a quarter fan out to the inventory, some fail."""
    plan = []
    for i in range(n):
        k = i % 20
        if k in (0, 5, 10, 15):
            plan.append("/call?item=widget")
        elif k == 7:
            plan.append("/call?item=discontinued")  # fails in the inventory: error across services
        elif k == 13:
            plan.append("/error")
        elif k % 2:
            plan.append("/io")
        else:
            plan.append("/cpu")
    return plan


class Load:
    """``send`` runs a plan from ``concurrency`` daemon threads; ``stop`` (from the main
    thread's Ctrl-C handling) ends it after the requests in flight; ``join`` waits for them."""

    def __init__(self, out: TextIO, concurrency: int) -> None:
        self.out = out
        self.concurrency = max(1, concurrency)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def send(self, base: str, plan: list[str]) -> int:
        """Send ``plan`` to ``base``; returns how many answered with an error."""
        progress = _Progress(self.out, len(plan), self._stop)
        stop = self._stop
        todo = iter(plan)
        lock = threading.Lock()
        running = [self.concurrency]
        finished = threading.Event()

        def next_path() -> str | None:
            with lock:
                return None if stop.is_set() else next(todo, None)

        def load() -> None:
            try:
                while (path := next_path()) is not None:
                    progress.done(_request(base + path))
            finally:
                with lock:
                    running[0] -= 1
                    if running[0] == 0:
                        finished.set()

        self._threads = [
            threading.Thread(target=load, name=f"swmp-demo-load-{i}", daemon=True) for i in range(running[0])
        ]
        for t in self._threads:
            t.start()
        try:
            while not finished.is_set():
                time.sleep(0.05)  # where Ctrl-C lands during the load
        except BaseException:
            stop.set()
            raise
        progress.end()
        return progress.failed

    def stop(self) -> None:
        """Send no more requests (those in flight finish)."""
        self._stop.set()

    def join(self, timeout: float = 20.0) -> None:
        """After a stop: let the threads finish the request each had in flight (the servers
        are stopped by now, so it fails at once or times out in 15 s), so none is still
        writing to stdout while the interpreter exits."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t.ident is not None:  # a Ctrl-C in the middle of send's start loop leaves the rest unstarted
                t.join(max(0.0, deadline - time.monotonic()))


def _request(url: str) -> bool:
    """One GET; True when it was answered with a success."""
    try:
        with urllib.request.urlopen(url, timeout=15) as resp:
            resp.read()
        return True
    except urllib.error.HTTPError as exc:
        exc.read()
        return False
    except OSError:
        return False


class _Progress:
    """The progress of the load: a bar redrawn in place on a terminal, a line per quarter in
    a log file (not a line per request)."""

    _WIDTH = 30

    def __init__(self, out: TextIO, total: int, stop: threading.Event) -> None:
        self.out = out
        self.total = total
        self.stop = stop
        self.tty = out.isatty()
        self.finished = 0
        self.failed = 0
        self._shown = -1
        self._lock = threading.Lock()

    def done(self, ok: bool) -> None:
        with self._lock:
            self.finished += 1
            self.failed += not ok
            if self.stop.is_set():  # interrupted: the demo is printing its own lines now
                return
            width = self._WIDTH
            filled = self.finished * width // self.total
            bar = "#" * filled + "." * (width - filled)
            if self.tty:
                print(
                    f"\r[{bar}] {self.finished}/{self.total} requests, {self.failed} errors",
                    end="",
                    file=self.out,
                    flush=True,
                )
                return
            step = self.finished * 4 // self.total
            if step != self._shown:
                self._shown = step
                print(f"[{bar}] {self.finished}/{self.total} requests", file=self.out, flush=True)

    def end(self) -> None:
        if self.tty:
            print(file=self.out, flush=True)
