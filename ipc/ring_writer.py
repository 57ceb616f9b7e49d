"""The writer's end of a ring: appends records, never blocks, counts what it drops.

The protocol (publication order, ownership of the control words) is described in
``ipc/ring.py``; the byte layout in ``ipc/_layout.py``.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ipc import _layout as L
from ipc.ring_pages import PageReturner
from ipc.ring_room import RingRoom
from ipc.ring_stats import RingStats, read_stats

log = logging.getLogger("ipc")


# Writers alive in this process, so a fork can disable the copies the child inherits.
_writers: weakref.WeakSet[RingWriter] = weakref.WeakSet()


def _disable_inherited_writers() -> None:
    for writer in list(_writers):
        writer._disable("inherited across fork")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disable_inherited_writers)


class RingWriter:
    """Appends records to one slot's ring. Thread-safe within one process.

    ``control`` is the slot's control block viewed as u64 words, ``data`` its data area,
    ``status`` the arena's status block as u64 words (for the reader's sleeping flag).

    ``write(rtype, payload) -> bool`` is an attribute holding a closure rather than a
    method: every piece of state it touches is a local or a closure cell, which is what
    gets the hot path under a microsecond (see docs/performance.md). A writer inherited
    by a forked child, or whose slot was released, is disabled: it drops (and counts)
    everything, because the slot is no longer this process's to write.
    """

    __slots__ = (
        "__weakref__",
        "_cap",
        "_control",
        "_counter_lock",
        "_forward",
        "_live",
        "_lost",
        "_max_payload",
        "slot",
        "write",
    )

    write: Callable[[int, bytes], bool]

    def __init__(
        self,
        slot: int,
        control: memoryview,
        data: memoryview,
        status: memoryview,
        wake: Callable[[], None] | None = None,
        *,
        pages: PageReturner | None = None,
        room: RingRoom | None = None,
    ) -> None:
        capacity = len(data)
        if capacity < 4096 or capacity & (capacity - 1) or control.format != "Q":
            raise ValueError("ring data must be a power of two >= 4096 bytes, control a u64 view")
        self.slot = slot
        self._control = control
        self._cap = capacity
        # A record may use at most half the ring: with worst-case end padding it still fits.
        self._max_payload = capacity // 2 - L.RECORD_HEADER_SIZE
        self._lost = 0  # writes refused after the writer was disabled, not forwarded (below)
        # Where refused writes go once disabled (``forward_refused``): a disabled writer may
        # no longer store its slot's words, so only its owner can count them somewhere shared.
        self._forward: Callable[[int], object] | None = None
        self._live = True  # False once disabled: the slot's words are no longer ours to store
        # Serializes this process's threads on the unbuilt count's read-add-write. Re-entrant:
        # a signal handler that logs, run inside an add of the same thread, must not wait for it.
        self._counter_lock = threading.RLock()
        self.write = _make_write(
            slot, control=control, data=data, status=status, wake=wake, cap=capacity, pages=pages, room=room
        )
        _writers.add(self)

    @property
    def capacity(self) -> int:
        return self._cap

    @property
    def max_payload(self) -> int:
        return self._max_payload

    @property
    def tail(self) -> int:
        """The published tail (what the reader can see)."""
        return int(self._control[L.C_TAIL])

    @property
    def disabled_drops(self) -> int:
        """Records refused after this writer was disabled (fork, slot released) that no
        ``forward_refused`` function took: counted in this process's memory only."""
        return self._lost

    def forward_refused(self, forward: Callable[[int], object] | None) -> None:
        """Once this writer is disabled, hand the count of every record it refuses to
        ``forward(n)`` (which must not raise: if it does, the record stays in
        :attr:`disabled_drops`), along with those it refused before this call. The slot's own
        words are not this process's to store any more (another process may hold the slot;
        a forked child never held it): its owner counts them where it can (another ring,
        the arena header). Inherited by a forked child with the writer."""
        self._forward = forward
        with self._counter_lock:
            lost, self._lost = self._lost, 0
        self._refused(lost)

    def _refused(self, n: int) -> None:
        forward = self._forward
        if n <= 0:
            return
        if forward is not None:
            try:
                forward(n)
                return
            except Exception:
                pass
        with self._counter_lock:
            self._lost += n

    def add_unbuilt(self, n: int = 1) -> bool:
        """Count ``n`` records this process meant to write into this ring but could not
        encode (``C_UNBUILT_RECORDS``), where every reader of the arena sees them. Never
        raises; False (not counted) once the writer is disabled: the slot is not ours."""
        return self._add(L.C_UNBUILT_RECORDS, n)

    def add_prestart(self, n: int) -> bool:
        """Count ``n`` records this process made before it had a ring (``C_PRESTART_RECORDS``);
        as :meth:`add_unbuilt`."""
        return self._add(L.C_PRESTART_RECORDS, n)

    def add_stale(self, n: int) -> bool:
        """Count ``n`` records that an earlier, disabled writer of this process refused
        (``C_STALE_RECORDS``; see :meth:`forward_refused`); as :meth:`add_unbuilt`."""
        return self._add(L.C_STALE_RECORDS, n)

    def add_bad_input(self, n: int = 1) -> bool:
        """Count ``n`` pieces of bad input this process refused (``C_BAD_INPUT``: a malformed
        incoming ``sw8`` header, for one); as :meth:`add_unbuilt`."""
        return self._add(L.C_BAD_INPUT, n)

    def _add(self, word: int, n: int) -> bool:
        if n <= 0 or not self._live:
            return False
        try:
            with self._counter_lock:
                control = self._control
                control[word] = (int(control[word]) + n) & _U64
        except Exception:  # a torn-down mapping
            return False
        return True

    def stats(self) -> RingStats:
        return read_stats(self.slot, self._control, self._cap)

    def _disable(self, why: str) -> None:
        self._live = False
        logged = False

        def refuse(rtype: int, payload: bytes) -> bool:
            nonlocal logged
            self._refused(1)
            if not logged:
                logged = True
                log.warning("ring slot %d: writer %s; records are dropped", self.slot, why)
            return False

        self.write = refuse


