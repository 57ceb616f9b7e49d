"""Loading: environment variables and keyword arguments -> :class:`Config`, never failing.

A value that cannot be parsed or is out of range is reported once on the ``swmp.config``
logger (which variable, what was wrong, what is used instead) and the default is used. A
list of backend addresses with some unusable entries keeps the usable ones (each bad entry is
reported); only a list with none left falls back to the default.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from typing import Any

from swmp.config._declare import ADDRESS_RULE, KIB, MIB, addresses, split_addresses
from swmp.config._model import Config, Setting, settings, split_list

log = logging.getLogger("swmp.config")

_TRUE = frozenset({"true", "1", "yes", "on", "y", "t"})
# No empty string: an empty boolean (Kubernetes `value: ""`) is refused and the default used,
# as an empty number is, rather than silently meaning false.
_FALSE = frozenset({"false", "0", "no", "off", "n", "f"})

_reported: set[tuple[str, str]] = set()


def _report(source: str, raw: object, why: str, fallback: object) -> None:
    """Log a bad value once per (source, value): workers re-load config after fork."""
    key = (source, repr(raw)[:200])
    if key in _reported:
        return
    _reported.add(key)
    log.warning("swmp: %s=%r is invalid (%s); using %r instead", source, raw, why, fallback)


def _parse(type_name: str, raw: Any) -> Any:
    """Convert an environment string or a keyword value to the setting's type; ValueError if not possible."""
    if type_name == "bool":
        if isinstance(raw, bool):
            return raw
        s = str(raw).strip().lower()
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
        raise ValueError("not a boolean (true/false)")
    if type_name == "int":
        if isinstance(raw, bool):
            raise ValueError("not an integer")
        if isinstance(raw, int):
            return raw
        s = str(raw).strip().replace("_", "")
        m = re.fullmatch(r"(\d+)\s*([kKmMgG]i?[bB]?)?", s)
        if m and m.group(2):
            unit = m.group(2)[0].lower()
            return int(m.group(1)) * {"k": KIB, "m": MIB, "g": 1024 * MIB}[unit]
        try:
            return int(s)
        except ValueError:
            raise ValueError("not an integer") from None
    if type_name == "float":
        if isinstance(raw, bool):
            raise ValueError("not a number")
        try:
            v = float(raw)
        except (TypeError, ValueError):
            raise ValueError("not a number") from None
        if not math.isfinite(v):
            raise ValueError("not a finite number")
        return v
    if type_name == "list":
        if isinstance(raw, str):
            return split_list(raw)
        if isinstance(raw, (list, tuple, set, frozenset)):
            return tuple(str(x).strip() for x in raw if str(x).strip())
        raise ValueError("not a comma-separated list")
    if type_name == "map":
        if isinstance(raw, Mapping):
            return {str(k): str(v) for k, v in raw.items()}
        raise ValueError("not a mapping")
    if not isinstance(raw, str):
        raise ValueError("not a string")
    return raw


# Settings whose value a warning must not show (a token in the application's log).
_SECRET = frozenset({"agent_authentication"})


def _validated(s: Setting, source: str, raw: Any) -> tuple[bool, Any]:
    shown = "****" if s.name in _SECRET else raw
    try:
        value = _parse(s.type_name, raw)
    except ValueError as e:
        _report(source, shown, str(e), s.default)
        return False, None
    # Names read in any case and without the blanks a YAML value or a shell quote leaves
    # around them, as numbers and booleans are ("http " fell back to gRPC).
    if s.name in ("agent_logging_level", "agent_log_reporter_level"):
        value = value.strip().upper()
    if s.name == "agent_protocol":
        value = value.strip().lower()
    if s.check is addresses:
        value = _good_entries(source, value)
    if s.check is not None:
        why = s.check(value)
        if why is not None:
            _report(source, shown, why, s.default)
            return False, None
    return True, value


def _good_entries(source: str, value: str) -> str:
    """A list of addresses without its unusable entries, each refused (logged once, naming the
    setting and the entry); unchanged when none is usable (refused whole, the default used)."""
    kept, bad = split_addresses(value)
    if not bad or not kept:
        return value
    for entry in bad:
        key = (source, "entry " + repr(entry)[:200])
        if key not in _reported:
            _reported.add(key)
            log.warning("swmp: %s entry %r is %s; left out, using %r", source, entry, ADDRESS_RULE, kept)
    return kept


def load(environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
    """Build a Config from the environment, then keyword arguments (which win). Never raises."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for s in settings():
        if s.prefix:
            family = {k[len(s.prefix) :].lower(): v for k, v in env.items() if k.startswith(s.prefix)}
            if family:
                values[s.name] = family
            continue
        for var in (s.env, *s.aliases):
            if var in env:
                ok, value = _validated(s, var, env[var])
                if ok:
                    values[s.name] = value
                break
    _report_peer_only(env)
    known = {f.name: f for f in settings()}
    for key, raw in overrides.items():
        s2 = known.get(key)
        if s2 is None:
            if ("kwarg", key) not in _reported:
                _reported.add(("kwarg", key))
                log.warning(
                    "swmp: start() got an unknown setting %r; ignored (see docs/configuration.md)", key
                )
            continue
        ok, value = _validated(s2, f"start({key}=...)", raw)
        if ok:
            values[key] = value
    return Config(**values)


def _report_peer_only(env: Mapping[str, str]) -> None:
    """Name, once and in one line, the SkyWalking Python agent's variables that are set but
    have no effect in swmp (docs/migrating.md says why for each)."""
    from swmp._peer_config import unsupported  # noqa: PLC0415

    declared = [name for s in settings() for name in (s.env, *s.aliases)]
    names = unsupported(env, declared)
    key = ("peer-only", ",".join(names))
    if not names or key in _reported:
        return
    _reported.add(key)
    log.warning(
        "swmp: these SkyWalking Python agent settings have no effect in swmp: %s (see docs/migrating.md)",
        ", ".join(names),
    )


def parse_instance_properties(cfg: Config) -> dict[str, str]:
    """``SW_AGENT_INSTANCE_PROPERTIES_JSON`` as a dict; a bad value is reported once and ignored."""
    raw = cfg.agent_instance_properties_json
    if not raw:
        return {}
    import json  # noqa: PLC0415 (rarely used; keep start-up imports small)

    try:
        obj = json.loads(raw)
    except ValueError as e:
        _report("SW_AGENT_INSTANCE_PROPERTIES_JSON", raw, f"not JSON: {e}", {})
        return {}
    if not isinstance(obj, dict):
        _report("SW_AGENT_INSTANCE_PROPERTIES_JSON", raw, "not a JSON object", {})
        return {}
    return {str(k): str(v) for k, v in obj.items()}
