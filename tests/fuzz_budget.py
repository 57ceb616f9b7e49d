"""How many examples a property test tries: its own number, scaled by ``SWMP_FUZZ_SCALE``.

The normal run tries every test's full number. ``tests/test_native_sanitizers.py`` reruns the
native tests under AddressSanitizer and UndefinedBehaviorSanitizer, where each example costs
several times more (instrumented code, Python's allocator off): there a fraction of the
examples is enough to catch a bad read or write on the shapes the strategies make, and the
full search has already run without the sanitizers in the same suite.
"""

from __future__ import annotations

import os

_FLOOR = 25  # a search too short to be one is no search


def examples(n: int) -> int:
    """``n`` scaled by ``SWMP_FUZZ_SCALE`` (default 1), at least 25 (or ``n`` if smaller)."""
    try:
        scale = float(os.environ.get("SWMP_FUZZ_SCALE", "1"))
    except ValueError:
        scale = 1.0
    if not scale > 0:
        scale = 1.0
    return max(min(n, _FLOOR), round(n * scale))
