"""Taking one stack: a thread's, an asyncio task's coroutine chain, or a greenlet's.

Every function here runs on the sampler thread and holds the GIL only for the walk itself
(reading frame objects: no allocation beyond the list of signatures). A stack is returned
outermost frame first, as the OAP builds its trees from the root, with at most ``depth``
frames: when a stack is deeper, the frames nearest the running code are the ones kept
(they name what is slow).

A frame's signature is ``<file>.<function>:<line>``.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any


def signature(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_filename}.{code.co_name}:{frame.f_lineno}"


def _signatures(innermost_first: list[FrameType], depth: int) -> list[str]:
    kept = innermost_first[:depth]
    kept.reverse()
    return [signature(f) for f in kept]


def _up_from(frame: FrameType | None, stop_at: FrameType | None = None) -> list[FrameType]:
    """``frame`` and its callers, innermost first; up to and including ``stop_at`` if met."""
    out = []
    while frame is not None:
        out.append(frame)
        if frame is stop_at:
            break
        frame = frame.f_back
    return out


def thread_stack(ident: int, depth: int) -> list[str]:
    """The stack of thread ``ident`` ([] when the thread is gone)."""
    frame = sys._current_frames().get(ident)
    return _signatures(_up_from(frame), depth) if frame is not None else []


def _awaited(obj: Any) -> Any:
    """What a coroutine, generator or async generator is suspended on (or None)."""
    for attr in ("cr_await", "gi_yieldfrom", "ag_await"):
        nxt = getattr(obj, attr, None)
        if nxt is not None:
            return nxt
    return None


def _frame_of(obj: Any) -> FrameType | None:
    for attr in ("cr_frame", "gi_frame", "ag_frame"):
        f = getattr(obj, attr, None)
        if f is not None:
            return f  # type: ignore[no-any-return]
    return None


def coroutine_stack(coro: Any, thread_ident: int, depth: int) -> list[str]:
    """The stack of the asyncio task whose coroutine is ``coro``, running on thread ``thread_ident``.

    A suspended task's stack is its await chain (``cr_await`` from coroutine to
    coroutine); its frames' ``f_back`` is None. A task that is running right now (it
    does synchronous work between two awaits) is on its loop thread's stack: then the
    thread's frames from the innermost up to the task's outermost coroutine frame are
    the task's stack; the loop's own frames above it are not the request's.
    """
    chain: list[FrameType] = []  # outermost first
    obj = coro
    while obj is not None and len(chain) < 4096:
        f = _frame_of(obj)
        if f is None:
            break
        chain.append(f)
        obj = _awaited(obj)
    if not chain:
        return []
    if getattr(coro, "cr_running", False) or getattr(coro, "gi_running", False):
        frame = sys._current_frames().get(thread_ident)
        if frame is not None:
            frames = _up_from(frame, stop_at=chain[0])
            if frames[-1] is chain[0]:
                return _signatures(frames, depth)
    chain.reverse()
    return _signatures(chain, depth)


def greenlet_stack(glet: Any, depth: int) -> list[str]:
    """A suspended greenlet's stack (``gr_frame``); [] while it runs or once it is dead."""
    frame = getattr(glet, "gr_frame", None)
    return _signatures(_up_from(frame), depth) if frame is not None else []
