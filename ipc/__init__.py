"""Shared-memory arena and single-producer rings. Knows nothing of what the bytes mean."""

from ipc.arena import (
    DEFAULT_DIRECTORY,
    DEFAULT_RING_CAPACITY,
    DEFAULT_SLOTS,
    Arena,
    ArenaError,
    ArenaInfo,
    arena_path,
    arena_unlink,
)
from ipc.arena_files import cleanup_stale, discover, read_info, still_linked
from ipc.board import Board, BoardTooLarge
from ipc.procinfo import process_alive, process_start_ticks
from ipc.ring import RingReader, RingStats, RingWriter
from ipc.status import StatusBlock, StatusSnapshot
from ipc.wakeup import Doorbell, DoorbellListener

__all__ = [
    "DEFAULT_DIRECTORY",
    "DEFAULT_RING_CAPACITY",
    "DEFAULT_SLOTS",
    "Arena",
    "ArenaError",
    "ArenaInfo",
    "Board",
    "BoardTooLarge",
    "Doorbell",
    "DoorbellListener",
    "RingReader",
    "RingStats",
    "RingWriter",
    "StatusBlock",
    "StatusSnapshot",
    "arena_path",
    "arena_unlink",
    "cleanup_stale",
    "discover",
    "process_alive",
    "process_start_ticks",
    "read_info",
    "still_linked",
]
