"""The exit span of one cache command (Redis, memcached): what redis-py's and pymemcache's
instrumentations share, beside the settings and helpers of :mod:`swmp.instrument._datastore`.

:func:`cache_span` opens the span (layer Cache) tagged ``cache.type`` / ``cache.cmd`` /
``cache.op`` / ``cache.key`` (and ``db.instance``); :func:`traced_command` is what a gate calls
for a command while a span is current: with the native core, ``swmp._spancore.CacheCall``
(swmp/_native/cache.c), which runs the common case of a command without a Python frame.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swmp.instrument._cache_commands import cache_head, cache_op
from swmp.instrument._datastore import settings, text
from swmp.instrument._gate import named_like
from swmp.tracing import context as _ctx
from swmp.tracing.constants import (
    TAG_CACHE_CMD,
    TAG_CACHE_KEY,
    TAG_CACHE_OP,
    TAG_CACHE_TYPE,
    TAG_DB_INSTANCE,
    Layer,
)
from swmp.tracing.limits import limits
from swmp.tracing.span import NO_TAGS, NoopSpan, Span, native_core

_CACHE = Layer.CACHE
_new_exit = _ctx.new_exit_span  # native when the span core is built: no frame of its own


def cache_span(  # noqa: PLR0917
    op: str,
    address: str,
    component: int,
    cache_type: str,
    cmd: str,
    key: Any,
    instance: str = "",
    kind: str | None = None,
    head: tuple[str, ...] | None = None,
) -> Span | NoopSpan:
    """An exit span for one cache call (or one pipeline: ``cmd`` lists its commands), tagged
    ``cache.type``/``cache.cmd``/``cache.op``/``cache.key`` (and ``db.instance`` if given).
    ``head``: ``cache_head(cache_type, cmd)`` when the caller keeps it (one lookup less)."""
    span = _new_exit(op, address, component, _CACHE)
    if span.__class__ is not Span:
        return span
    if key is not None and settings.collect_keys:
        if key.__class__ is not str:
            key = text(key)
    else:
        key = None
    lim = limits.tag_value_max
    if (
        kind is None
        and span.tags is NO_TAGS
        and len(cmd) <= lim
        and (key is None or len(key) <= lim)
        and len(instance) <= lim
    ):
        # The common case in one list (what the span.tag calls below would build): this
        # runs on every traced command.
        if head is None:
            head = cache_head(cache_type, cmd)
        if key is None:
            span.tags = [*head, TAG_DB_INSTANCE, instance] if instance else list(head)
        elif instance:
            span.tags = [*head, TAG_CACHE_KEY, key, TAG_DB_INSTANCE, instance]
        else:
            span.tags = [*head, TAG_CACHE_KEY, key]
        return span
    k = cache_op(cmd) if kind is None else kind
    span.tag(TAG_CACHE_TYPE, cache_type)
    span.tag(TAG_CACHE_CMD, cmd)
    if k:
        span.tag(TAG_CACHE_OP, k)
    if key is not None:
        span.tag(TAG_CACHE_KEY, key)
    if instance:
        span.tag(TAG_DB_INSTANCE, instance)
    return span


_CacheCall: Any = getattr(native_core, "CacheCall", None)
if _CacheCall is not None:
    native_core.setup_cache(Span, NO_TAGS, limits, settings, _CACHE, TAG_CACHE_KEY, TAG_DB_INSTANCE)


def traced_command(  # noqa: PLR0917
    orig: Callable[..., Any],
    traced: Callable[..., Any],
    component: int,
    cache_type: str,
    info: dict[Any, tuple[str, str, tuple[str, ...]]] | tuple[str, str, tuple[str, ...]],
    holder_attr: str,
    addresses: dict[Any, str] | None,
    key_index: int,
    key_required: bool,
    *,
    awaiting: bool = False,
) -> Callable[..., Any]:
    """What a gate calls while a span is current for one cache command: with the native
    core, ``swmp._spancore.CacheCall`` (swmp/_native/cache.c), which runs the usual call in
    its exit span (:func:`cache_span`'s common case) without a Python frame and hands every
    other to ``traced``, the Python form; else ``traced`` itself.

    ``info``: the command's ``(operation, cache.cmd, cache_head(...))``, or a dict of them by
    the call's first argument after ``self`` (the command name). The peer and
    ``db.instance``: the pair ``traced`` keeps as :data:`WHERE` on ``getattr(self,
    holder_attr)``, or with ``addresses`` ``(addresses[getattr(self, holder_attr)], "")``.
    The key: positional argument ``key_index`` (``self`` is 0), which ``key_required`` says
    must be there. ``awaiting``: an async client's method (``traced`` an ``async def``),
    whose span opens when the call is awaited."""
    named_like(traced, orig)  # its binding errors name the client's method (see there)
    if _CacheCall is None:
        return traced
    return _CacheCall(  # type: ignore[no-any-return]
        orig, traced, component, cache_type, info, holder_attr, addresses, key_index, key_required, awaiting
    )
