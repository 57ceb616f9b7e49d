"""Human-readable figures for the CLI's text output (durations, sizes, counts, widths).

Everything here is pure and total: the CLI prints whatever a half-written or foreign status
document contains, so no helper may raise on odd input.
"""

from __future__ import annotations

import math
import re

WIDTH = 80  # the text output is checked to fit a classic terminal
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# what a terminal acts on rather than shows: C0, DEL, C1, and the Unicode line separators and
# bidirectional overrides (text that reorders what follows it on the line)
_TERMINAL_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: object) -> str:
    """``text`` with every character a terminal would act on shown as an escape (``\\x1b``).

    For what others control (a service name, a tag, a server's answer) printed to a terminal:
    an ESC, CR or BEL in it must not move the cursor, retitle the window or hide what
    precedes it."""
    return _TERMINAL_UNSAFE.sub(_escape, str(text))


def duration(seconds: float | None) -> str:
    """``0.3s``, ``42s``, ``5m07s``, ``3h02m``, ``4d05h``; ``-`` for unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def ago(seconds: float | None, never: str = "never") -> str:
    return never if seconds is None else f"{duration(seconds)} ago"


def size(n: int | float | None) -> str:
    """Bytes with binary units: ``512 B``, ``3.0 KiB``, ``256 MiB``."""
    if n is None or not isinstance(n, (int, float)) or n < 0:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
        value /= 1024
    return f"{value:.0f} TiB"  # pragma: no cover - the loop returns at GiB


def count(n: int | None) -> str:
    """Integers with thousands separators; compact above a billion so columns hold."""
    if n is None:
        return "-"
    if abs(n) >= 10**10:
        return f"{n / 1e9:.1f}G"
    return f"{n:,}"


def rate(per_s: float | None) -> str:
    if per_s is None or not math.isfinite(per_s):
        return "-"
    if per_s >= 100_000:
        return f"{per_s / 1000:.0f}k"
    if per_s >= 100:
        return f"{per_s:.0f}"
    return f"{per_s:.1f}"


def percent(ratio: float | None) -> str:
    if ratio is None or not math.isfinite(ratio):
        return "-"
    pct = ratio * 100
    if pct == 0:
        return "0%"
    if pct < 0.1:
        return "<0.1%"
    return f"{pct:.1f}%" if pct < 10 else f"{pct:.0f}%"


def clip(text: str, width: int) -> str:
    """Cut ``text`` to ``width`` columns, marking the cut with ``...``."""
    # Newlines, tabs and other control characters (a backend error message may carry
    # anything) must not break the layout; spaces are kept, they align the columns.
    text = _CONTROL.sub(" ", str(text))
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    if width <= 3:
        return text[:width]
    return text[: width - 3] + "..."


def line(text: str, width: int = WIDTH) -> str:
    return clip(text, width)
