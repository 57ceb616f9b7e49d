"""The reporter: drains the arena's rings and ships telemetry to the SkyWalking backend.

Kept import-light on purpose: the application's master imports this package before it
forks, so nothing here may load grpc, aiohttp or aiokafka (the senders are imported inside
the reporter, after fork). Public entry points are loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reporter_proc.settings import ReporterSettings

if TYPE_CHECKING:
    from reporter_proc.loop import Reporter
    from reporter_proc.process import ReporterThread, spawn_reporter, start_reporter_thread

__all__ = ["Reporter", "ReporterSettings", "ReporterThread", "spawn_reporter", "start_reporter_thread"]

_LAZY = {
    "Reporter": "reporter_proc.loop",
    "ReporterThread": "reporter_proc.process",
    "spawn_reporter": "reporter_proc.process",
    "start_reporter_thread": "reporter_proc.process",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'reporter_proc' has no attribute {name!r}")
    import importlib  # noqa: PLC0415

    return getattr(importlib.import_module(module), name)
