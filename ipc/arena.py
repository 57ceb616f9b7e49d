"""The arena: one shared file per application holding a status block and N ring slots.

Lifecycle
---------
* The owner (the application's master process) creates it with ``O_CREAT | O_EXCL`` and
  mode 0600 before forking workers; creation is exclusive, so when several processes race
  (uWSGI ``lazy-apps`` imports the application in every worker) exactly one wins and the
  others attach. The header is filled in first and the magic word stored last, so an
  attacher never trusts a half-written header.
* Workers claim a slot after fork by taking a byte-range lock (see ``_locks``); the kernel
  releases it when the worker dies, however it dies, which is what makes the slot reusable.
  No pid is trusted for ownership, so pid reuse cannot confuse it. The lowest free slot is
  taken so a restarted worker gets back a stable instance name.
* The reporter holds the reporter lock for its lifetime: "is a reporter running?" is one
  ``F_GETLK`` away and survives pid reuse.
* Whoever shuts the application down cleanly unlinks the file; :func:`cleanup_stale`
  removes arenas whose owner is gone and which nobody holds a lock on.

Discovery: arenas live in the user's private directory inside the arena directory
(``/dev/shm/swmp-<uid>/`` by default, 0700, see ``private``) under
``<prefix>-<uid>-<owner pid>-<owner start ticks>.arena``: any process of the same user that
knows the owner's pid finds it, a reused pid names a different file, and no other user can
put anything at that name. The header carries the same identity for tools that only have
the file. Every file is opened without following links and checked by its descriptor
(regular file, ours, 0600) before it is mapped.

POSIX locks belong to the process and closing *any* descriptor of the file releases them,
so a process must never ``open()`` an arena file behind this module's back while it holds
a slot or the reporter role; every :class:`Arena` of a process shares one descriptor per
file (see ``_files``).
"""

from __future__ import annotations

import contextlib
import glob
import mmap
import os
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from ipc import _files, _locks, private, ring_room
from ipc import _layout as L
from ipc.board import Board
from ipc.lost import LostCounts
from ipc.procinfo import boot_time_ns, process_alive, process_start_ticks
from ipc.ring import RingReader, RingStats, RingWriter, file_writer, read_stats
from ipc.status import StatusBlock
from ipc.wakeup import Doorbell, create_fifo, fifo_path

DEFAULT_DIRECTORY = "/dev/shm"
DEFAULT_PREFIX = "swmp"
DEFAULT_SLOTS = 64
DEFAULT_RING_CAPACITY = 4 * 1024 * 1024
MAX_SLOTS = 4096
MODE = 0o600


class ArenaError(Exception):
    """The arena cannot be created or opened (bad file, wrong owner, bad size...)."""


def arena_path(owner_pid: int, directory: str = DEFAULT_DIRECTORY, prefix: str = DEFAULT_PREFIX) -> str:
    """Where the arena of the application whose master is ``owner_pid`` lives.

    Inside this user's private directory in ``directory``, which is created (or checked)
    now; raises ``private.UnsafePathError`` if ``directory`` cannot hold one safely.
    """
    ticks = process_start_ticks(owner_pid)
    return os.path.join(
        private.private_directory(directory, prefix), f"{prefix}-{os.getuid()}-{owner_pid}-{ticks}.arena"
    )


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
        # Start ticks count from boot: an arena older than this boot (a directory that
        # survives reboots) has a dead owner whatever its pid and ticks say now.
        boot = boot_time_ns()
        if boot and self.created_ns and self.created_ns < boot - 1_000_000_000:
            return False
        return process_alive(self.owner_pid, self.owner_start_ticks)


class SlotViews:
    """Where each slot's control words and ring data are in the mapped file."""

    def __init__(self, buf: memoryview, slots: int, ring_capacity: int) -> None:
        self._buf = buf
        self._slots = slots
        self._capacity = ring_capacity
        self._stride = L.slot_stride(ring_capacity)

    def base(self, slot: int) -> int:
        if not 0 <= slot < self._slots:
            raise IndexError(f"slot {slot} out of range 0..{self._slots - 1}")
        return L.SLOTS_OFFSET + slot * self._stride

    def control(self, slot: int) -> memoryview:
        base = self.base(slot)
        return self._buf[base : base + L.CONTROL_SIZE].cast("Q")

    def data(self, slot: int) -> memoryview:
        base = self.base(slot) + L.CONTROL_SIZE
        return self._buf[base : base + self._capacity]


