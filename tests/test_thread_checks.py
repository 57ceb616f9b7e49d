"""The thread instrumentation's two "nothing to do" checks, native and Python, agree.

``Thread.start`` and ``ThreadPoolExecutor.submit`` are gates whose ``passes`` predicate is
``thread_skipped`` / ``runs_in_own_context`` from the native core (swmp/_native/threads.c)
when it is built, the Python forms in swmp/instrument/threads.py otherwise. A native check
that raises counts as "passes" (the gate leaves the call untraced), as the Python forms
answer where their own code raises.
"""

from __future__ import annotations

import contextvars
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from swmp.instrument import threads
from swmp.tracing.span import NATIVE, native_core

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")


def _native(check: Callable[..., Any], *args: Any) -> bool:
    try:
        return bool(check(*args))
    except Exception:
        return True


def _function_in(module: Any) -> Callable[[], None]:
    def work() -> None:
        pass

    work.__module__ = module
    return work


class _Text(str):
    pass


class _RaisingModule:
    def __init__(self, error: type[Exception]) -> None:
        self.error = error

    @property
    def __module__(self) -> Any:  # type: ignore[override]
        raise self.error("no module")

    def __call__(self) -> None:
        pass


def _threads() -> Iterator[threading.Thread]:
    for module in (
        "concurrent.futures.thread",
        "concurrent.futures",
        "concurrent.futuresque",
        "multiprocessing",
        "multiprocessing.pool",
        "asgiref.sync",
        "grpc._channel",
        "grpc",
        "swmp.reporter",
        "reporter_proc.main",
        "ipc.ring",
        "myapp.jobs",
        "",
        None,
        5,
        _Text("asgiref.local"),
        _Text("myapp"),
        "é.grpc.",
    ):
        yield threading.Thread(target=_function_in(module))
    yield threading.Thread(target=_RaisingModule(AttributeError))  # getattr(..., None): None
    yield threading.Thread(target=_RaisingModule(RuntimeError))  # raises: passes
    yield threading.Thread()  # no target: Thread.run, module "threading"

    class Worker(threading.Thread):
        def run(self) -> None:
            pass

    yield Worker()
    Worker.run.__module__ = "concurrent.futures.process"
    yield Worker()

    class NoTarget(threading.Thread):
        def __init__(self) -> None:
            super().__init__()
            del self._target  # type: ignore[attr-defined]

    yield NoTarget()


def test_thread_skipped_matches_the_python_check() -> None:
    answers = []
    for _ in range(2):  # the second time from the native check's cache of module names
        for thread in _threads():
            native = _native(native_core.thread_skipped, thread)
            python = _native(threads._skipped, thread)  # a raise is "passes" for both gates
            assert native == python, (thread, getattr(thread, "_target", None))
            answers.append(native)
    assert True in answers and False in answers


class _Owner:
    def work(self) -> None:
        pass


class _RaisingSelf:
    @property
    def __self__(self) -> Any:
        raise RuntimeError("no self")

    def __call__(self) -> None:
        pass


class _Partial(functools.partial):  # type: ignore[type-arg]
    pass


def test_runs_in_own_context_matches_the_python_check() -> None:
    context = contextvars.copy_context()
    threads._COPYING_OWNERS.add(_Owner)  # the set the native check reads: as asgiref's class is added
    try:
        items: list[Any] = [
            functools.partial(context.run, print),  # asyncio.to_thread
            context.run,  # grpc's server
            functools.partial(_Owner().work, 1),
            functools.partial(print, 1),
            functools.partial(len),
            functools.partial(_function_in("myapp")),
            functools.partial(_RaisingSelf()),
            _Partial(context.run, print),
            print,
            len,
            lambda: None,
            _Owner().work,
            None,
        ]
        answers = []
        for fn in items:
            native = _native(native_core.runs_in_own_context, object(), fn)
            assert native == _native(threads._py_runs_in_own_context, object(), fn), fn
            answers.append(native)
        assert answers[:3] == [True, True, True] and answers[3] is False
    finally:
        threads._COPYING_OWNERS.discard(_Owner)
    assert _native(native_core.runs_in_own_context, object(), functools.partial(_Owner().work)) is False
    assert native_core.runs_in_own_context(object()) is True  # no work item: the original refuses it
    assert native_core.thread_skipped() is True  # not start(self): the original's to refuse
