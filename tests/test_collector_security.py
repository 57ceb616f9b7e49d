"""``swmp collector`` and ``swmp traces`` against hostile input, on a real collector process:
browsers kept out of the API (DNS rebinding, cross-site POSTs), no MIME sniffing, no terminal
escapes from trace data, no runaway threads, and a database path that is never followed
through a planted symbolic link (docs/collector.md, "Security")."""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import select
import socket
import sqlite3
import stat
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from swmp.collector.http_server import MAX_CONNECTIONS
from swmp.collector.store import MAX_LIMIT, Store
from swmp.traceview.oap import MAX_ANSWER
from tests.localcollector import LocalCollector, local_collector, swmp_traces
from tests.servers import wait_until

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCollector]:
    with local_collector(tmp_path_factory.mktemp("sec-collector"), "--allow-host", "devbox.lan") as col:
        yield col


def _request(
    col: LocalCollector, method: str, path: str, headers: dict[str, str], body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    host, port = col.http_address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_page_and_api_refuse_a_foreign_host(collector: LocalCollector) -> None:
    """A web site that rebinds its DNS name to 127.0.0.1 sends its own name as Host: the
    API must not hand it the traces."""
    port = collector.http_address.split(":")[1]
    for path in ("/", "/api/stats", "/api/traces", "/api/trace/x"):
        status, _, body = _request(collector, "GET", path, {"Host": f"evil.example:{port}"})
        assert status == 403 and json.loads(body)["error"] == "bad_host", (path, status, body)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "[::1]", "devbox.lan", "DevBox.LAN.:80"):
        status, _, _ = _request(collector, "GET", "/api/stats", {"Host": host})
        assert status == 200, host
    assert collector.stats()["refused"]["bad_host"] == 4


def test_receivers_refuse_a_post_from_a_web_page(collector: LocalCollector) -> None:
    """Browsers send Origin on every POST, agents never: a cross-site (or rebinding) page
    cannot write traces into the collector."""
    segment = {"traceId": "csrf-1", "traceSegmentId": "csrf-1.0", "service": "csrf"}
    status, _, body = _request(
        collector,
        "POST",
        "/v3/segment",
        {"Content-Type": "application/json", "Origin": "http://evil.example"},
        json.dumps(segment).encode(),
    )
    assert status == 403 and json.loads(body)["error"] == "cross_origin"
    assert collector.get("/api/traces?service=csrf") == []
    # the same POST from an agent (no Origin) is taken
    assert collector.post("/v3/segment", json.dumps(segment).encode())[0] == 200


def test_answers_forbid_sniffing_and_framing(collector: LocalCollector) -> None:
    for path, ctype in (("/", "text/html; charset=utf-8"), ("/api/stats", "application/json")):
        status, headers, _ = _request(collector, "GET", path, {})
        assert status == 200 and headers["content-type"] == ctype
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in _request(collector, "GET", "/", {})[1]["content-security-policy"]
    _, headers, _ = _request(collector, "POST", "/v3/nowhere", {"Content-Type": "application/json"}, b"[]")
    assert headers["x-content-type-options"] == "nosniff"


EVIL = "\x1b]0;pwned\x07\x1b[2J\r\x9b1m\u202e"


def test_swmp_traces_prints_no_terminal_escapes(collector: LocalCollector) -> None:
    """Span names, services, peers and tags come from whoever reported: an ESC, CR or BEL in
    them reaching the terminal would rewrite it. They are printed as escapes."""
    segment = {
        "traceId": "esc" + EVIL,
        "traceSegmentId": "esc.0",
        "service": "esc-svc" + EVIL,
        "serviceInstance": "i" + EVIL,
        "spans": [
            {
                "spanId": 0,
                "parentSpanId": -1,
                "startTime": 1700000000000,
                "endTime": 1700000000005,
                "operationName": "op" + EVIL,
                "peer": "peer" + EVIL,
                "spanType": "Entry",
                "tags": [{"key": "http.status_code", "value": "500" + EVIL}],
            }
        ],
    }
    assert collector.post("/v3/segment", json.dumps(segment).encode())[0] == 200
    listed = swmp_traces("--collector", collector.url, "--service", "esc-svc" + EVIL).stdout
    tree = swmp_traces("--collector", collector.url, "--service", "esc-svc" + EVIL, "--last").stdout
    for out in (listed, tree):
        assert not any(c in out for c in "\x1b\x07\r\x9b\u202e"), repr(out)
        assert "\\x1b]0;pwned\\x07\\x1b[2J\\x0d\\x9b1m\\u202e" in out, out
    assert "op\\x1b" in tree and "peer\\x1b" in tree and "status 500\\x1b" in tree


