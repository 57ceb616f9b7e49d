"""Keep secrets out of everything the CLI prints.

The agent already masks the authentication token in the arena header, but the CLI does
not trust that: any key that looks like it holds a credential is replaced, credentials in
URLs are cut out, and ``token=...``-style fragments inside free text (error messages) are
blanked. Masking is applied once, where documents are parsed, so no renderer can forget it.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "****"

_SECRET_KEY = re.compile(
    r"auth|token|secret|passw|credential|api[_-]?key|private[_-]?key|sasl|bearer|cookie", re.IGNORECASE
)
# scheme://user:password@host -> scheme://user:****@host
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):[^@/\s]+@")
# authentication=abc, token: abc, "password": "abc", Bearer abc
_INLINE = re.compile(
    r"(?P<key>(?:authentication|authorization|token|secret|passw(?:or)?d|api[_-]?key)"
    r"[\"']?\s*[:=]\s*[\"']?)(?P<value>[^\s,;\"'}&]+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?P<key>\bbearer\s+)(?P<value>[A-Za-z0-9._~+/=-]+)", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def scrub_text(text: str) -> str:
    """Blank credentials embedded in free text (URLs, ``key=value``, bearer tokens)."""
    text = _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    text = _INLINE.sub(lambda m: m["key"] + MASK, text)
    return _BEARER.sub(lambda m: m["key"] + MASK, text)


def mask(value: Any, key: str = "") -> Any:
    """A copy of ``value`` (parsed JSON) with every secret-looking field masked."""
    if isinstance(value, dict):
        return {str(k): mask(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v, key) for v in value]
    if key and is_secret_key(key):
        if value in (None, "", False, 0):
            return "" if value in (None, "") else value
        return MASK
    if isinstance(value, str):
        return scrub_text(value)
    return value
