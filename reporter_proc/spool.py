"""Disk spool: where records go when the backend stays down longer than memory allows.

Layout: a directory of append-only segment files ``<seq:012d>.spool``. Each file starts
with an 8-byte magic word; each record is ``u32 length, u16 type, u16 zero, u32 crc32``
followed by the record's original ring payload (the orjson bytes a worker wrote), so the
spool holds exactly what the rings held and replay decodes it with the same code.

Crash safety is "enough" on purpose: no fsync (the page cache survives a crashed
process, which is the failure that matters here), and a reader stops at the first record
whose header is short, whose length runs past the end, or whose crc does not match, so a
torn tail costs only that tail (said when the file is indexed; a tail of zero bytes, which
a crash can leave, is torn too). A new reporter never appends to an old file; it indexes
what is there and starts a new one.

The cap (``max_bytes``) is enforced by deleting the oldest files, whose unreplayed records
are counted in :attr:`Spool.dropped_records`: a long outage loses the oldest data, never
the newest, and never silently. The records of the read being replayed are never dropped
(only what follows them in their file, cut off): their send may still succeed.

One reporter per directory: an ``flock`` on ``.lock`` guards it (two applications
configured with the same spool directory would otherwise replay each other's files twice).

Another local user must not get in (``reporter_proc.spooldir`` checks the directory): files
are created with ``O_EXCL | O_NOFOLLOW`` and mode 0600 (never truncated through a path
someone could have planted), and only regular files owned by this user and private to it
are ever indexed and replayed; anything else in the directory is skipped and counted
(:attr:`Spool.foreign_files`).
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import io
import logging
import os
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from reporter_proc.spooldir import SpoolUnsafe, make_private_dir, own_private_file

log = logging.getLogger("swmp.reporter")

MAGIC = b"SWMPSPL1"
_REC = struct.Struct("<IHHI")
_REC_SIZE = _REC.size
_ZERO_HEAD = bytes(_REC_SIZE)
_MAX_RECORD = 1 << 30


class SpoolBusy(Exception):
    """Another live process holds this spool directory."""


class SpoolShortWrite(OSError):
    """The disk filled up during an append: only the first ``records`` records are kept."""

    def __init__(self, records: int) -> None:
        super().__init__(errno.ENOSPC, "short write to the spool")
        self.records = records


@dataclass
class SpoolFile:
    seq: int
    path: str
    size: int  # bytes on disk (valid part)
    records: int  # records in the valid part
    offset: int = len(MAGIC)  # replay progress (in memory; a restart replays the file again)
    replayed: int = 0
    sealed: bool = True
    # (end offset, records) of the read being replayed, until it is acknowledged: the cap
    # never drops these (their send may still succeed, and they would count twice).
    reading: tuple[int, int] | None = None


class Spool:
    def __init__(self, directory: str, max_bytes: int, segment_bytes: int = 4 * 1024 * 1024) -> None:
        directory = make_private_dir(directory)  # raises SpoolUnsafe
        self.directory = directory
        self._uid = os.geteuid()
        self.max_bytes = max(1, max_bytes)
        # Several files under the cap, so dropping the oldest loses a fraction, not all.
        self.segment_bytes = max(4096, min(segment_bytes, self.max_bytes // 4 or 1))
        self._lock_fd = os.open(
            os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
        )
        if not own_private_file(os.fstat(self._lock_fd), self._uid):
            os.close(self._lock_fd)
            raise SpoolUnsafe(f"{directory}/.lock is not a private file of this user")
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            raise SpoolBusy(f"spool directory {directory} is in use by another process") from exc
        self.files: list[SpoolFile] = []
        self.dropped_records = 0
        self.torn_tails = 0
        self.foreign_files = 0  # files in the directory this user did not write: never replayed
        self._active: SpoolFile | None = None
        self._fd = -1
        self._index()

    # -- bookkeeping -----------------------------------------------------------------------
    def _index(self) -> None:
        for name in sorted(os.listdir(self.directory)):
            if not name.endswith(".spool"):
                continue
            try:
                seq = int(name[: -len(".spool")])
            except ValueError:
                continue
            path = os.path.join(self.directory, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not own_private_file(st, self._uid):
                self.foreign_files += 1
                continue
            size, records, torn = _scan(path)
            if torn:
                self.torn_tails += 1
                log.warning(
                    "spool %s: %d bytes after its last whole record are unreadable (a write cut "
                    "short by a crash, or a damaged file): ignored%s",
                    path,
                    st.st_size - size,
                    "" if records else "; the file held nothing else and is removed",
                )
            if records == 0:
                _unlink(path)
                continue
            self.files.append(SpoolFile(seq, path, size, records))
        self.files.sort(key=lambda f: f.seq)
        if self.foreign_files:
            log.warning(
                "spool %s: skipped %d files that are not private regular files of this user; "
                "they are never replayed",
                self.directory,
                self.foreign_files,
            )

    @property
    def total_bytes(self) -> int:
        return sum(f.size - (f.offset - len(MAGIC)) for f in self.files)

    @property
    def total_records(self) -> int:
        return sum(f.records - f.replayed for f in self.files)

    def __bool__(self) -> bool:
        return any(f.records > f.replayed for f in self.files)

    # -- writing ---------------------------------------------------------------------------
    def append(self, items: Iterable[tuple[int, bytes]]) -> int:
        """Append records; returns how many were written. Raises OSError on disk trouble
        (:class:`SpoolShortWrite` when some of them were written)."""
        buf = bytearray()
        ends: list[int] = []  # where each record ends in buf, to tell what a short write kept
        for rtype, payload in items:
            buf += _REC.pack(len(payload), rtype, 0, zlib.crc32(payload))
            buf += payload
            ends.append(len(buf))
        n = len(ends)
        if not n:
            return 0
        active = self._active
        if active is None or active.size >= self.segment_bytes:
            active = self._open_new()
        # One write per call: a crash leaves at most this call's tail torn.
        try:
            written = os.write(self._fd, buf)
        except OSError:
            self.seal()  # the file may end in a torn record now: never append after it
            raise
        if written < len(buf):  # the disk filled up during the write
            # The whole records written are on disk, and a restart would index and replay
            # them: they count as spooled, not dropped (the torn one after them is ignored).
            kept = bisect.bisect_right(ends, written)
            active.size += ends[kept - 1] if kept else 0
            active.records += kept
            self.seal()
            raise SpoolShortWrite(kept)
        active.size += len(buf)
        active.records += n
        self._enforce_cap()
        return n

    def _open_new(self) -> SpoolFile:
        self.seal()
        seq = (self.files[-1].seq + 1) if self.files else 1
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC
        while True:  # a name already taken (a skipped foreign file) is never reused
            path = os.path.join(self.directory, f"{seq:012d}.spool")
            try:
                self._fd = os.open(path, flags, 0o600)
                break
            except FileExistsError:
                seq += 1
        try:
            os.write(self._fd, MAGIC)
        except OSError:
            os.close(self._fd)
            self._fd = -1
            _unlink(path)
            raise
        f = SpoolFile(seq, path, len(MAGIC), 0, sealed=False)
        self.files.append(f)
        self._active = f
        return f

    def seal(self) -> None:
        """Close the file being appended to; the next append starts a new one."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._active is not None:
            self._active.sealed = True
            self._active = None

    def _enforce_cap(self) -> None:
        """Drop the oldest records until the spool fits its cap, whole files at a time; of a
        file being replayed only what follows the read in flight (the records in flight may
        still be delivered, so they are neither dropped nor counted). When they alone exceed
        the cap, the spool stays above it until they are acknowledged."""
        for f in list(self.files):
            if self.total_bytes <= self.max_bytes:
                return
            if f.reading is not None:
                self._drop_unread(f)
                continue
            if f is self._active:
                self.seal()
            lost = f.records - f.replayed
            self.dropped_records += lost
            self._remove(f)
            log.warning(
                "spool over its cap of %d bytes: dropped its oldest file (%d records)", self.max_bytes, lost
            )

    def _drop_unread(self, f: SpoolFile) -> None:
        """Drop what follows the read in flight in ``f`` by truncating the file, so that a
        restart does not replay records counted as dropped."""
        assert f.reading is not None
        end, in_flight = f.reading
        if f.size <= end:
            return
        if f is self._active:
            self.seal()
        if not _truncate(f.path, end, self._uid):
            return  # left as it is: the cap takes the next files instead
        lost = f.records - f.replayed - in_flight
        f.size = end
        f.records = f.replayed + in_flight
        self.dropped_records += lost
        log.warning(
            "spool over its cap of %d bytes: dropped the unsent rest of the file being replayed (%d records)",
            self.max_bytes,
            lost,
        )

    # -- replay ----------------------------------------------------------------------------
    def oldest(self) -> SpoolFile | None:
        """The file to replay next (sealing the active one if it is the only one left)."""
        while self.files:
            f = self.files[0]
            if f.replayed >= f.records:
                if f is self._active:
                    return None  # nothing new since; keep appending to it
                self._remove(f)
                continue
            if f is self._active:
                self.seal()
            return f
        return None

    def read(self, f: SpoolFile, max_records: int) -> tuple[list[tuple[int, bytes]], int]:
        """Up to ``max_records`` records of ``f`` from its replay offset, and the end offset."""
        out: list[tuple[int, bytes]] = []
        try:
            with _open_own(f.path, self._uid) as fh:
                fh.seek(f.offset)
                pos = f.offset
                while len(out) < max_records and pos < f.size:
                    head = fh.read(_REC_SIZE)
                    if len(head) < _REC_SIZE:
                        break
                    n, rtype, _zero, crc = _REC.unpack(head)
                    payload = fh.read(n)
                    if len(payload) < n or zlib.crc32(payload) != crc:
                        break
                    out.append((rtype, payload))
                    pos += _REC_SIZE + n
        except (FileNotFoundError, SpoolUnsafe) as exc:
            pos, why = f.size, str(exc)
        else:
            why = "cut short or changed since it was indexed"
        if not out:
            pos = f.size  # nothing readable left: let ack() retire the file
            # Removed (a tmp cleaner, an operator freeing room) or changed under us: its
            # records are lost, and counted like those the cap drops, never silently.
            lost = f.records - f.replayed
            if lost > 0:
                self.dropped_records += lost
                log.warning("spool %s: %d records could not be read back (%s): dropped", f.path, lost, why)
        f.reading = (pos, len(out))
        return out, pos

    def ack(self, f: SpoolFile, offset: int, count: int) -> None:
        """Records of ``f`` up to ``offset`` were delivered."""
        f.reading = None
        f.offset = max(f.offset, offset)
        f.replayed = min(f.records, f.replayed + count)
        if f.offset >= f.size:
            f.replayed = f.records
            self._remove(f)

    def _remove(self, f: SpoolFile) -> None:
        _unlink(f.path)
        try:
            self.files.remove(f)
        except ValueError:
            pass

    def close(self) -> None:
        self.seal()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1


