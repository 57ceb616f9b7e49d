"""Spans over a driver's work that starts after the call made for it returns: a generator
of rows (psycopg's ``stream``) or a context manager (psycopg's ``copy``). The span is opened
where the driver starts its work, at the first row asked for or when the block is entered,
not when the object is made: an object the application drops unused records nothing, and
leaves no span open (an open span holds its whole trace segment back from the reporter; a
generator never started runs no ``finally`` when collected).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from swmp.tracing.span import NoopSpan, Span

Start = Callable[[], Span | NoopSpan]  # opens the span; never raises (see _datastore.failed)


class SpanAround:
    """Wraps a driver's context manager (sync or async) so that the span ``start`` opens
    covers its block from its entry, without making the span current: the application's code
    inside the block (a COPY feeding loop) keeps its own span as parent. The driver's object
    is what ``with`` yields; exceptions, and the driver's choice to suppress one, pass
    through unchanged."""

    __slots__ = ("_cm", "_span", "_start")

    def __init__(self, cm: Any, start: Start) -> None:
        self._cm = cm
        self._start = start
        self._span: Span | NoopSpan | None = None

    def _done(self, ev: BaseException | None) -> None:
        span, self._span = self._span, None
        if span is None:  # an exit without an entry: nothing was opened
            return
        if ev is not None and not isinstance(ev, GeneratorExit):
            span.error(ev)
        span.finish()

    def __enter__(self) -> Any:
        self._span = self._start()
        try:
            return self._cm.__enter__()
        except BaseException as e:
            self._done(e)
            raise

    def __exit__(self, et: Any, ev: Any, tb: Any) -> Any:
        try:
            suppressed = self._cm.__exit__(et, ev, tb)
        except BaseException as e:
            self._done(e)
            raise
        self._done(None if suppressed else ev)
        return suppressed

    async def __aenter__(self) -> Any:
        self._span = self._start()
        try:
            return await self._cm.__aenter__()
        except BaseException as e:
            self._done(e)
            raise

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> Any:
        try:
            suppressed = await self._cm.__aexit__(et, ev, tb)
        except BaseException as e:
            self._done(e)
            raise
        self._done(None if suppressed else ev)
        return suppressed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cm, name)


def span_over_iterator(start: Start, it: Iterator[Any]) -> Iterator[Any]:
    """Yield from ``it`` inside the span ``start`` opens at the first row asked for, open
    until ``it`` is exhausted, fails or is closed (the span is not made current: the
    consumer's loop body keeps its own parent)."""
    span = start()
    try:
        yield from it
    except GeneratorExit:
        raise
    except BaseException as e:
        span.error(e)
        raise
    finally:
        span.finish()


async def span_over_async_iterator(start: Start, it: Any) -> AsyncIterator[Any]:
    """The async form of :func:`span_over_iterator`; closing it closes ``it`` too, as
    ``yield from`` does for the sync form (the driver's clean-up runs)."""
    span = start()
    try:
        async for item in it:
            yield item
    except GeneratorExit:
        aclose = getattr(it, "aclose", None)
        if aclose is not None:
            await aclose()
        raise
    except BaseException as e:
        span.error(e)
        raise
    finally:
        span.finish()
