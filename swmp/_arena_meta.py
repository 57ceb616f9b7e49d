"""The arena header's JSON for tools (``swmp status``, ``swmp health``): who the agent is.

The header has room for :data:`ipc._layout.META_MAX` bytes. The texts come from the user's
settings (service, namespace, instance name, backend list), which have no length limit of
their own, so a long one must not keep the agent from starting: the header is for tools, and
when the whole does not fit, its texts are clipped (and the backend list shortened) until it
does, and that is logged once.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from ipc._layout import META_MAX
from swmp.config import Config

log = logging.getLogger("swmp.agent")

# Room for every field at this length and a handful of backends; far above any real name.
_CLIP = 256
_warned = False


def _clip(text: str) -> str:
    return text if len(text) <= _CLIP else text[: _CLIP - 1] + "\u2026"


def arena_meta(config: Config, owner_pid: int, base: str, mode: str, registry: str = "") -> bytes:
    """The JSON. ``registry``: thread mode's name registry (its file name, in the same
    directory), whose header counts what no process's ring took."""
    extra = {"registry": registry} if registry else {}
    doc: dict[str, Any] = {
        "service": config.service_name,
        "namespace": config.agent_namespace,
        "instance": base,
        "protocol": config.agent_protocol,
        "backends": list(config.backends),
        "authentication": "****" if config.agent_authentication else "",
        "mode": mode,
        "pid": owner_pid,
        **extra,
    }
    data = orjson.dumps(doc)
    if len(data) <= META_MAX:
        return data
    for key in ("service", "namespace", "instance"):
        doc[key] = _clip(doc[key])
    backends = [_clip(b) for b in doc["backends"]]
    doc["backends"] = backends
    data = orjson.dumps(doc)
    while len(data) > META_MAX and backends:  # (each clipped: a few dozen still fit)
        backends.pop()
        data = orjson.dumps(doc)
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "swmp: the service, instance or backend names are too long for the arena header "
            "(%d bytes fit); `swmp status` shows them clipped",
            META_MAX,
        )
    return data
