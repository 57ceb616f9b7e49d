"""Which requests are not traced: Ant-style path patterns, suffixes, HTTP methods.

Ant patterns (as ``SW_AGENT_TRACE_IGNORE_PATH`` in the SkyWalking agents): ``?`` is one
character other than ``/``, ``*`` is any run of characters within one path segment, ``**``
is any number of whole segments (``/static/**`` matches ``/static``, ``/static/a`` and
``/static/a/b``). Two cases differ from the Python peer agent's matcher, on purpose: a
trailing ``/**`` also matches the directory itself (``/static``), and a path ending in ``/``
(``/static/a/``) matches as its segments do. All patterns are compiled into one regular
expression, so a check is one match call whatever the number of patterns, and none at all
when there are no patterns.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def ant_to_regex(pattern: str) -> str:
    """Translate one Ant-style path pattern to a regular expression (anchored by the caller)."""
    out = []
    i = 0
    n = len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("/**", i) and (i + 3 == n or pattern[i + 3] == "/"):
            # "/**" at the end: the directory itself or anything below it; "/**/" in the
            # middle: zero or more whole segments.
            out.append("(?:/.*)?" if i + 3 == n else "(?:/[^/]+)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


class IgnoreRules:
    __slots__ = ("_cache", "_methods", "_path_match", "_suffixes")

    def __init__(
        self,
        paths: Iterable[str] = (),
        suffixes: Iterable[str] = (),
        methods: Iterable[str] = (),
    ) -> None:
        pats = [p.strip() for p in paths if p.strip()]
        self._path_match = (
            re.compile("(?:" + "|".join(f"(?:{ant_to_regex(p)})" for p in pats) + r")\Z").match
            if pats
            else None
        )
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
        return m is not None and m(op) is not None

    def ignore_method(self, method: str) -> bool:
        return bool(self._methods) and method.upper() in self._methods


rules = IgnoreRules()
