"""Every setting of the agent, declared once.

Each field of :class:`Config` is one setting. Its metadata names the ``SW_*`` environment
variable, a one-line description and the section it belongs to; ``docs/configuration.md``
is generated from these declarations (``python scripts/gen_config_doc.py``).

Names follow the Apache SkyWalking Python agent wherever it has the setting, so a
deployment switches agents without rewriting its environment. The keyword-argument name of
a setting (``swmp.start(agent_name="svc")``) is its variable name without the ``SW_``
prefix, lower-cased: ``SW_AGENT_NAME`` -> ``agent_name``.

Loading never fails: a value that cannot be parsed or is out of range is reported once on
the ``swmp.config`` logger (which variable, what was wrong, what is used instead) and the
default is used.
"""

from __future__ import annotations

from reporter_proc.settings import MAX_SECONDS
from swmp.config._declare import KAFKA_CONFIG_PREFIX, KIB, LOG_LEVELS, MIB, PROTOCOLS
from swmp.config._load import load, parse_instance_properties
from swmp.config._model import Config, Setting, env_to_kwarg, settings

__all__ = [
    "KAFKA_CONFIG_PREFIX",
    "KIB",
    "LOG_LEVELS",
    "MAX_SECONDS",
    "MIB",
    "PROTOCOLS",
    "Config",
    "Setting",
    "env_to_kwarg",
    "load",
    "parse_instance_properties",
    "settings",
]
