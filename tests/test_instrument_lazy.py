"""Lazy instrumentation: libraries are patched on their first import, not at agent start.

Every scenario runs in a fresh interpreter (``sys.modules`` must not already hold the
libraries, as it does in this pytest process). The child prints one JSON line of findings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from reporter_proc import records as R

ROOT = Path(__file__).resolve().parent.parent
LIBS = ("flask", "django", "requests", "httpx", "starlette", "urllib3")

# Common prelude of the child scripts: an in-memory sink, tracing configured, debug logs of
# "swmp" on stderr, and helpers to print findings.
PRELUDE = """
import json, logging, sys, threading
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s|%(levelname)s|%(message)s")
import orjson
from swmp import _sink, instrument, tracing
from swmp.config import load
from swmp.instrument import _hook
from swmp.instrument._patch import is_patched

sink = _sink.MemorySink()
_sink.set_sink(sink)

def configure(**kw):
    cfg = load(None, agent_log_reporter_active=False, **kw)  # SW_* from the environment
    tracing.configure(cfg)
    return cfg

def segments():
    return [orjson.loads(p) for t, p in list(sink.records) if t == 1]

def loaded(names):
    return [n for n in names if n in sys.modules]

def report(**kw):
    print(json.dumps(kw))
"""


def run_child(body: str, env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    code = PRELUDE + textwrap.dedent(body)
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("SW_")}
    full_env = {**inherited, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=full_env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    return json.loads(last), proc.stderr


class _Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.seen.append({k.lower(): v for k, v in self.headers.items()})  # type: ignore[attr-defined]
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def echo() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A plain HTTP server on 127.0.0.1 recording the request headers it received."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    srv.seen = []  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", srv.seen  # type: ignore[attr-defined]
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def test_agent_start_imports_no_instrumented_library(tmp_path: Path) -> None:
    out, err = run_child(
        f"""
        import swmp
        swmp.start(agent_name="lazy", agent_reporter_process=False, agent_logging_level="DEBUG",
                   agent_collector_backend_services="127.0.0.1:1", agent_arena_dir={str(tmp_path)!r})
        found = dict(libs=loaded({LIBS!r}), statuses=instrument.statuses(),
                     pending=list(_hook.pending()), hooked=_hook.active())
        swmp.stop()
        report(**found)
        """
    )
    assert out["libs"] == []
    st = out["statuses"]
    for name in ("flask", "django", "starlette", "requests", "urllib3", "httpx"):
        assert st[name] == "deferred", st
    assert st["logging"] == "installed"
    assert out["hooked"] is True
    assert set(out["pending"]) >= {"flask", "django", "requests", "httpx"}
    assert "deferred until imported" in err


def test_requests_imported_after_start_is_patched(echo: tuple[str, list[dict[str, str]]]) -> None:
    url, seen = echo
    out, err = run_child(
        f"""
        instrument.install_all(configure())
        before = loaded(["requests", "urllib3"])
        import requests
        import swmp
        with swmp.entry_span("/in"):
            resp = requests.get({url + "/out?q=1"!r}, timeout=10)
        report(before=before, status=resp.status_code, segments=segments(),
               patched=is_patched(requests.Session, "send"), statuses=instrument.statuses())
        """
    )
    assert out["before"] == []
    assert out["patched"] is True
    assert out["statuses"]["requests"] == out["statuses"]["urllib3"] == "installed"
    assert out["status"] == 200
    (seg,) = out["segments"]
    exits = [s for s in seg[R.SEG_SPANS] if s[R.SPAN_TYPE] == R.SPAN_TYPE_EXIT]
    assert len(exits) == 1  # requests records it; urllib3 and http.client below stay quiet
    (ex,) = exits
    assert ex[R.SPAN_COMPONENT] == 7002 and ex[R.SPAN_OPERATION] == "/out"
    assert ex[R.SPAN_PEER] == url.removeprefix("http://")
    (headers,) = seen
    assert headers["sw8"].split("-")[1]  # a well-formed sw8 went out
    assert "requests imported; requests instrumentation installed" in err


def test_flask_imported_after_start_instruments_its_apps() -> None:
    out, _ = run_child(
        """
        instrument.install_all(configure())
        assert "flask" not in sys.modules
        import flask
        app = flask.Flask("lazy")

        @app.route("/items/<int:n>")
        def item(n):
            return str(n)

        with app.test_client().get("/items/7") as resp:  # closing ends the segment (PEP 3333)
            body = resp.data.decode()
        report(body=body, segments=segments(), patched=is_patched(flask.Flask, "wsgi_app"))
        """
    )
    assert out["body"] == "7" and out["patched"] is True
    (seg,) = out["segments"]
    (entry,) = seg[R.SEG_SPANS]
    assert entry[R.SPAN_TYPE] == R.SPAN_TYPE_ENTRY
    assert entry[R.SPAN_COMPONENT] == 7001


def test_concurrent_imports_patch_exactly_once_and_nobody_sees_it_unpatched() -> None:
    out, _ = run_child(
        """
        import time
        import swmp.instrument.requests as plugin
        calls = []
        real_install = plugin.install

        def counting_install(config):
            calls.append(threading.get_ident())
            time.sleep(0.2)  # widens the window in which other threads would race the patch
            real_install(config)

        plugin.install = counting_install
        instrument.install_all(configure())
        n = 8
        barrier = threading.Barrier(n)
        seen = []

        def worker():
            barrier.wait()
            import requests
            seen.append(is_patched(requests.Session, "send"))

        threads = [threading.Thread(target=worker) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        report(calls=len(calls), seen=seen)
        """
    )
    assert out["calls"] == 1
    assert out["seen"] == [True] * 8


def test_failing_install_is_logged_and_the_import_still_succeeds() -> None:
    out, err = run_child(
        """
        import swmp.instrument.flask as plugin

        def broken(config):
            raise RuntimeError("cannot patch flask")

        plugin.install = broken
        instrument.install_all(configure())
        # A hook that itself raises (not just the instrumentation) must not break the import.
        def bad_hook():
            raise ValueError("hook exploded")
        _hook.defer("colorsys", bad_hook, key="bad")
        import flask
        import colorsys
        app = flask.Flask("ok")
        report(app=app.name, flask_status=instrument.statuses()["flask"],
               patched=is_patched(flask.Flask, "wsgi_app"), hsv=colorsys.rgb_to_hsv(1, 0, 0))
        """
    )
    assert out["app"] == "ok"
    assert out["patched"] is False
    assert out["flask_status"].startswith("failed") and "cannot patch flask" in out["flask_status"]
    assert out["hsv"] == [0.0, 1.0, 1.0]
    assert err.count("installing the flask instrumentation failed") == 1
    assert err.count("the post-import hook 'bad' for colorsys failed") == 1


def test_disabled_and_unsupported_versions_behave_as_before() -> None:
    out, err = run_child(
        """
        import swmp.instrument.httpx as hx
        hx.SUPPORTED = ("999", "")  # the installed httpx is "too old": checked at import time
        st = instrument.install_all(configure())
        after_start = dict(st)
        import httpx, requests
        report(start=after_start, now=instrument.statuses(), pending=list(_hook.pending()),
               httpx_patched=is_patched(httpx.Client, "send"),
               requests_patched=is_patched(requests.Session, "send"))
        """,
        env={"SW_AGENT_DISABLE_PLUGINS": "req*"},
    )
    assert out["start"]["requests"] == "disabled"
    assert out["start"]["httpx"] == "deferred"  # no version was read at start
    assert out["now"]["httpx"].startswith("unsupported version")
    assert out["httpx_patched"] is False and out["requests_patched"] is False
    assert "requests" not in out["pending"] and "httpx" not in out["pending"]
    assert "outside the supported range" in err


def test_already_imported_installs_now_and_the_finder_leaves_when_done() -> None:
    out, _ = run_child(
        """
        import requests  # before the agent: patched at once
        st = instrument.install_all(configure())
        first = dict(st=st, pending=list(_hook.pending()), hooked=_hook.active())
        import flask, httpx, starlette.applications, django.core.handlers.wsgi, http.client
        # Every other pending trigger too (hooks may defer further modules, e.g. Django's
        # ASGI handler), so the finder has nothing left to wait for.
        import importlib
        for _ in range(5):
            for name in _hook.pending():
                importlib.import_module(name)
        report(first=first, now=instrument.statuses(), hooked=_hook.active(),
               in_meta_path=any(type(f).__name__ == "PostImportFinder" for f in sys.meta_path))
        """
    )
    assert out["first"]["st"]["requests"] == "installed"
    assert "requests" not in out["first"]["pending"]
    assert out["first"]["hooked"] is True
    for name in ("flask", "django", "starlette", "requests", "urllib3", "http.client", "httpx", "loguru"):
        assert out["now"][name] == "installed", out["now"]
    assert out["hooked"] is False and out["in_meta_path"] is False


def test_uninstall_all_clears_pending_hooks() -> None:
    out, _ = run_child(
        """
        instrument.install_all(configure())
        instrument.install_all(configure())  # twice: still one hook per library
        had = len(_hook._pending["requests"])
        instrument.uninstall_all()
        import requests
        report(had=had, pending=list(_hook.pending()), hooked=_hook.active(),
               patched=is_patched(requests.Session, "send"))
        """
    )
    assert out["had"] == 1
    assert out["pending"] == [] and out["hooked"] is False and out["patched"] is False


def test_loading_every_instrumentation_module_imports_no_asyncio() -> None:
    """The agent imports every instrumentation module at start (in the master and so in every
    worker): none may pull asyncio or concurrent.futures in before the application does
    (several MiB per process; the reporter loads asyncio itself, after its fork)."""
    import subprocess

    code = (
        "import importlib, sys\n"
        "import swmp.instrument as I\n"
        "import swmp.profiling.gate\n"
        "for m in I.MODULES: importlib.import_module(m)\n"
        "print(sorted(m for m in ('asyncio', 'concurrent.futures') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
