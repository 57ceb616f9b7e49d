"""Which requests are not traced: Ant-style path patterns, suffixes, HTTP methods.

Ant patterns (as ``SW_AGENT_TRACE_IGNORE_PATH`` in the SkyWalking agents; ``swmp.tracing.ant``
says what they mean). Two cases differ from the Python peer agent's matcher, on purpose: a
trailing ``/**`` also matches the directory itself (``/static``), and a path ending in ``/``
(``/static/a/``) matches as its segments do. The patterns are compiled into one regular
expression, so a check is one match call whatever the number of patterns, and none at all
when there are no patterns; a pattern that regular expression would match in time
polynomial in the path (several stars in one segment, several ``/**/``) is matched by a
linear matcher of its own instead (``ant.AntMatcher``): a client chooses the path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from swmp.tracing.ant import AntMatcher, ant_to_regex, backtracks

__all__ = ["IgnoreRules", "ant_to_regex", "rules"]


class IgnoreRules:
    __slots__ = ("_cache", "_methods", "_path_match", "_slow_shapes", "_suffixes")

    def __init__(
        self,
        paths: Iterable[str] = (),
        suffixes: Iterable[str] = (),
        methods: Iterable[str] = (),
    ) -> None:
        pats = [p.strip() for p in paths if p.strip()]
        slow = [p for p in pats if backtracks(p)]
        plain = [p for p in pats if p not in slow]  # linear as one regular expression
        self._path_match = (
            re.compile("(?:" + "|".join(f"(?:{ant_to_regex(p)})" for p in plain) + r")\Z", re.DOTALL).match
            if plain
            else None
        )
        self._slow_shapes: tuple[Callable[[str], bool], ...] = tuple(AntMatcher(p) for p in slow)
        self._suffixes = tuple(s.strip() for s in suffixes if s.strip())
        self._methods = frozenset(m.strip().upper() for m in methods if m.strip())
        # Decisions per operation name: a service has a bounded set of endpoints, so one dict
        # lookup replaces the suffix and pattern checks (cleared when full, never stale).
        self._cache: dict[str, bool] = {}

    def ignore_operation(self, op: str) -> bool:
        """True when a trace whose first span is named ``op`` must not be recorded."""
        cache = self._cache
        decision = cache.get(op)
        if decision is None:
            decision = self._decide(op)
            if len(cache) >= 4096:
                cache.clear()
            cache[op] = decision
        return decision

    def _decide(self, op: str) -> bool:
        if self._suffixes and op.endswith(self._suffixes):
            return True
        m = self._path_match
        if m is not None and m(op) is not None:
            return True
        return any(match(op) for match in self._slow_shapes)

    def ignore_method(self, method: str) -> bool:
        return bool(self._methods) and method.upper() in self._methods


rules = IgnoreRules()
