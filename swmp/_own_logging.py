"""The level of the agent's own loggers (``SW_AGENT_LOGGING_LEVEL``), applied when it starts.

The agent logs on ``swmp`` (and its children) and its shared-memory package on ``ipc``.
:func:`apply` runs in ``swmp.agent.start`` whatever started the agent (``swmp run``'s loader,
``swmp.start()`` with or without keywords), before the reporter is forked or its thread
started: the reporter process inherits the levels with the rest of the interpreter, so
none of them sets a level of its own. :func:`restore` puts back what the loggers had, so a
stopped agent leaves the application's logging as it found it.
"""

from __future__ import annotations

import logging

from swmp.config import LOG_LEVELS, Config

AGENT_LOGGERS = ("swmp", "ipc")

log = logging.getLogger("swmp.agent")

_saved: dict[str, int] | None = None


def level_of(config: Config) -> int:
    """The configured level as a number; a value no loader checked (a hand-built Config)
    is refused with a warning and the setting's default used, never raised."""
    name = str(config.agent_logging_level).strip().upper()
    if name not in LOG_LEVELS:
        default = Config.agent_logging_level
        # The loader's wording (docs/troubleshooting.md lists it once for every setting).
        log.warning(
            "swmp: %s=%r is invalid (%s); using %r instead",
            "agent_logging_level",
            config.agent_logging_level,
            f"must be one of {', '.join(LOG_LEVELS)}",
            default,
        )
        name = default
    level = logging.getLevelName(name)
    return level if isinstance(level, int) else logging.INFO


def apply(config: Config) -> None:
    """Set the agent's loggers to the configured level (remembering the first levels seen)."""
    global _saved
    level = level_of(config)
    if _saved is None:
        _saved = {name: logging.getLogger(name).level for name in AGENT_LOGGERS}
    for name in AGENT_LOGGERS:
        logging.getLogger(name).setLevel(level)


def restore() -> None:
    """Give the agent's loggers back the levels they had before :func:`apply`."""
    global _saved
    if _saved is None:
        return
    for name, level in _saved.items():
        logging.getLogger(name).setLevel(level)
    _saved = None