def _open_own(path: str, uid: int) -> io.BufferedReader:
    """Open a spool file for reading, refusing a symlink or a file that is not ours."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not own_private_file(os.fstat(fd), uid):
        os.close(fd)
        raise SpoolUnsafe(f"{path} is not a private file of this user")
    return open(fd, "rb")


def _truncate(path: str, size: int, uid: int) -> bool:
    """Cut a spool file of ours to ``size`` bytes; False when it cannot be done."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not own_private_file(os.fstat(fd), uid):
            return False
        os.ftruncate(fd, size)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _scan(path: str) -> tuple[int, int, bool]:
    """(valid bytes, records, torn tail?) of a spool file, walking headers and checking crcs."""
    try:
        with _open_own(path, os.geteuid()) as fh:
            if fh.read(len(MAGIC)) != MAGIC:
                return 0, 0, True
            pos = len(MAGIC)
            records = 0
            while True:
                head = fh.read(_REC_SIZE)
                if not head:
                    return pos, records, False
                if len(head) < _REC_SIZE:
                    return pos, records, True
                n, _rtype, _zero, crc = _REC.unpack(head)
                # No record type is 0: a header of zeros is the zero-filled tail a crash can
                # leave (the file's new size was written, not its data). Its empty payload's
                # crc matches, so each 12 zero bytes would replay as one invalid record.
                if head == _ZERO_HEAD or n > _MAX_RECORD:
                    return pos, records, True
                payload = fh.read(n)
                if len(payload) < n or zlib.crc32(payload) != crc:
                    return pos, records, True
                pos += _REC_SIZE + n
                records += 1
    except (OSError, SpoolUnsafe):
        return 0, 0, True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