def test_refusal_log_carries_no_terminal_escapes(collector: LocalCollector) -> None:
    """The first refusal of a kind is logged with the path it came to: the path is the
    sender's, so it must not bring an ESC into the collector's terminal."""
    host, port = collector.http_address.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v3/segments?\x1b]0;pwned\x07 HTTP/1.1\r\nHost: x\r\n\r\n")  # no length
        assert s.recv(100).startswith(b"HTTP/1.1 411")
    wait_until(lambda: "no_length" in collector.log(), 10, "the refusal in the log")
    log = collector.log()
    assert "\x1b" not in log and "\x07" not in log
    assert "/v3/segments?\\x1b]0;pwned\\x07" in log


def test_connections_are_capped(collector: LocalCollector) -> None:
    """Clients that connect and say nothing hold a thread each: past the cap, a connection is
    closed on arrival and counted, and the collector serves again once they go."""
    host, port = collector.http_address.split(":")
    extra = 5
    socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(MAX_CONNECTIONS + extra)]
    try:

        def closed() -> int:  # connections the collector closed (EOF readable)
            readable, _, _ = select.select(socks, [], [], 0)
            return sum(1 for s in readable if s.recv(1, socket.MSG_PEEK) == b"")

        # (the others are closed too, past their deadline, but not counted: they sent nothing)
        wait_until(lambda: closed() >= extra, 30, f"{extra} connections closed by the collector")
    finally:
        for s in socks:
            s.close()
    wait_until(lambda: _healthy(collector), 30, "the collector to serve again")
    assert collector.stats()["refused"]["too_many_connections"] == extra


def test_deeply_nested_json_is_refused_and_counted(collector: LocalCollector) -> None:
    """``[[[[...`` past the interpreter's recursion limit raised RecursionError in the
    handler thread: a traceback in the log, no answer, nothing counted."""
    before = collector.stats()["refused"].get("bad_json", 0)
    status, body = collector.post("/v3/segments", b"[" * 200_000)
    assert status == 400 and body["error"] == "bad_json" and "nested too deeply" in body["detail"]
    assert collector.stats()["refused"]["bad_json"] == before + 1
    assert "Traceback" not in collector.log() and "RecursionError" not in collector.log()


def test_api_limit_is_capped_and_checked(tmp_path: Path) -> None:
    """``/api/logs?limit=1000000000`` built an answer of every log in the store (up to the
    whole 256 MiB) in memory; a limit that was not a number was taken as the default, a
    negative one too. Now: at most ``MAX_LIMIT`` rows, and 400 ``bad_parameter`` for junk."""
    n = MAX_LIMIT + 5
    with local_collector(tmp_path, memory=True) as col:
        segments = [
            {"traceId": f"lim-{i}", "traceSegmentId": f"lim-{i}.0", "service": "lim"} for i in range(n)
        ]
        logs = [{"service": "lim", "body": {"text": {"text": f"line {i}"}}} for i in range(n)]
        assert col.post("/v3/segments", json.dumps(segments).encode()) == (200, {})
        assert col.post("/v3/logs", json.dumps(logs).encode()) == (200, {})
        for path, default in (("/api/logs", 200), ("/api/traces", 50)):
            assert len(col.get(path)) == default
            assert len(col.get(f"{path}?limit=")) == default
            assert len(col.get(f"{path}?limit=7")) == 7
            assert len(col.get(f"{path}?limit=007")) == 7
            for big in (MAX_LIMIT + 1, 1_000_000_000, "9" * 5000):
                assert len(col.get(f"{path}?limit={big}")) == MAX_LIMIT, (path, str(big)[:20])
            for bad in ("-1", "0", "ten", "2.5", "%2B5", "%205", "1e9", "%D9%A5"):  # +5, " 5", Arabic 5
                status, _, body = _request(col, "GET", f"{path}?limit={bad}", {})
                answer = json.loads(body)
                assert status == 400 and answer["error"] == "bad_parameter", (path, bad, status, body)
                assert "limit" in answer["detail"]
        assert col.stats()["refused"]["bad_parameter"] == 16
        assert len(col.get("/api/trace/lim-3")["segments"]) == 1  # the other API answers as before
        assert "Traceback" not in col.log()


