"""``within(span, awaitable)`` (swmp/_native/within.c) behaves as the coroutine it replaces::

    async def run():
        with span:
            return await awaitable

in every way a request can end: each scenario is run with both and the span's calls, the
result and the awaited object's own steps are compared."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import types
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import pytest

from swmp.tracing.span import NATIVE, native_core

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")

where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="outside")


class Recorder:
    """A span that records its enter (with the context it ran in) and exit."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __enter__(self) -> Recorder:
        self.calls.append(("enter", where.get()))
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        self.calls.append(("exit", "None" if kind is None else kind.__name__))
        assert (kind is None) == (value is None) and (value is None or isinstance(value, kind))


async def python_within(span: Any, awaitable: Awaitable[Any]) -> Any:
    with span:
        return await awaitable


FORMS: dict[str, Callable[[Any, Any], Any]] = {"python": python_within}
if NATIVE:
    FORMS["native"] = native_core.within


@types.coroutine
def _suspend() -> Generator[None, Any, Any]:
    return (yield None)


def _run_both(scenario: Callable[[Callable[[Any, Any], Any], Recorder, list[str]], Any]) -> None:
    outcomes = {}
    for name, within in FORMS.items():
        span, steps = Recorder(), []
        try:
            result: Any = ("returned", scenario(within, span, steps))
        except BaseException as e:
            result = ("raised", type(e).__name__, str(e))
        outcomes[name] = (result, span.calls, steps)
    assert outcomes["native"] == outcomes["python"]


async def _inner(steps: list[str], suspensions: int, outcome: Any) -> Any:
    try:
        for _ in range(suspensions):
            await asyncio.sleep(0)
            steps.append("resumed")
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
    finally:
        steps.append("finally")


@pytest.mark.parametrize(
    ("suspensions", "outcome"),
    [(3, "value"), (0, "at once"), (1, ValueError("bad")), (2, (1, 2)), (1, None), (0, KeyError("k"))],
)
def test_returns_and_raises_like_the_coroutine(suspensions: int, outcome: Any) -> None:
    def scenario(within: Any, span: Recorder, steps: list[str]) -> Any:
        async def main() -> Any:
            where.set("task")
            return await within(span, _inner(steps, suspensions, outcome))

        return asyncio.run(main())

    _run_both(scenario)


def test_entered_in_the_awaiting_task_made_elsewhere() -> None:
    def scenario(within: Any, span: Recorder, steps: list[str]) -> Any:
        async def main() -> Any:
            awaitable = within(span, _inner(steps, 1, "v"))  # made here, awaited in a task

            async def task() -> Any:
                where.set("the task")
                return await awaitable

            return await asyncio.create_task(task())

        return asyncio.run(main())

    _run_both(scenario)


@pytest.mark.parametrize("caught", [False, True])
def test_cancelled_while_waiting(caught: bool) -> None:
    def scenario(within: Any, span: Recorder, steps: list[str]) -> Any:
        async def inner() -> str:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                steps.append("cancelled")
                if caught:
                    return "handled"
                raise
            return "slept"

        async def main() -> Any:
            task = asyncio.ensure_future(_await(within(span, inner())))
            await asyncio.sleep(0)
            task.cancel()
            return await task

        return asyncio.run(main())

    _run_both(scenario)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def test_driven_by_hand_send_throw_close() -> None:
    def scenario(within: Any, span: Recorder, steps: list[str]) -> Any:
        async def inner() -> Any:
            try:
                got = await _suspend()
                steps.append(f"got {got}")
                try:
                    await _suspend()
                except LookupError as e:
                    steps.append(f"caught {e}")
                await _suspend()
            finally:
                steps.append("finally")
            return "end"

        coro = within(span, inner()).__await__()
        out = [coro.send(None), coro.send("x"), coro.throw(LookupError("thrown"))]
        coro.close()
        steps.append(f"closed {out}")
        try:
            coro.send(None)
        except BaseException as e:
            steps.append(f"after close: {type(e).__name__}")
        return None

    _run_both(scenario)


def test_throw_ends_it_and_a_return_through_throw() -> None:
    def scenario(within: Any, span: Recorder, steps: list[str]) -> Any:
        async def inner() -> Any:
            try:
                await _suspend()
            except ValueError:
                return "returned from throw"
            return "no"

        coro = within(span, inner()).__await__()
        coro.send(None)
        try:
            coro.throw(ValueError("v"))
        except StopIteration as e:
            steps.append(f"stop {e.value}")
        coro2 = within(span, _inner(steps, 1, "x")).__await__()
        coro2.send(None)
        coro2.throw(TypeError("t"))  # not handled: raised, the span exits with it
        return None

    _run_both(scenario)


