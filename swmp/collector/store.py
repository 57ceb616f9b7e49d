"""Where the collector keeps what it received: one SQLite database (a file, or memory).

Tables: ``segments`` (one row per segment, the decoded document as JSON plus the columns the
trace list filters on), ``logs``, ``meters`` and ``instances`` (last keep-alive and properties
per service instance). One connection guarded by a lock: the receivers run on several
threads, and a development collector's write rate is far below what one SQLite connection
does.

Two limits keep the file small:

* ``max_bytes``: the size of the stored documents (segments + logs + meters). Past it, the
  oldest rows go first until 90% of the cap is left. SQLite reuses the freed pages, so the
  file stops growing near the cap instead of shrinking.
* ``retention_s``: rows (and instances not heard from) older than this are removed, checked
  at most every few seconds on writes.

The file is created private: mode 0600, in a directory created 0700 when it is new. A
symbolic link, something other than a regular file, or a file of another user where the
database goes is refused (:class:`StoreError`), never followed; so is a database with tables
that are not the collector's (a wrong ``--db`` must not empty someone's database).

SQLite's side files are kept out of the directory, which may be shared (``--db /tmp/...``):
by default SQLite creates ``<db>-journal`` by name for every write transaction, and looks
for one at every transaction start to roll it back into the database. A link or file planted
there by someone else would be followed (older SQLite versions; newer ones open with
``O_NOFOLLOW`` and then fail every write) or played back into the database. So the rollback
journal is kept in memory (``journal_mode=MEMORY``: no journal file is ever created) and the
connection holds its lock for its life (``locking_mode=EXCLUSIVE``): SQLite looks for
``-journal`` / ``-wal`` once, at the first access, right after :func:`_refuse_side_files`
checked that none is there but a file of the user's own. The cost: a crash in the middle of
a write (a kill -9 while committing, a power cut) can leave the database damaged
("malformed"); it holds development data (delete the file). And no other process can open
the database while the collector runs (a second collector on the same ``--db`` is refused
at start).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ipc.private import ancestor_problem, make_directories
from swmp.collector.options import DEFAULT_MAX_BYTES, DEFAULT_RETENTION_S

Doc = dict[str, Any]
log = logging.getLogger("swmp.collector")
SCHEMA_VERSION = 1
MEMORY = ":memory:"
_SWEEP_EVERY_S = 5.0
_DATA_TABLES = ("segments", "logs", "meters")
# The most rows one answer of the trace list or of the logs holds (the API's ``limit``): an
# answer is built in memory, and the store may hold 256 MiB.
MAX_LIMIT = 1000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS segments(
    seq INTEGER PRIMARY KEY AUTOINCREMENT, received_ms INTEGER NOT NULL,
    trace_id TEXT NOT NULL, segment_id TEXT NOT NULL, service TEXT NOT NULL, instance TEXT NOT NULL,
    endpoint TEXT NOT NULL, is_root INTEGER NOT NULL, start_ms INTEGER NOT NULL, end_ms INTEGER NOT NULL,
    is_error INTEGER NOT NULL, spans INTEGER NOT NULL, transport TEXT NOT NULL, size INTEGER NOT NULL,
    doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS segments_trace ON segments(trace_id);
CREATE INDEX IF NOT EXISTS segments_start ON segments(start_ms);
CREATE TABLE IF NOT EXISTS logs(
    seq INTEGER PRIMARY KEY AUTOINCREMENT, received_ms INTEGER NOT NULL, trace_id TEXT NOT NULL,
    service TEXT NOT NULL, instance TEXT NOT NULL, timestamp INTEGER NOT NULL, size INTEGER NOT NULL,
    doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS logs_trace ON logs(trace_id);
CREATE TABLE IF NOT EXISTS meters(
    seq INTEGER PRIMARY KEY AUTOINCREMENT, received_ms INTEGER NOT NULL, service TEXT NOT NULL,
    instance TEXT NOT NULL, name TEXT NOT NULL, size INTEGER NOT NULL, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS instances(
    service TEXT NOT NULL, instance TEXT NOT NULL, first_seen_ms INTEGER NOT NULL,
    last_seen_ms INTEGER NOT NULL, last_ping_ms INTEGER, pings INTEGER NOT NULL DEFAULT 0, properties TEXT,
    PRIMARY KEY(service, instance));
"""


_OWN_TABLES = frozenset({"segments", "logs", "meters", "instances"})


class StoreError(OSError):
    """The database cannot be used where it was asked for (the message says why)."""


class StoreWriteError(sqlite3.Error):
    """SQLite refused a write (the disk is full, the file read-only...): nothing of it kept."""