class Arena:
    """A mapped arena file. Create with :meth:`create`, attach with :meth:`open`."""

    def __init__(self, path: str, shared: _files.SharedFile, created: bool) -> None:
        assert shared.mm is not None
        self.path = path
        self.created = created
        self._shared = shared
        self._mm = shared.mm  # shared by every Arena of this process on this file
        self._buf = memoryview(self._mm)
        self._header = self._buf[: L.HEADER_SIZE].cast("Q")
        status_raw = self._buf[L.HEADER_SIZE : L.BOARD_OFFSET]
        self.status = StatusBlock(status_raw.cast("Q"), status_raw)
        board_raw = self._buf[L.BOARD_OFFSET : L.SLOTS_OFFSET]
        self.board = Board(board_raw.cast("Q"), board_raw)  # the reporter posts, writers read
        self.slots = int(self._header[L.H_SLOTS])
        self.ring_capacity = int(self._header[L.H_CAPACITY])
        self.views = SlotViews(self._buf, self.slots, self.ring_capacity)
        self._doorbell = Doorbell(path)
        self._claimed: dict[int, RingWriter] = {}  # slots claimed through this object
        self._claimed_pid = os.getpid()
        self._reporter = False
        self._closed = False
        self._detached = False  # closed, and the registry entry released

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
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, MODE)
        try:
            os.fchmod(fd, MODE)  # exactly 0600 whatever the umask
            size = L.file_size(slots, ring_capacity)
            os.ftruncate(fd, size)
            ring_room.reserve_fixed_parts(fd, slots, ring_capacity)  # ENOSPC here, not SIGBUS later
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
        return cls(path, _files.register_new(fd, mm, path), created=True)

    @classmethod
    def open(cls, path: str, wait_s: float = 2.0) -> Arena:
        """Attach to an existing arena, waiting up to ``wait_s`` for its creator to finish."""
        shared, _fresh = _files.open_existing(path)
        try:
            with shared.lock:
                if shared.mm is None:  # first open in this process: check and map it
                    shared.mm = _map_checked(path, shared.fd, wait_s)
        except BaseException:
            _files.release(shared)
            raise
        return cls(path, shared, created=False)

    @classmethod
    def create_or_open(
        cls,
        path: str,
        slots: int = DEFAULT_SLOTS,
        ring_capacity: int = DEFAULT_RING_CAPACITY,
        meta: bytes = b"",
        owner_pid: int | None = None,
    ) -> Arena:
        """Create the arena, or attach if another process won the race to create it.

        A file left at ``path`` by an owner that is gone (possible only in a directory
        that survives a reboot: the name carries the owner's start time) and that nobody
        holds a lock on is replaced.
        """
        for attempt in range(2):
            try:
                return cls.create(path, slots, ring_capacity, meta, owner_pid)
            except FileExistsError:
                pass
            try:
                arena = cls.open(path)
            except FileNotFoundError:
                continue  # removed between our create and open: try again
            if attempt == 0 and arena._replaceable():
                arena.close()
                _unlink_if_same(path, arena)
                continue
            return arena
        return cls.open(path)

    def _replaceable(self) -> bool:
        try:
            return not self.info().owner_alive and self.reporter_pid() is None and not self.live_slots()
        except OSError:
            return False

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
    def _mine(self) -> dict[int, RingWriter]:
        """Slots claimed through this object *by this process* (a forked child has none)."""
        if self._claimed_pid != os.getpid():
            self._claimed_pid = os.getpid()
            self._claimed = {}
            self._reporter = False
        return self._claimed

    def claim_slot(self, *, highest: bool = False) -> RingWriter | None:
        """Claim the lowest free slot for this process; None when every slot is taken.

        ``highest``: the highest free slot instead, for a process that must not take the
        low slot numbers its siblings are named after.

        Call it in the process that will write (after fork): locks are per process. Slots
        this process already holds (through any Arena object) are never handed out again.
        """
        shared = self._shared
        order = range(self.slots - 1, -1, -1) if highest else range(self.slots)
        with shared.lock:
            held = shared.held().slots
            for slot in order:
                if slot in held or not _locks.try_lock(_descriptor(self), L.slot_lock_offset(slot)):
                    continue
                held.add(slot)
                c = self.views.control(slot)
                pid = os.getpid()
                c[L.C_OWNER_PID] = pid
                c[L.C_OWNER_START] = process_start_ticks(pid)
                c[L.C_CLAIMS] += 1
                c[L.C_CLAIMED_NS] = time.time_ns()
                fd = ring_room.weak_call(_descriptor, self)  # its pages get room before they are written
                writer = file_writer(slot, c, self.views, self.status._w, self._doorbell, mm=self._mm, fd=fd)
                self._mine()[slot] = writer
                return writer
        return None

    def release_slot(self, slot: int | None = None) -> None:
        """Give up a slot claimed through this object (default: all of them).

        Its writer is disabled first: once the lock is gone another process may claim the
        slot, and two writers on one ring would corrupt it.
        """
        mine = self._mine()
        shared = self._shared
        for s in list(mine) if slot is None else [slot]:
            writer = mine.pop(s, None)
            if writer is None:
                continue
            writer._disable("released its slot")
            with shared.lock:
                shared.held().slots.discard(s)
                _locks.unlock(_descriptor(self), L.slot_lock_offset(s))

    def slot_owner(self, slot: int) -> int | None:
        """Pid of the live process holding ``slot`` (None if free or held by this process)."""
        return _locks.holder(_descriptor(self), L.slot_lock_offset(slot))

    def live_slots(self, slots: Iterable[int] | None = None) -> dict[int, int]:
        """``{slot: pid}`` for every slot (of ``slots``, default all) held by a live process
        other than this one."""
        out = {}
        fd = _descriptor(self)  # checked (an fstat) once for the whole scan
        for slot in range(self.slots) if slots is None else slots:
            pid = _locks.holder(fd, L.slot_lock_offset(slot))
            if pid is not None:
                out[slot] = pid
        return out

    def own_slots(self) -> set[int]:
        """Slots this process holds (through any Arena object on this file)."""
        with self._shared.lock:
            return set(self._shared.held().slots)

    def reader(self, slot: int, types: Collection[int] | None = None) -> RingReader:
        base = self.views.base(slot) + L.CONTROL_SIZE
        control, data = self.views.control(slot), self.views.data(slot)
        return RingReader(slot, control, data, mapping=self._mm, base=base, types=types)

    def ring_stats(self, slot: int) -> RingStats:
        return read_stats(slot, self.views.control(slot), self.ring_capacity)

    def slot_identity(self, slot: int) -> tuple[int, int, int]:
        """``(last owner pid, claims so far, claimed at ns)`` as recorded in the slot."""
        c = self.views.control(slot)
        return int(c[L.C_OWNER_PID]), int(c[L.C_CLAIMS]), int(c[L.C_CLAIMED_NS])

    # -- counters of records that no ring took ------------------------------------------------
    def add_counts(self, increments: dict[int, int]) -> None:
        """Add to shared header counters (``{header word: n}``, ``H_NO_SLOT_RECORDS``...).

        Several processes add: the read-add-write runs under a byte-range lock (waited
        for: it is held for a few instructions, and the kernel drops it if its holder
        dies). Callers batch their increments; this is a system call pair per call.
        """
        shared = self._shared
        with shared.lock:  # POSIX locks are per process: threads serialize here first
            if not _locks.lock_wait(_descriptor(self), L.LOCK_COUNTERS):
                return
            try:
                for word, n in increments.items():
                    if word in L.COUNTER_WORDS and n > 0:
                        self._header[word] = int(self._header[word]) + n
            finally:
                _locks.unlock(_descriptor(self), L.LOCK_COUNTERS)

    def lost_counts(self) -> LostCounts:
        """What no ring took: see :class:`LostCounts`."""
        return LostCounts.read(self._header)

    # -- the reporter role -----------------------------------------------------------------
    def try_become_reporter(self) -> bool:
        """Take the reporter lock; False if another live process already holds it."""
        self._mine()
        if self._reporter:
            return True
        shared = self._shared
        with shared.lock:
            if shared.held().reporter:
                return False  # another Arena object of this process has the role
            if not _locks.try_lock(_descriptor(self), L.LOCK_REPORTER):
                return False
            shared.reporter = True
        self._reporter = True
        self.status.begin_reporter(os.getpid())
        return True

    def release_reporter(self) -> None:
        self._mine()
        if self._reporter:
            self.status.end_reporter()
            with self._shared.lock:
                self._shared.held().reporter = False
                _locks.unlock(_descriptor(self), L.LOCK_REPORTER)
            self._reporter = False

    def reporter_pid(self) -> int | None:
        """Pid of the live reporter, or None. (This process's own role is not reported.)"""
        return _locks.holder(_descriptor(self), L.LOCK_REPORTER)

    @property
    def is_reporter(self) -> bool:
        self._mine()
        return self._reporter

    # -- teardown --------------------------------------------------------------------------
    def close(self) -> None:
        """Unmap and close. Releases the slots and reporter role taken through this object."""
        if self._closed:
            return
        self._closed = True
        try:
            self.release_slot()
            self.release_reporter()
        finally:
            self._doorbell.close()
            # Our views go; the mapping itself belongs to the process-wide registry, which
            # closes it with the last user (closing it can release locks: see _files).
            self._header.release()
            self.status.release()
            self.board.release()
            self._buf.release()
            _files.release(self._shared)
            self._detached = True

    def unlink(self) -> None:
        arena_unlink(self.path)

    def __enter__(self) -> Arena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _map_checked(path: str, fd: int, wait_s: float) -> mmap.mmap:
    """Validate an arena file (waiting up to ``wait_s`` for its creator) and map it."""
    try:
        private.check_descriptor(fd, path, "regular")
    except private.UnsafePathError as exc:
        raise ArenaError(str(exc)) from None
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
        if time.monotonic() >= deadline:
            raise ArenaError(f"{path} is not an initialized swmp arena")
        time.sleep(0.01)
    if version != L.LAYOUT_VERSION:
        raise ArenaError(f"{path} has layout version {version}, this build reads {L.LAYOUT_VERSION}")
    if not 1 <= slots <= MAX_SLOTS or capacity & (capacity - 1) or not 4096 <= capacity <= 1 << 30:
        raise ArenaError(f"{path} has an implausible header (slots={slots}, capacity={capacity})")
    expected = L.file_size(slots, capacity)
    if size != expected:
        raise ArenaError(f"{path} is {size} bytes, its header implies {expected}")
    return mmap.mmap(fd, expected, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _unlink_if_same(path: str, arena: Arena) -> None:
    """Unlink ``path`` only if it is still the file ``arena`` had open."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if (st.st_dev, st.st_ino) == arena._shared.key:
        arena_unlink(path)


def arena_unlink(path: str) -> None:
    """Remove an arena file, its doorbell FIFO and any sidecar file named ``<path>.<suffix>``
    (users of the arena may keep small state files beside it; they die with it)."""
    _unlink_quietly(path)
    _unlink_quietly(fifo_path(path))
    for sidecar in glob.glob(glob.escape(path) + ".*"):
        _unlink_quietly(sidecar)


def _descriptor(arena: Arena) -> int:
    """``arena``'s descriptor in this process (-1 once closed; see ``_files``: checked and opened
    again when the process closed it, its slot locks taken again). A slot another process
    claimed in between is not this process's any more: its writer stops (two writers on one
    ring would corrupt it). A function: the class is at its size limit."""
    if arena._detached:
        return -1
    shared = arena._shared
    fd = shared.descriptor()
    mine = arena._mine()
    if mine and shared.pid == os.getpid():
        for slot in [s for s in list(mine) if s not in shared.slots]:  # a snapshot: threads
            writer = mine.pop(slot, None)
            if writer is not None:
                writer._disable("lost its slot to another process while the arena was closed")
    return fd