def test_server_header_names_no_versions(collector: LocalCollector) -> None:
    """``BaseHTTPRequestHandler`` sends ``Server: swmp-collector Python/3.x.y`` by default:
    which interpreter runs is no client's business."""
    answers = [
        _request(collector, "GET", "/", {}),
        _request(collector, "GET", "/api/stats", {}),
        _request(collector, "GET", "/nowhere", {}),
        _request(collector, "POST", "/v3/segments", {"Content-Type": "application/json"}, b"{no"),
    ]
    assert [a[0] for a in answers] == [200, 200, 404, 400]
    assert {a[1]["server"] for a in answers} == {"swmp-collector"}
    # an answer of http.server itself (send_error: a method it has no handler for)
    host, port = collector.http_address.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"BREW / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
    assert head.startswith(b"HTTP/1.1 501") and b"\r\nServer: swmp-collector\r\n" in head, head
    assert b"Python" not in head


def _healthy(col: LocalCollector) -> bool:
    try:
        return bool(col.get("/healthz")["ok"])
    except OSError:
        return False


def _run_collector(tmp_path: Path, db: Path) -> subprocess.CompletedProcess[str]:
    """``swmp collector --db DB``: started, and stopped as soon as it listens."""
    ready = tmp_path / "ready"
    cmd = [sys.executable, "-m", "swmp.collector", "--db", str(db), "--grpc-port", "0", "--http-port", "0"]
    cmd += ["--ready-file", str(ready)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: proc.poll() is not None or ready.exists(), 60, "the collector")
    finally:
        if proc.poll() is None:
            proc.terminate()
        out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_planted_symlink_is_refused_not_followed(tmp_path: Path) -> None:
    """Someone who can write where the database goes (``--db /tmp/...``) plants a link to a
    file of theirs or to one of the user's: the collector must not write through it."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    dangling = tmp_path / "attacker-owned.db"
    for target in (victim, dangling):
        link = tmp_path / "collector.db"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        out = _run_collector(tmp_path, link)
        assert out.returncode == 1 and "symbolic link" in out.stderr, (out.returncode, out.stderr)
        assert "Traceback" not in out.stderr
    assert victim.read_text() == "precious\n" and not dangling.exists()


def _inotify_names(directory: Path) -> tuple[int, Any]:
    """An inotify descriptor watching ``directory`` for files created, opened, written or
    removed there, and a function that reads the names seen so far (the kernel reports every
    open of a file in the directory, by whatever process: no strace needed)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    mask = 0x100 | 0x20 | 0x02 | 0x200 | 0x40 | 0x80  # CREATE OPEN MODIFY DELETE MOVED_FROM/TO
    assert libc.inotify_add_watch(fd, bytes(directory), mask) >= 0, os.strerror(ctypes.get_errno())

    def names() -> set[str]:
        seen: set[str] = set()
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return seen
            off = 0
            while off < len(data):
                _wd, _mask, _cookie, size = struct.unpack_from("iIII", data, off)
                seen.add(data[off + 16 : off + 16 + size].rstrip(b"\0").decode())
                off += 16 + size

    return fd, names