def _create_private(path: Path) -> None:
    # Another user's link on the way (``--db /tmp/shared/x.db`` with ``/tmp/shared`` planted
    # as a link) would choose the directory our database goes to, and in a directory others
    # may write to without the sticky bit they could swap the file: refused, as the spool is.
    problem = ancestor_problem(str(path))
    if problem is not None:
        raise StoreError(f"{path}: {problem}: refused (give a path without it)")
    if not path.parent.exists():
        make_directories(str(path.parent))  # each missing one 0700, whatever the umask
    try:  # O_NOFOLLOW: a link planted where the file goes is refused, not followed
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreError(f"{path} is a symbolic link: refused (give the real path)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{path} is not a regular file: refused")
        if st.st_uid != os.geteuid():
            raise StoreError(f"{path} belongs to another user (uid {st.st_uid}): refused")
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o600)  # what it holds is private, whoever created it loosely
    finally:
        os.close(fd)


_SIDE_FILES = ("-journal", "-wal", "-shm")  # SQLite's rollback journal, write-ahead log, WAL index


def _refuse_side_files(path: Path) -> None:
    """StoreError when one of SQLite's side files of ``path`` is there and is not a regular
    file of ours: a link or a file someone planted (which SQLite would open and play back
    into the database). The collector never creates one (``journal_mode=MEMORY``); one of
    ours is a crashed older version's journal, which SQLite rolls back as it should."""
    for suffix in _SIDE_FILES:
        side = f"{path}{suffix}"
        try:
            st = os.lstat(side)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise StoreError(f"{side} is a symbolic link: refused (remove it; the collector makes none)")
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise StoreError(f"{side} is not a file of yours: refused (remove it; the collector makes none)")


def _now_ms() -> int:
    return int(time.time() * 1000)


