"""The arena: one shared file per application holding a status block and N ring slots.

Lifecycle
---------
* The owner (the application's master process) creates it with ``O_CREAT | O_EXCL`` and
  mode 0600 before forking workers; creation is exclusive, so when several processes race
  (uWSGI ``lazy-apps`` imports the application in every worker) exactly one wins and the
  others attach. The header is filled in first and the magic word stored last, so an
  attacher never trusts a half-written header.
* Workers claim a slot after fork by taking a byte-range lock (see ``_locks``); the kernel
  releases it when the worker dies, which is what makes the slot reusable. The lowest
  free slot is taken so a restarted worker gets back a stable instance name.
* The reporter holds the reporter lock for its lifetime: "is a reporter running?" is one
  ``F_GETLK`` away and survives pid reuse.
* Whoever shuts the application down cleanly unlinks the file; :func:`cleanup_stale`
  removes arenas whose owner is gone and which no reporter is draining.

Discovery: arenas live in one directory (``/dev/shm`` by default) under
``<prefix>-<uid>-<owner pid>.arena``; the header carries the owner's start time so a
reused pid is not mistaken for the owner.
"""

from __future__ import annotations

import glob
import mmap
import os
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass

from ipc import _layout as L
from ipc import _locks
from ipc.ring import RingReader, RingStats, RingWriter, read_stats
from ipc.status import StatusBlock
from ipc.wakeup import Doorbell, create_fifo, fifo_path

DEFAULT_DIRECTORY = "/dev/shm"
DEFAULT_PREFIX = "swmp"
DEFAULT_SLOTS = 64
DEFAULT_RING_CAPACITY = 4 * 1024 * 1024
MAX_SLOTS = 4096


class ArenaError(Exception):
    """The arena cannot be created or opened (bad file, wrong owner, bad size...)."""