def test_store_never_opens_a_side_file(tmp_path: Path) -> None:
    """SQLite created ``<db>-journal`` by name for every write transaction (and looked for one
    to play back before each): in a shared directory, where a planted link or file would be
    used. With the journal in memory no file but the database itself is ever opened there,
    whatever the kernel's fs.protected_symlinks says."""
    data = tmp_path / "data"
    data.mkdir()
    fd, names = _inotify_names(data)
    try:
        store = Store(data / "c.db", max_bytes=20_000)
        for i in range(60):  # writes, evictions past the cap, retention sweeps, a rollback
            doc = {"trace_id": f"j{i}", "segment_id": f"j{i}.0", "service": "j", "instance": "j-0"}
            store.add_segments([{**doc, "spans": []}], "http")
            store.add_logs([{"trace_id": f"j{i}", "service": "j", "instance": "j-0", "timestamp": i}])
        store.sweep()
        with pytest.raises(sqlite3.Error):
            store._insert("INSERT INTO nowhere VALUES (?)", [(1,)], 0)
        assert len(store.traces(limit=1000)) > 0
        store.close()
        seen = names()
    finally:
        os.close(fd)
    assert seen == {"c.db"}, seen
    assert sorted(os.listdir(data)) == ["c.db"]


def test_planted_side_files_are_never_followed(tmp_path: Path) -> None:
    """Links planted at ``<db>-journal``, ``-wal`` and ``-shm`` (to a file of the user's, or
    dangling, where SQLite would create the target): before the collector starts it refuses
    them; planted while it runs they are never looked at. The links' targets stay as they
    were and the links themselves are left alone (SQLite removed the journal "file")."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    db = tmp_path / "data" / "c.db"
    db.parent.mkdir()
    sides = [Path(f"{db}{suffix}") for suffix in ("-journal", "-wal", "-shm")]
    for side in sides:
        side.symlink_to(victim)
        out = _run_collector(tmp_path, db)
        assert out.returncode == 1 and "symbolic link" in out.stderr and side.name in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
        side.unlink()
    with local_collector(tmp_path / "run", "--db", str(db)) as col:
        for n, target in enumerate((victim, tmp_path / "dangling-target")):
            for side in sides:
                side.unlink(missing_ok=True)
                side.symlink_to(target)
            for i in range(3):  # write transactions, and reads between them
                segment = {"traceId": f"side-{n}-{i}", "traceSegmentId": f"side-{n}-{i}.0", "service": "side"}
                assert col.post("/v3/segment", json.dumps(segment).encode()) == (200, {})
                assert len(col.get("/api/traces?service=side")) == 3 * n + i + 1
            assert all(side.is_symlink() and side.readlink() == target for side in sides)
        assert "Traceback" not in col.log()
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "dangling-target").exists()


def test_a_second_collector_on_the_same_database_is_refused(tmp_path: Path) -> None:
    """The collector holds the database's lock for its life (so SQLite never looks for a
    journal again): a second one on the same ``--db`` exits at start, saying why."""
    with local_collector(tmp_path / "first") as first:
        assert first.db is not None
        out = _run_collector(tmp_path, first.db)
        assert out.returncode == 1 and "database is locked" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
        assert first.post("/v3/segment", json.dumps({"traceId": "t", "service": "s"}).encode())[0] == 200


def test_ready_file_is_not_written_through_a_planted_link(tmp_path: Path) -> None:
    """``--ready-file PATH`` wrote ``PATH.tmp`` first, following a link planted there (CI jobs
    put it in shared temporary directories): the link's target was overwritten."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "ready.tmp").symlink_to(victim)
    out = _run_collector(tmp_path, tmp_path / "c.db")
    assert out.returncode == 0, out.stderr
    assert victim.read_text() == "precious\n"
    ready = tmp_path / "ready"
    assert not ready.is_symlink() and set(json.loads(ready.read_text())) == {"grpc_port", "http_port", "pid"}