def test_a_first_send_of_a_value_is_refused_before_anything_starts() -> None:
    def scenario(within: Any, span: Recorder, steps: list[str]) -> Any:
        coro = within(span, _inner(steps, 0, "done")).__await__()
        try:
            coro.send("a value")
        except TypeError as e:  # refused: the span is not entered, and the call can still start
            steps.append(f"refused: {e}")
        try:
            coro.send(None)
        except StopIteration as e:
            steps.append(f"then returned {e.value}")
        return None

    _run_both(scenario)


@pytest.mark.filterwarnings("ignore:coroutine '_inner' was never awaited")  # the Python form's
def test_not_started_thrown_closed_awaited_twice_and_collected() -> None:
    def scenario(within: Any, span: Recorder, steps: list[str]) -> Any:
        never = within(span, _inner(steps, 1, "x")).__await__()
        try:
            never.throw(RuntimeError("before start"))
        except RuntimeError as e:
            steps.append(f"thrown before start: {e}")
        closed = within(span, _inner(steps, 1, "x"))
        closed.__await__().close()
        twice = within(span, _inner(steps, 0, "once"))

        async def main() -> Any:
            first = await twice
            try:
                await twice
            except RuntimeError as e:
                steps.append(str(e))
            return first

        steps.append(asyncio.run(main()))
        running = within(span, _inner(steps, 2, "x")).__await__()
        running.send(None)
        del running
        gc.collect()
        steps.append("collected")
        return None

    _run_both(scenario)


def test_a_future_and_an_awaitable_object() -> None:
    class Ready:
        def __await__(self) -> Generator[Any, Any, str]:
            yield None
            return "ready"

    def scenario(within: Any, span: Recorder, steps: list[str]) -> Any:
        async def main() -> Any:
            fut = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(fut.set_result, "from a future")
            return [await within(span, fut), await within(span, Ready())]

        return asyncio.run(main())

    _run_both(scenario)
    with pytest.raises(TypeError):
        native_core.within(Recorder(), 5)


def test_a_real_span_is_current_inside_and_finished_after() -> None:
    from swmp import _sink, tracing
    from swmp.config import load
    from swmp.tracing import Component, Layer
    from swmp.tracing.context import new_entry_span
    from swmp.tracing.span import current_span

    _sink.set_sink(_sink.MemorySink())
    tracing.configure(load({}))
    try:

        async def main() -> Any:
            span = new_entry_span("/w", None, Component.PYTHON, Layer.HTTP)

            async def inner() -> Any:
                await asyncio.sleep(0)
                return current_span.get() is span

            inside = await native_core.within(span, inner())
            return inside, current_span.get(), span.end > 0

        assert asyncio.run(main()) == (True, None, True)
    finally:
        _sink.set_sink(None)


class Suppressing(Recorder):
    """A context manager that swallows what it exits with (a span never does)."""

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:  # type: ignore[override]
        super().__exit__(kind, value, tb)
        return True


class FailingExit(Recorder):
    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        super().__exit__(kind, value, tb)
        raise LookupError("exit failed")


@pytest.mark.parametrize("manager", [Suppressing, FailingExit])
def test_an_exit_that_suppresses_or_fails(manager: type[Recorder]) -> None:
    outcomes = {}
    for name, within in FORMS.items():
        steps: list[str] = []
        results = []
        for outcome in ("value", ValueError("inner")):
            span = manager()

            async def main(
                span: Recorder = span, outcome: Any = outcome, within: Any = within, steps: list[str] = steps
            ) -> Any:
                return await within(span, _inner(steps, 1, outcome))

            try:
                results.append(("returned", asyncio.run(main())))
            except BaseException as e:
                results.append(("raised", type(e).__name__, str(e)))
            results.append(span.calls)
        span = manager()
        running = within(span, _inner(steps, 2, "x")).__await__()
        running.send(None)
        try:
            running.close()
            results.append("closed")
        except BaseException as e:
            results.append(("close raised", type(e).__name__))
        results.append(span.calls)
        outcomes[name] = (results, steps)
    assert outcomes["native"] == outcomes["python"]


def test_throw_into_an_awaited_iterator_without_throw() -> None:
    """An awaitable whose ``__await__`` gives a plain iterator (no ``throw``): a coroutine
    raises the thrown exception at its ``await``, so the ``with`` sees it and the span ends
    with it; a throw of something not an exception is refused and changes nothing."""

    class Plain:
        def __await__(self) -> Any:
            return iter([None, None])

    def scenario(within: Any, span: Recorder, steps: list[str]) -> Any:
        coro = within(span, Plain()).__await__()
        coro.send(None)
        try:
            coro.throw(42)  # type: ignore[arg-type]
        except TypeError:
            steps.append("refused")
        coro.throw(ValueError("v"))
        return None

    _run_both(scenario)