def _no_wake() -> None:
    pass


_HEADER_PACK = L.RECORD_HEADER.pack_into
_U64 = (1 << 64) - 1
_FAST_PAYLOADS = (bytes, bytearray)  # what the native writer writes itself, too


def _pack_generic(buf: memoryview, offset: int, *fields: Any) -> None:
    """Same arguments as the cached packers' ``pack_into``: (n, rtype, check, payload)."""
    n, rtype, check, payload = fields
    _HEADER_PACK(buf, offset, n, rtype, check)
    buf[offset + 8 : offset + 8 + n] = payload


def _refuse(buf: memoryview, offset: int, *fields: Any) -> None:
    raise OverflowError("record larger than the ring's max_payload")


class _Packers(dict[int, Callable[..., None]]):
    """``pack_into`` of ``Struct("<IHH{n}s")`` per payload length ``n``, made on first use.

    Bounded (a Struct is a few hundred bytes): past the limit, lengths not seen yet get the
    generic two-step packer. Lengths over ``max_payload`` get one that raises, which sends
    the record to the slow path (and its oversize count) at no cost to the fast path.
    """

    def __init__(self, max_payload: int) -> None:
        super().__init__()
        self.max_payload = max_payload

    def __missing__(self, n: int) -> Callable[..., None]:
        if n > self.max_payload:
            return _refuse
        if len(self) >= L.RECORD_PACKER_CACHE:
            return _pack_generic
        packer = self[n] = struct.Struct(f"<IHH{n}s").pack_into
        return packer


class _State:
    """The writer's own copies (pure Python; ``ipc._ringwrite.Writer`` holds the same fields):
    its tail, the lap tag of the check word, ``limit`` (the fast path writes below it), the
    written count, and a head word found inconsistent (see ``slow``)."""

    __slots__ = ("insane_head", "limit", "tag", "tail", "written")

    def __init__(self) -> None:
        self.tail = self.tag = self.limit = self.written = 0
        self.insane_head = -1


PURE_ENV = "SWMP_RING_PURE"