def test_a_database_that_is_not_the_collectors_is_left_alone(tmp_path: Path) -> None:
    """A wrong ``--db`` (another application's SQLite file) was emptied as "another schema
    version": its tables were dropped."""
    other = tmp_path / "app.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE users(name TEXT)")
        db.execute("INSERT INTO users VALUES ('alice')")
    db.close()
    out = _run_collector(tmp_path, other)
    assert out.returncode == 1 and "not a collector database" in out.stderr, out.stderr
    with sqlite3.connect(other) as db:
        assert db.execute("SELECT name FROM users").fetchall() == [("alice",)]
    db.close()


def test_loose_database_file_is_made_private(tmp_path: Path) -> None:
    db = tmp_path / "loose.db"
    db.touch()
    os.chmod(db, 0o644)
    out = _run_collector(tmp_path, db)
    assert out.returncode in (0, -15), out.stderr
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


class _Answer(BaseHTTPRequestHandler):
    """A server that answers every GET and POST with ``body`` (a hostile or foreign one)."""

    body = b""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.do_GET()


@contextlib.contextmanager
def _answering(body: bytes) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("A", (_Answer,), {"body": body}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


BIG = b"[" + b" " * (MAX_ANSWER + 1) + b"]"


@pytest.mark.parametrize(
    ("body", "args", "expect"),
    [
        (b'[{"trace_id": "t"}]', ["--collector"], "unexpected answer"),
        (b'["x"]', ["--collector"], "unexpected answer"),
        (b'{"segments": [{"spans": "nope"}]}', ["t", "--collector"], "unexpected answer"),
        (b"[" * 200_000, ["--collector"], "nested too deeply"),
        (BIG, ["--collector"], "larger than"),
        (b'{"data": {"queryBasicTraces": {"traces": [7]}}}', ["--oap"], "unexpected answer"),
        (BIG, ["--oap"], "larger than"),
    ],
    ids=["missing-keys", "wrong-type", "bad-trace", "deep", "huge", "oap-wrong-type", "oap-huge"],
)
def test_swmp_traces_survives_a_hostile_answer(body: bytes, args: list[str], expect: str) -> None:
    """Whatever the server on the other end answers, ``swmp traces`` exits 1 with a message:
    no traceback, and no answer read past MAX_ANSWER bytes."""
    with _answering(body) as url:
        out = swmp_traces(*args, url, ok=False)
    assert out.returncode == 1 and expect in out.stderr, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="making a link of another user needs root")
def test_another_users_link_on_the_way_to_the_database_is_refused(tmp_path: Path) -> None:
    """``--db /tmp/shared/x.db`` where someone else made ``/tmp/shared`` a link to a directory
    of the user's: the link chooses where the database goes, so it is refused (as for the
    arena directory), and nothing is created where it leads."""
    mine = tmp_path / "mine"
    mine.mkdir()
    planted = tmp_path / "shared"
    planted.symlink_to(mine)
    os.lchown(planted, 65534, 65534)
    out = _run_collector(tmp_path, planted / "collector.db")
    assert out.returncode == 1 and "symbolic link of uid 65534" in out.stderr, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr
    assert list(mine.iterdir()) == []
    # The user's own link is theirs to use.
    os.lchown(planted, os.geteuid(), os.getegid())
    out = _run_collector(tmp_path, planted / "collector.db")
    assert out.returncode == 0, (out.returncode, out.stderr)
    assert (mine / "collector.db").exists()


def test_a_database_where_others_could_swap_it_is_refused(tmp_path: Path) -> None:
    """``--db`` in a directory others may write to without the sticky bit (mode 0777): any
    user could rename the database away and put a file of theirs in its place. Refused,
    as the spool is; a sticky one (``/tmp``'s mode 1777) is fine."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    out = _run_collector(tmp_path, shared / "collector.db")
    assert out.returncode == 1 and "writable by other users (mode 777, no sticky bit)" in out.stderr, (
        out.stderr
    )
    assert "Traceback" not in out.stderr and list(shared.iterdir()) == []
    shared.chmod(0o1777)
    out = _run_collector(tmp_path, shared / "collector.db")
    assert out.returncode == 0, out.stderr
    assert (shared / "collector.db").exists()