def process_start_ticks(pid: int) -> int:
    """Start time of ``pid`` in clock ticks since boot, or 0 if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return 0


def process_alive(pid: int, start_ticks: int) -> bool:
    if pid <= 0:
        return False
    ticks = process_start_ticks(pid)
    return ticks != 0 and (start_ticks == 0 or ticks == start_ticks)


def arena_path(owner_pid: int, directory: str = DEFAULT_DIRECTORY, prefix: str = DEFAULT_PREFIX) -> str:
    return os.path.join(directory, f"{prefix}-{os.getuid()}-{owner_pid}.arena")


@dataclass(frozen=True)
class ArenaInfo:
    path: str
    slots: int
    ring_capacity: int
    owner_pid: int
    owner_start_ticks: int
    created_ns: int
    uid: int
    meta: bytes

    @property
    def owner_alive(self) -> bool:
        return process_alive(self.owner_pid, self.owner_start_ticks)


class Arena:
    """A mapped arena file. Create with :meth:`create`, attach with :meth:`open`."""

    def __init__(self, path: str, fd: int, mm: mmap.mmap, created: bool) -> None:
        self.path = path
        self.created = created
        self._fd = fd
        self._mm = mm
        self._buf = memoryview(mm)
        self._header = self._buf[: L.HEADER_SIZE].cast("Q")
        status_raw = self._buf[L.HEADER_SIZE : L.SLOTS_OFFSET]
        self.status = StatusBlock(status_raw.cast("Q"), status_raw)
        self.slots = int(self._header[L.H_SLOTS])
        self.ring_capacity = int(self._header[L.H_CAPACITY])
        self._doorbell = Doorbell(path)
        self._claimed: int | None = None
        self._reporter = False

    # -- creation and attachment -----------------------------------------------------------
    @classmethod
    def create(
        cls,
        path: str,
        slots: int = DEFAULT_SLOTS,
        ring_capacity: int = DEFAULT_RING_CAPACITY,
        meta: bytes = b"",
        owner_pid: int | None = None,
    ) -> Arena:
        """Create a new arena; raises FileExistsError if one is already at ``path``."""
        if not 1 <= slots <= MAX_SLOTS:
            raise ArenaError(f"slot count must be 1..{MAX_SLOTS}, got {slots}")
        if ring_capacity < 4096 or ring_capacity & (ring_capacity - 1) or ring_capacity > 1 << 30:
            raise ArenaError(f"ring capacity must be a power of two in 4 KiB..1 GiB, got {ring_capacity}")
        if len(meta) > L.META_MAX:
            raise ArenaError(f"arena meta data is {len(meta)} bytes, at most {L.META_MAX} fit")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            size = L.file_size(slots, ring_capacity)
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            _unlink_quietly(path)
            raise
        owner = os.getpid() if owner_pid is None else owner_pid
        h = memoryview(mm)[: L.HEADER_SIZE].cast("Q")
        h[L.H_VERSION] = L.LAYOUT_VERSION
        h[L.H_SLOTS] = slots
        h[L.H_CAPACITY] = ring_capacity
        h[L.H_OWNER_PID] = owner
        h[L.H_OWNER_START] = process_start_ticks(owner)
        h[L.H_CREATED_NS] = time.time_ns()
        h[L.H_UID] = os.getuid()
        h[L.H_META_LEN] = len(meta)
        mm[L.META_OFFSET : L.META_OFFSET + len(meta)] = meta
        h[L.H_MAGIC] = L.MAGIC  # last: attachers wait for it
        h.release()
        create_fifo(path)
        return cls(path, fd, mm, created=True)

    @classmethod
    def open(cls, path: str, wait_s: float = 2.0) -> Arena:
        """Attach to an existing arena, waiting up to ``wait_s`` for its creator to finish."""
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid():
                raise ArenaError(f"{path} belongs to uid {st.st_uid}, not to us ({os.getuid()})")
            deadline = time.monotonic() + wait_s
            while True:
                size = os.fstat(fd).st_size
                if size >= L.SLOTS_OFFSET:
                    head = os.pread(fd, 64, 0)
                    magic, version, slots, capacity = (
                        int.from_bytes(head[i : i + 8], "little") for i in range(0, 32, 8)
                    )
                    if magic == L.MAGIC:
                        break
                if time.monotonic() > deadline:
                    raise ArenaError(f"{path} is not an initialized swmp arena")
                time.sleep(0.01)
            if version != L.LAYOUT_VERSION:
                raise ArenaError(f"{path} has layout version {version}, this build reads {L.LAYOUT_VERSION}")
            if not 1 <= slots <= MAX_SLOTS or capacity & (capacity - 1) or capacity < 4096:
                raise ArenaError(f"{path} has an implausible header (slots={slots}, capacity={capacity})")
            expected = L.file_size(slots, capacity)
            if size != expected:
                raise ArenaError(f"{path} is {size} bytes, its header implies {expected}")
            mm = mmap.mmap(fd, expected, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, mm, created=False)

    @classmethod
    def create_or_open(
        cls,
        path: str,
        slots: int = DEFAULT_SLOTS,
        ring_capacity: int = DEFAULT_RING_CAPACITY,
        meta: bytes = b"",
        owner_pid: int | None = None,
    ) -> Arena:
        """Create the arena, or attach if another process won the race to create it."""
        try:
            return cls.create(path, slots, ring_capacity, meta, owner_pid)
        except FileExistsError:
            return cls.open(path)

    # -- description -----------------------------------------------------------------------
    def info(self) -> ArenaInfo:
        h = self._header
        n = min(int(h[L.H_META_LEN]), L.META_MAX)
        return ArenaInfo(
            path=self.path,
            slots=self.slots,
            ring_capacity=self.ring_capacity,
            owner_pid=int(h[L.H_OWNER_PID]),
            owner_start_ticks=int(h[L.H_OWNER_START]),
            created_ns=int(h[L.H_CREATED_NS]),
            uid=int(h[L.H_UID]),
            meta=bytes(self._mm[L.META_OFFSET : L.META_OFFSET + n]),
        )

    # -- slots -----------------------------------------------------------------------------
    def _control(self, slot: int) -> memoryview:
        base = L.SLOTS_OFFSET + slot * L.slot_stride(self.ring_capacity)
        return self._buf[base : base + L.CONTROL_SIZE].cast("Q")

    def _data(self, slot: int) -> memoryview:
        base = L.SLOTS_OFFSET + slot * L.slot_stride(self.ring_capacity) + L.CONTROL_SIZE
        return self._buf[base : base + self.ring_capacity]

    def claim_slot(self) -> RingWriter | None:
        """Claim the lowest free slot for this process; None when every slot is taken.

        Call it in the process that will write (after fork): locks are per process.
        """
        for slot in range(self.slots):
            if _locks.try_lock(self._fd, L.slot_lock_offset(slot)):
                self._claimed = slot
                c = self._control(slot)
                pid = os.getpid()
                c[L.C_OWNER_PID] = pid
                c[L.C_OWNER_START] = process_start_ticks(pid)
                c[L.C_CLAIMS] = c[L.C_CLAIMS] + 1
                c[L.C_CLAIMED_NS] = time.time_ns()
                return RingWriter(slot, c, self._data(slot), self.status._w, self._doorbell)
        return None

    def release_slot(self) -> None:
        """Give up this process's slot (clean worker exit)."""
        if self._claimed is not None:
            _locks.unlock(self._fd, L.slot_lock_offset(self._claimed))
            self._claimed = None

    def slot_owner(self, slot: int) -> int | None:
        """Pid of the live process holding ``slot`` (None if free or held by this process)."""
        return _locks.holder(self._fd, L.slot_lock_offset(slot))

    def live_slots(self) -> dict[int, int]:
        """``{slot: pid}`` for every slot held by a live process other than this one."""
        out = {}
        for slot in range(self.slots):
            pid = self.slot_owner(slot)
            if pid is not None:
                out[slot] = pid
        return out

    def reader(self, slot: int, types: Collection[int] | None = None) -> RingReader:
        base = L.SLOTS_OFFSET + slot * L.slot_stride(self.ring_capacity) + L.CONTROL_SIZE
        return RingReader(slot, self._control(slot), self._data(slot), mapping=self._mm, base=base, types=types)

    def ring_stats(self, slot: int) -> RingStats:
        return read_stats(slot, self._control(slot), self.ring_capacity)

    def slot_identity(self, slot: int) -> tuple[int, int, int]:
        """``(last owner pid, claims so far, claimed at ns)`` as recorded in the slot."""
        c = self._control(slot)
        return int(c[L.C_OWNER_PID]), int(c[L.C_CLAIMS]), int(c[L.C_CLAIMED_NS])

    # -- the reporter role -----------------------------------------------------------------
    def try_become_reporter(self) -> bool:
        """Take the reporter lock; False if another live process already holds it."""
        if self._reporter:
            return True
        if _locks.try_lock(self._fd, L.LOCK_REPORTER):
            self._reporter = True
            self.status.begin_reporter(os.getpid())
        return self._reporter

    def release_reporter(self) -> None:
        if self._reporter:
            self.status.end_reporter()
            _locks.unlock(self._fd, L.LOCK_REPORTER)
            self._reporter = False

    def reporter_pid(self) -> int | None:
        """Pid of the live reporter, or None. (This process's own role is not reported.)"""
        return _locks.holder(self._fd, L.LOCK_REPORTER)

    @property
    def is_reporter(self) -> bool:
        return self._reporter

    # -- teardown --------------------------------------------------------------------------
    def close(self) -> None:
        """Unmap and close. Releases this process's slot and reporter locks."""
        if self._fd < 0:
            return
        self._doorbell.close()
        try:
            self._mm.close()
        except BufferError:
            # Ring writers/readers still hold views into the mapping; it goes with them.
            pass
        os.close(self._fd)
        self._fd = -1

    def unlink(self) -> None:
        _unlink_quietly(self.path)
        _unlink_quietly(fifo_path(self.path))

    def __enter__(self) -> Arena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def discover(directory: str = DEFAULT_DIRECTORY, prefix: str = DEFAULT_PREFIX) -> Iterator[str]:
    """Arena files of the current user in ``directory``, newest first."""
    paths = glob.glob(os.path.join(directory, f"{prefix}-{os.getuid()}-*.arena"))
    paths.sort(key=lambda p: _mtime(p), reverse=True)
    yield from paths


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def read_info(path: str) -> ArenaInfo:
    with Arena.open(path, wait_s=0) as arena:
        return arena.info()


def cleanup_stale(directory: str = DEFAULT_DIRECTORY, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Remove arenas whose owner is dead and that no reporter is draining.

    Returns the removed paths. Files that cannot be read as arenas are left alone (they
    may be someone else's) unless they are ours by name and empty.
    """
    removed = []
    for path in discover(directory, prefix):
        try:
            arena = Arena.open(path, wait_s=0)
        except (ArenaError, OSError):
            try:
                if os.stat(path).st_size == 0 and time.time() - _mtime(path) > 10:
                    arena_unlink(path)
                    removed.append(path)
            except OSError:
                pass
            continue
        try:
            info = arena.info()
            if info.owner_alive or arena.reporter_pid() is not None:
                continue
            if any(arena.slot_owner(s) is not None for s in range(arena.slots)):
                continue
            arena.unlink()
            removed.append(path)
        finally:
            arena.close()
    return removed


def arena_unlink(path: str) -> None:
    _unlink_quietly(path)
    _unlink_quietly(fifo_path(path))