class Store:
    """The collector's database. Every method is thread-safe."""

    def __init__(
        self,
        path: str | os.PathLike[str] = MEMORY,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        retention_s: float = DEFAULT_RETENTION_S,
    ) -> None:
        self.path = str(path)
        if self.path != MEMORY:
            _create_private(Path(self.path))
            _refuse_side_files(Path(self.path))
        self.max_bytes = max_bytes
        self.retention_s = retention_s
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            # No side file by name in a directory others may write to (the module's docstring):
            # both before the first access, the only one that looks for a journal.
            self._db.execute("PRAGMA locking_mode=EXCLUSIVE")
            mode = self._db.execute("PRAGMA journal_mode=MEMORY").fetchone()[0]
            if mode != "memory":
                raise StoreError(f"{self.path}: SQLite kept journal mode {mode!r}: refused")
            self._db.execute("PRAGMA synchronous=NORMAL")
            # the lock now, held to the end: a second collector on this file fails here
            self._db.execute("BEGIN EXCLUSIVE")
            self._db.execute("COMMIT")
            self._migrate()
        except BaseException:
            self._db.close()
            raise
        self._bytes = sum(
            int(self._db.execute(f"SELECT COALESCE(SUM(size), 0) FROM {t}").fetchone()[0])
            for t in _DATA_TABLES
        )
        self.evicted = 0  # rows removed by the size cap
        self.expired = 0  # rows removed by retention
        self._last_sweep = 0.0

    def _migrate(self) -> None:
        """Create the tables; a database of another schema version starts over (it holds
        development data only, and converting it is not worth a migration framework)."""
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version == SCHEMA_VERSION:
            return
        tables = [
            r[0]
            for r in self._db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        if set(tables) - _OWN_TABLES:
            raise StoreError(
                f"{self.path} is not a collector database (tables {sorted(tables)}): refused, nothing changed"
            )
        if tables:
            log.warning(
                "collector: %s has schema version %d, not %d: starting empty",
                self.path,
                version,
                SCHEMA_VERSION,
            )
            for t in tables:
                self._db.execute(f"DROP TABLE {t}")
        self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- writes ----------------------------------------------------------------------------
    def add_segments(self, docs: Iterable[Doc], transport: str) -> int:
        now = _now_ms()
        rows = []
        for d in docs:
            spans = d["spans"]
            first = min(spans, key=lambda s: s["span_id"]) if spans else None
            text = json.dumps(d, separators=(",", ":"))
            rows.append(
                (
                    now,
                    d["trace_id"],
                    d["segment_id"],
                    d["service"],
                    d["instance"],
                    first["operation"] if first else "",
                    int(not (first and first["refs"])),
                    min((s["start"] for s in spans), default=0),
                    max((s["end"] for s in spans), default=0),
                    int(any(s["is_error"] for s in spans)),
                    len(spans),
                    transport,
                    len(text),
                    text,
                )
            )
        self._insert(
            "INSERT INTO segments(received_ms, trace_id, segment_id, service, instance, endpoint, is_root,"
            " start_ms, end_ms, is_error, spans, transport, size, doc) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            rows,
            size_index=12,
        )
        for d in docs:
            self.touch_instance(d["service"], d["instance"])
        return len(rows)

    def add_logs(self, docs: Iterable[Doc]) -> int:
        now = _now_ms()
        rows = []
        for d in docs:
            text = json.dumps(d, separators=(",", ":"))
            rows.append((now, d["trace_id"], d["service"], d["instance"], d["timestamp"], len(text), text))
        self._insert(
            "INSERT INTO logs(received_ms, trace_id, service, instance, timestamp, size, doc)"
            " VALUES (?,?,?,?,?,?,?)",
            rows,
            size_index=5,
        )
        return len(rows)

    def add_meters(self, docs: Iterable[Doc]) -> int:
        now = _now_ms()
        rows = []
        for d in docs:
            text = json.dumps(d, separators=(",", ":"))
            rows.append((now, d["service"], d["instance"], d["name"], len(text), text))
        self._insert(
            "INSERT INTO meters(received_ms, service, instance, name, size, doc) VALUES (?,?,?,?,?,?)",
            rows,
            size_index=4,
        )
        return len(rows)

    def touch_instance(
        self, service: str, instance: str, *, ping: bool = False, properties: list[list[str]] | None = None
    ) -> None:
        now = _now_ms()
        with self._lock, self._writing():
            self._db.execute(
                "INSERT INTO instances(service, instance, first_seen_ms, last_seen_ms) VALUES (?,?,?,?)"
                " ON CONFLICT(service, instance) DO UPDATE SET last_seen_ms = excluded.last_seen_ms",
                (service, instance, now, now),
            )
            if ping:
                self._db.execute(
                    "UPDATE instances SET last_ping_ms=?, pings=pings+1 WHERE service=? AND instance=?",
                    (now, service, instance),
                )
            if properties is not None:
                self._db.execute(
                    "UPDATE instances SET properties=? WHERE service=? AND instance=?",
                    (json.dumps(properties), service, instance),
                )

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """SQLite's refusal of a write as :class:`StoreWriteError`, for the receivers to
        refuse the data with (it raised out of their handlers: a dropped connection and a
        traceback per call, on a full disk)."""
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreWriteError(f"the database refused the write: {exc}") from None

    def _insert(self, sql: str, rows: list[tuple[Any, ...]], size_index: int) -> None:
        if not rows:
            return
        with self._lock, self._writing():
            before = self._bytes
            self._db.execute("BEGIN")
            try:
                self._db.executemany(sql, rows)
                self._bytes += sum(int(r[size_index]) for r in rows)
                if self._bytes > self.max_bytes:
                    self._evict_locked()
                self._db.execute("COMMIT")
            except BaseException:
                self._bytes = before
                if self._db.in_transaction:  # SQLite ends it itself on some errors (disk full)
                    self._db.execute("ROLLBACK")
                raise
        if time.monotonic() - self._last_sweep >= _SWEEP_EVERY_S:
            self.sweep()

    def _evict_locked(self) -> None:
        """Oldest rows first, across the three data tables, down to 90% of the cap."""
        target = self.max_bytes * 9 // 10
        while self._bytes > target:
            heads = []
            for t in _DATA_TABLES:
                row = self._db.execute(f"SELECT received_ms, seq FROM {t} ORDER BY seq LIMIT 1").fetchone()
                if row is not None:
                    heads.append((row[0], row[1], t))
            if not heads:
                self._bytes = 0
                return
            _, seq, table = min(heads)
            # a small chunk at a time: the oldest table changes as rows go
            rows = self._db.execute(
                f"SELECT seq, size FROM {table} WHERE seq >= ? ORDER BY seq LIMIT 64", (seq,)
            ).fetchall()
            upto = next((s for s, _ in _running(rows, self._bytes, target)), rows[-1][0])
            cur = self._db.execute(f"DELETE FROM {table} WHERE seq <= ? RETURNING size", (upto,))
            removed = cur.fetchall()
            self._bytes -= sum(int(r[0]) for r in removed)
            self.evicted += len(removed)

    def sweep(self) -> None:
        """Remove what is older than the retention period."""
        self._last_sweep = time.monotonic()
        cutoff = _now_ms() - int(self.retention_s * 1000)
        with self._lock:
            for t in _DATA_TABLES:
                removed = self._db.execute(
                    f"DELETE FROM {t} WHERE received_ms < ? RETURNING size", (cutoff,)
                ).fetchall()
                self._bytes -= sum(int(r[0]) for r in removed)
                self.expired += len(removed)
            self._db.execute("DELETE FROM instances WHERE last_seen_ms < ?", (cutoff,))

    # -- reads -----------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        with self._lock:
            out = {t: int(self._db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in _DATA_TABLES}
            out["traces"] = int(
                self._db.execute("SELECT COUNT(DISTINCT trace_id) FROM segments").fetchone()[0]
            )
            out["instances"] = int(self._db.execute("SELECT COUNT(*) FROM instances").fetchone()[0])
            out["bytes"] = self._bytes
        out.update(max_bytes=self.max_bytes, evicted=self.evicted, expired=self.expired)
        return out

    def traces(
        self,
        *,
        service: str = "",
        endpoint: str = "",
        errors_only: bool = False,
        min_duration_ms: int = 0,
        max_duration_ms: int = 0,
        limit: int = 50,
    ) -> list[Doc]:
        """Recent traces (newest first) with their root endpoint, services and error flag."""
        where: list[str] = []
        having: list[str] = []
        args: list[Any] = []
        if service:
            where.append("trace_id IN (SELECT trace_id FROM segments WHERE service = ?)")
            args.append(service)
        if endpoint:
            where.append("trace_id IN (SELECT trace_id FROM segments WHERE endpoint LIKE ?)")
            args.append(f"%{endpoint}%")
        if errors_only:
            having.append("MAX(is_error) = 1")
        if min_duration_ms:
            having.append("MAX(end_ms) - MIN(start_ms) >= ?")
            args.append(min_duration_ms)
        if max_duration_ms:
            having.append("MAX(end_ms) - MIN(start_ms) <= ?")
            args.append(max_duration_ms)
        sql = (
            "SELECT trace_id, MIN(start_ms), MAX(end_ms), MAX(is_error), COUNT(*), SUM(spans),"
            " GROUP_CONCAT(DISTINCT service),"
            " (SELECT endpoint FROM segments r WHERE r.trace_id = s.trace_id"
            "  ORDER BY is_root DESC, start_ms LIMIT 1)"
            " FROM segments s"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " GROUP BY trace_id"
            + (" HAVING " + " AND ".join(having) if having else "")
            + " ORDER BY MIN(start_ms) DESC LIMIT ?"
        )
        args.append(max(1, min(limit, MAX_LIMIT)))
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [
            {
                "trace_id": r[0],
                "start": r[1],
                "duration_ms": r[2] - r[1],
                "is_error": bool(r[3]),
                "segments": r[4],
                "spans": r[5],
                "services": sorted((r[6] or "").split(",")),
                "endpoint": r[7] or "",
            }
            for r in rows
        ]

    def trace(self, trace_id: str) -> list[Doc]:
        """The segment documents of one trace, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT doc, transport FROM segments WHERE trace_id = ? ORDER BY start_ms, seq", (trace_id,)
            ).fetchall()
        out = []
        for doc, transport in rows:
            d = json.loads(doc)
            d["transport"] = transport
            out.append(d)
        return out

    def logs(self, trace_id: str = "", limit: int = 200) -> list[Doc]:
        """Log records: of one trace (oldest first), or the newest (newest first)."""
        limit = max(1, min(limit, MAX_LIMIT))
        with self._lock:
            if trace_id:
                rows = self._db.execute(
                    "SELECT doc FROM logs WHERE trace_id = ? ORDER BY timestamp, seq LIMIT ?",
                    (trace_id, limit),
                ).fetchall()
            else:
                rows = self._db.execute("SELECT doc FROM logs ORDER BY seq DESC LIMIT ?", (limit,)).fetchall()
        return [json.loads(r[0]) for r in rows]

    def services(self) -> list[Doc]:
        """Services with their instances, last keep-alive and properties."""
        with self._lock:
            rows = self._db.execute(
                "SELECT service, instance, first_seen_ms, last_seen_ms, last_ping_ms, pings, properties"
                " FROM instances"
                " ORDER BY service, instance"
            ).fetchall()
        services: dict[str, list[Doc]] = {}
        for service, instance, first, seen, last, pings, props in rows:
            services.setdefault(service, []).append(
                {
                    "instance": instance,
                    "first_seen_ms": first,
                    "last_seen_ms": seen,
                    "last_ping_ms": last,
                    "pings": pings,
                    "properties": json.loads(props) if props else [],
                }
            )
        return [{"service": s, "instances": i} for s, i in services.items()]


def _running(rows: list[tuple[int, int]], total: int, target: int) -> Iterable[tuple[int, int]]:
    """(seq, size) of the first row after which ``total`` is at or below ``target``."""
    for seq, size in rows:
        total -= int(size)
        if total <= target:
            yield seq, size
            return
