"""Text that is not valid UTF-8, made sendable instead of losing the record that holds it.

Python text can hold lone surrogates: bytes that are not UTF-8, decoded with
``surrogateescape`` (file names, ``sys.argv``, ``os.environ``). orjson refuses them, and the
record (a segment with all its spans, a log) would be lost. The encoders retry, only after
orjson refused, with such characters backslash-escaped: ``"\\udcff"`` becomes the six
characters ``\\udcff``. The log reporter (``write_log``), the segment (``Segment.emit``,
also the native core's fallback) and the profile sampler (a snapshot's frames) all encode
with :func:`dumps_escaping`.
"""

from __future__ import annotations

from typing import Any

import orjson


def escaped(text: str) -> str:
    """``text`` with its lone surrogates backslash-escaped (other text unchanged)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def escaped_record(value: Any) -> Any:
    """``value`` with every text in it (nested lists, tuples and dicts too) :func:`escaped`."""
    if isinstance(value, str):
        return escaped(value)
    if isinstance(value, (list, tuple)):
        return [escaped_record(v) for v in value]
    if isinstance(value, dict):
        return {escaped_record(k): escaped_record(v) for k, v in value.items()}
    return value


def dumps_escaping(value: Any) -> bytes:
    """``orjson.dumps(value)``; where orjson refuses it (``TypeError``), ``value`` with its
    text :func:`escaped`. The normal path costs nothing more than the plain call."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return orjson.dumps(escaped_record(value))