def _native_writer() -> Any:
    """``ipc._ringwrite.Writer`` when it is built and not turned off (``SWMP_RING_PURE=1``)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        import ipc._ringwrite as _ringwrite  # noqa: PLC0415, PLR0402 (mypy: ipc.__all__ lists no private module)
    except ImportError:
        return None
    ok = (_ringwrite.C_TAIL, _ringwrite.C_WRITTEN, _ringwrite.C_HEAD, _ringwrite.S_SLEEPING) == (
        L.C_TAIL,
        L.C_WRITTEN_RECORDS,
        L.C_HEAD,
        L.S_SLEEPING,
    ) and (_ringwrite.WAKE_FILL_SHIFT, _ringwrite.HEADER_SIZE) == (L.WAKE_FILL_SHIFT, L.RECORD_HEADER_SIZE)
    ok = ok and hasattr(_ringwrite.Writer, "set_reentered")  # an older build: the pure path
    return _ringwrite.Writer if ok else None  # a build of another layout: the pure path


_NativeWriter = _native_writer()
NATIVE = _NativeWriter is not None


def _make_write(
    slot: int,
    *,
    control: memoryview,
    data: memoryview,
    status: memoryview,
    wake: Callable[[], None] | None,
    cap: int,
    pages: PageReturner | None = None,
    room: RingRoom | None = None,
    native: bool = NATIVE,
) -> Callable[[int, bytes], bool]:
    """Build the writer's hot path (see :class:`RingWriter`): the native ``Writer.write``
    when it is built, else a closure over locals; both share the slow path below.

    Measured choices (docs/performance.md): one cached ``Struct("<IHH{n}s").pack_into``
    stores header and payload in a single call; the writer does not load the head on every
    record but keeps ``limit``, a position it may write up to (the lower of the end of the
    current lap and the head it last saw plus the capacity). The head only grows, so the
    bound is conservative; the slow path refreshes it when a record does not fit under it.
    Records that would end exactly at the end of the lap also take the slow path, so the
    check word's lap tag only changes there. With ``pages`` (``ipc/ring_pages.py``) the
    limit also stops at every ``pages.stretch`` boundary, where the slow path frees the
    pages the reader is done with. With ``room`` (``ipc/ring_room.py``) it stops where the
    file system's room for the ring was reserved up to, and the slow path reserves more.
    """
    mask = cap - 1
    stretch_mask = pages.stretch - 1 if pages is not None else mask
    max_payload = cap // 2 - L.RECORD_HEADER_SIZE
    pad = L.PAD_TYPE
    C_HEAD, C_TAIL, C_WRITTEN = L.C_HEAD, L.C_TAIL, L.C_WRITTEN_RECORDS
    S_SLEEPING = L.S_SLEEPING
    wake_fill = cap >> L.WAKE_FILL_SHIFT
    packers = _Packers(max_payload)
    wake = wake if wake is not None else _no_wake

    def report(problem: str) -> None:
        log.error("ring slot %d: %s; dropped (further problems are only counted)", slot, problem)

    # The native writer holds buffer exports for its life: it gets views of its own (a
    # view with exports cannot be released, and the arena releases its status view on close).
    st: Any = (
        _NativeWriter(data[:], control[:], status[:], cap, wake, report)
        if native and _NativeWriter is not None
        else _State()
    )
    # The writer is the only one that moves the tail, so it keeps its own copy and carries
    # on from whatever the previous owner of the slot published.
    st.tail = int(control[C_TAIL])
    st.tag = L.lap_tag(st.tail, cap)
    st.limit = 0  # the first record takes the slow path, which loads the head
    st.written = int(control[C_WRITTEN])
    st.insane_head = -1

    no_room_said: list[bool] = []  # the full file system is logged once per writer

    def drop(n: int, oversize: bool) -> None:
        control[L.C_DROPPED_RECORDS] += 1
        control[L.C_DROPPED_BYTES] += n
        if oversize:
            control[L.C_OVERSIZE] += 1

    def slow(rtype: int, payload: bytes) -> str | bool:
        """Everything off the fast path: wrap, full ring, bad input, corrupt head word.

        Called with the lock held. Returns True/False (written/dropped) or a message to log
        (after the lock is released: a log handler may itself write to this ring).
        """
        n = len(payload)
        span = (n + 15) & -8
        if not 0 < rtype < pad:
            drop(n, False)
            return f"record type {rtype!r} is outside 1..65534"
        if n > max_payload:
            drop(n, True)
            return False
        t = st.tail
        head = int(control[C_HEAD])
        used = t - head
        # Re-storing our own tail costs nothing here and repairs a garbage tail word, so
        # a reader that waits for us to publish is never left waiting on a full ring.
        control[C_TAIL] = t
        if t & 7 and head < L.POSITION_LIMIT:
            # Our tail is garbage for certain (positions are 8-byte aligned): this writer
            # took it from a garbage word when the slot was claimed. Start at the head.
            t = (head + 7) & -8
            used = t - head
        elif not 0 <= used <= cap:
            # Impossible for a head the reader stored: one of the two words is garbage.
            # A garbage head is rewritten by the reader at its next read, so the first time
            # we only drop. If the same head is still there next time, nobody is repairing
            # it: our tail must be the garbage one (e.g. adopted from a garbage word when
            # the slot was claimed), so we continue from the head instead.
            if head != st.insane_head or head >= L.POSITION_LIMIT:
                st.insane_head = head
                st.limit = 0
                drop(n, False)
                return f"head word {head} is inconsistent with tail {t}"
            st.insane_head = -1
            t = (head + 7) & -8
            used = t - head
        elif pages is not None:
            freed = pages(t, head)  # before any write: a page freed here may be written below
            if freed is not None and room is not None:
                room.freed(*freed)
        offset = t & mask
        left = cap - offset
        extra = left if span > left else 0
        if used + extra + span > cap:
            st.limit = 0
            drop(n, False)
            return False
        if room is not None and not room.make(t + extra + span):
            # The file system has no room for the pages (a full /dev/shm): writing them
            # would be a SIGBUS. Dropped and counted; asked again at the next record.
            st.limit = 0
            drop(n, False)
            if no_room_said:
                return False
            no_room_said.append(True)
            return "the arena's file system is full (no room for the ring's pages)"
        if extra:
            # The record would straddle the end: fill the rest with a padding record.
            data[offset : offset + 8] = L.header_word(left - 8, pad, t, cap).to_bytes(8, "little")
            t += left
            offset = 0
        # The payload first (a payload of another type raises here, before a byte is
        # written), then its header, as the native writer does.
        data[offset + 8 : offset + 8 + n] = payload
        data[offset : offset + 8] = L.header_word(n, rtype, t, cap).to_bytes(8, "little")
        t += span
        control[C_TAIL] = t  # publish: one aligned 8-byte store, after the bytes
        st.tail = t
        st.written += 1
        control[C_WRITTEN] = st.written
        st.tag = L.lap_tag(t, cap)
        st.limit = min((t | stretch_mask) + 1, head + cap + 1)
        if room is not None:
            st.limit = min(st.limit, room.reserved + 1)
        return True

    def reentered(payload: Any) -> bool:
        """A write from inside a write of the same thread: dropped and counted, never waited
        for (the native writer calls it too)."""
        try:
            drop(len(payload), False)
        except Exception:
            pass
        return False

    def guarded_slow(rtype: int, payload: bytes) -> str | bool:
        # Anything the slow path cannot take (a str payload, a torn-down mapping) is
        # dropped, never raised.
        try:
            return slow(rtype, payload)
        except Exception as exc:
            try:
                drop(0, False)
            except Exception:
                pass
            return f"write failed: {exc!r}"

    if not isinstance(st, _State):
        st.set_slow(guarded_slow)
        st.set_reentered(reentered)
        return st.write  # type: ignore[no-any-return]

    # Re-entrant, with ``busy`` set while a write is under way: a write that this thread
    # starts from inside its own write (a signal handler or a finalizer that logs, run
    # between two bytecodes of it) must not wait for a lock it holds itself: that waits
    # forever. It is dropped and counted instead, and the ring is left to the outer write.
    # (A handler that runs before ``busy`` is set or after it is cleared writes as usual:
    # the outer write has not started, or has finished, changing the ring.)
    lock = threading.RLock()
    acquire = lock.acquire
    release = lock.release
    problem_logged = False
    busy = False

    def write(rtype: int, payload: bytes) -> bool:
        """Append one record; False (counted as dropped) when it does not fit right now."""
        nonlocal problem_logged, busy
        acquire()
        if busy:
            release()
            return reentered(payload)
        busy = True
        try:
            n = len(payload)
            t = st.tail
            end = t + ((n + 15) & -8)
            # Only bytes and bytearray take the fast path, as in the native writer: struct's
            # pack_into writes the header before it refuses a payload of another type, which
            # would leave it in the ring's unpublished bytes.
            if end < st.limit and payload.__class__ in _FAST_PAYLOADS:
                # Header (u32 length, u16 type, u16 check) and payload in one call. A type
                # outside 0..65535 makes it raise (handled below); types 0 and 65535 are not
                # checked here: the reader skips and counts such records.
                packers[n](data, t & mask, n, rtype, (n ^ rtype ^ st.tag) & 0xFFFF, payload)
                control[C_TAIL] = st.tail = end  # publish: one aligned 8-byte store, after the bytes
                st.written += 1
                control[C_WRITTEN] = st.written
                outcome: str | bool = True
            else:
                outcome = guarded_slow(rtype, payload)
        except Exception:
            # A payload struct does not take (memoryview...) goes the generic way.
            outcome = guarded_slow(rtype, payload)
        finally:
            busy = False
            # The lock release is an atomic read-modify-write (a full barrier on x86-64), so
            # the tail store above is visible before the sleeping flag is loaded below.
            release()
        if outcome is True:
            if status[S_SLEEPING] and st.tail - int(control[C_HEAD]) >= wake_fill:
                wake()
            return True
        if outcome is not False and not problem_logged:
            problem_logged = True
            report(outcome)
        return False

    return write
