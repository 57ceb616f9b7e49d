"""Type stub of the optional C encoder (reporter_proc/_encode_native.c)."""

from collections.abc import Sequence
from typing import Any

SHORT_VALUE: int

def segment(rec: Sequence[Any], /) -> bytes: ...
def log(rec: Sequence[Any], /) -> bytes: ...
def segment_collection(segments: Sequence[bytes], /) -> bytes: ...
