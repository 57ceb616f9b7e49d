"""Ant-style ignore patterns whose regular expression would backtrack (``swmp.tracing.ant``).

``SW_AGENT_TRACE_IGNORE_PATH`` patterns are matched against the path a client sent. Patterns
with several stars in one segment, or several ``/**/``, made ``re`` try every way to split
a long path: seconds to hours of a worker's CPU for one request (``/a/*a*a*b`` against a
segment of 400 characters took 10 ms, and it grows with the cube of the length). Those
patterns now go to a linear matcher, which must answer exactly as the regular expression
does; the other patterns stay in the one regular expression.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from swmp.tracing.ant import AntMatcher, ant_to_regex, backtracks
from swmp.tracing.ignore import IgnoreRules

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("pattern", "slow"),
    [
        ("/health", False),
        ("/static/**", False),
        ("/api/*/items/*", False),
        ("/api/**/ping", False),
        ("/v?/x", False),
        ("/static/*.*", True),  # two runs of stars in one segment
        ("/a/*a*a*b", True),
        ("/**/x/**/y", True),  # two "/**/"
        ("/a/**.js", False),  # "**" inside a segment crosses "/": left to the regex
        ("**/a*b*c", False),  # "**" first: the same
    ],
)
def test_which_patterns_are_matched_apart(pattern: str, slow: bool) -> None:
    assert backtracks(pattern) is slow


def test_the_linear_matcher_answers_as_the_regular_expression_does() -> None:
    rng = random.Random(7)
    atoms = ["/", "a", "b", "ab", "*", "**", "?", "?*", "/**", "/**/"]
    patterns = checked = 0
    while patterns < 3000:
        pattern = "".join(rng.choice(atoms) for _ in range(rng.randrange(1, 8)))
        if not backtracks(pattern):
            continue
        patterns += 1
        regex = re.compile(ant_to_regex(pattern) + r"\Z", re.DOTALL)
        matcher = AntMatcher(pattern)
        for _ in range(20):
            path = "".join(rng.choice(["/", "a", "b", "ab", "\n"]) for _ in range(rng.randrange(0, 10)))
            assert matcher(path) is (regex.match(path) is not None), (pattern, path)
            checked += 1
    assert checked == 60_000


@pytest.mark.parametrize(
    ("pattern", "path", "ignored"),
    [
        ("/static/*.*", "/static/app.min.js", True),
        ("/static/*.*", "/static/app", False),
        ("/static/*.*", "/static/a/b.js", False),
        ("/a/*b*c?", "/a/xbyczq", False),
        ("/a/*b*c?", "/a/xbycz", True),
        ("/**/x/**/y", "/x/y", True),
        ("/**/x/**/y", "/p/x/q/r/y", True),
        ("/**/x/**/y", "/p/x/q/r/y/", False),
        ("/**/x/**/y/**", "/p/x/y/", True),
        ("/static/**", "/static/a\nb", True),  # "**" is any text, a newline too
    ],
)
def test_ignore_rules_with_slow_shapes(pattern: str, path: str, ignored: bool) -> None:
    rules = IgnoreRules(paths=["/health", pattern])
    assert rules.ignore_operation(path) is ignored
    assert rules.ignore_operation("/health")


PATHOLOGICAL = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from swmp.tracing.ignore import IgnoreRules
    rules = IgnoreRules(paths=["/a/*a*a*a*a*a*a*b", "/**/x/**/y/**/z"])
    assert not rules.ignore_operation("/a/" + "a" * 4000)  # 4 KiB, a request line's size
    assert not rules.ignore_operation("/x/y" * 4000)
    assert rules.ignore_operation("/x/y" * 4000 + "/z")
    print("answered")
    """
)


def test_a_long_path_against_slow_shapes_is_answered() -> None:
    """The regular expression took minutes or more for each of these (the cube of the length,
    and the seventh power for the stars); the bound is a failure, never a timing."""
    out = subprocess.run(
        [sys.executable, "-c", PATHOLOGICAL, str(ROOT)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "answered"
