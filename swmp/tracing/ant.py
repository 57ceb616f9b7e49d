"""Ant-style path patterns (``SW_AGENT_TRACE_IGNORE_PATH``): translation to a regular
expression, and a matcher for the patterns a regular expression would match too slowly.

``?`` is one character other than ``/``, ``*`` any run of characters within one path
segment, ``**`` any number of whole segments (``/static/**`` matches ``/static``,
``/static/a`` and ``/static/a/b``).

Why two matchers: Python's ``re`` backtracks. A segment with several stars (``*a*a*b``)
becomes ``[^/]*a[^/]*a[^/]*b``, whose failing match on one long segment tries every way to
split it: O(L^k) for k stars. Two or more ``/**/`` do the same over segments. A path is
the client's to choose (servers take request lines of 4-8 KiB), so with such a pattern one
request could cost the worker seconds inside the agent. Patterns of that shape are matched
by :class:`AntMatcher` instead, in time linear in the path for each pattern token: a
segment's pieces between stars are found leftmost first (which is exact for ``*``), and
``**`` is a table over (pattern token, path segment), not a search. Every other pattern
stays in the one combined regular expression, which is linear for them and one C call.
"""

from __future__ import annotations

import re

_STARS = re.compile(r"\*+")


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


def backtracks(pattern: str) -> bool:
    """Would the regular expression of ``pattern`` backtrack over a path's length: a segment
    with two or more runs of stars, or ``**`` as a whole segment more than once after the
    first segment. Patterns with ``**`` inside a segment or as the first one (``.*``, which
    crosses segments) are not handled by :class:`AntMatcher` and answer False."""
    tokens = pattern.split("/")
    if "**" in tokens[:1] or any("**" in t and t != "**" for t in tokens):
        return False
    many_stars = any(len(_STARS.findall(t)) > 1 for t in tokens if t != "**")
    return many_stars or tokens.count("**") > 1


class _Segment:
    """One pattern token without ``**``: fixed pieces between runs of stars, ``?`` in them."""

    __slots__ = ("_first", "_last", "_len_first", "_len_last", "_middle", "_starred")

    def __init__(self, token: str) -> None:
        pieces = _STARS.split(token)
        self._starred = len(pieces) > 1
        self._first, self._len_first = _piece(pieces[0]), len(pieces[0])
        self._last, self._len_last = _piece(pieces[-1]), len(pieces[-1])
        self._middle = [_piece(p) for p in pieces[1:-1] if p]

    def match(self, seg: str) -> bool:
        if not self._starred:
            return self._first.fullmatch(seg) is not None
        end = len(seg) - self._len_last  # where the last piece must start
        if end < self._len_first or not self._first.match(seg) or not self._last.fullmatch(seg, end):
            return False
        pos = self._len_first
        for piece in self._middle:  # each as far left as it goes: exact for "*"
            m = piece.search(seg, pos, end)
            if m is None:
                return False
            pos = m.end()
        return True


def _piece(text: str) -> re.Pattern[str]:
    """A fixed-length piece: its characters, ``?`` for any one (segments hold no "/")."""
    return re.compile("".join("(?s:.)" if c == "?" else re.escape(c) for c in text))


class AntMatcher:
    """Matches one pattern (one that :func:`backtracks`) as its regular expression would."""

    __slots__ = ("_tokens",)

    def __init__(self, pattern: str) -> None:
        self._tokens: list[_Segment | None] = [None if t == "**" else _Segment(t) for t in pattern.split("/")]

    def __call__(self, path: str) -> bool:
        tokens, segs = self._tokens, path.split("/")
        n = len(segs)
        # ok[j]: tokens[i:] match segs[j:] (the boundary before token i at the one before
        # segment j); filled from the last token back, one row per token.
        ok = [False] * n + [True]
        for i in range(len(tokens) - 1, -1, -1):
            token = tokens[i]
            row = [False] * (n + 1)
            if token is None:  # "/**": the first token is never one (see backtracks)
                if i == len(tokens) - 1:
                    row = [True] * (n + 1)  # at the end: nothing, or "/" and anything
                else:  # zero or more whole non-empty segments, then the rest
                    for j in range(n, -1, -1):
                        row[j] = ok[j] or (j < n and segs[j] != "" and row[j + 1])
            else:
                for j in range(n):
                    row[j] = ok[j + 1] and token.match(segs[j])
            ok = row
        return ok[0]
