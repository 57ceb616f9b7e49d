"""What every reporter part shares: the counters, the log-once rule, and which kinds are shut.

One :class:`Journal` per reporter. Parts count into it and log through it, so an error that
repeats on every record is logged once and counted always (the status document shows the
counts), and a kind found unsupported by one part (delivery) is dropped at once by the
others (intake, replay).
"""

from __future__ import annotations

import logging

from reporter_proc.settings import ReporterSettings
from reporter_proc.status import Counters

log = logging.getLogger("swmp.reporter")


class Journal:
    def __init__(self, settings: ReporterSettings) -> None:
        self.settings = settings
        self.counters = Counters()
        # kind name -> the dropped.<reason> its records are counted under instead of sent.
        self.shut: dict[str, str] = {}
        self._logged: set[str] = set()

    def log_once(self, key: str, level: int, msg: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, msg, *args)

    def dropped(self, reason: str, n: int = 1) -> None:
        self.counters.add(self.counters.dropped, reason, n)

    def invalid(self, why: str, n: int = 1) -> None:
        self.dropped("invalid", n)
        self.log_once(
            "invalid", logging.ERROR, "dropping an invalid record (%s); further ones are only counted", why
        )

    def unsupported(self, kind: str, n: int, exc: Exception) -> None:
        """The sender said it cannot carry ``kind``: shut it for good."""
        self.shut[kind] = "unsupported"
        self.dropped("unsupported", n)
        self.log_once(
            f"unsupported-{kind}", logging.WARNING, "%s; %s records are dropped and counted", exc, kind
        )
