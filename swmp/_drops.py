"""A process's counts of the records it dropped for want of a ring (``swmp._runtime``), the
shared arena header words they are added to (``ipc.Arena.add_counts``), and those that no
file took, reported at the process's exit (:class:`UnseenDrops`)."""

from __future__ import annotations

import logging
import os
import threading

from ipc import _layout as L

__all__ = ["LABELS", "UnseenDrops", "header_counts", "no_counts"]

log = logging.getLogger("swmp.agent")


def no_counts() -> dict[str, int]:
    return {"no_slot": 0, "helper": 0, "master": 0, "late": 0, "workers": 0}


# How ``swmp status`` names each count (the report at exit uses the same words).
LABELS = {"no_slot": "no slot", "helper": "helpers", "master": "master", "late": "after exit"}


def header_counts(counts: dict[str, int]) -> dict[int, int]:
    """A process's drop counts as increments of the shared arena's header words."""
    return {
        L.H_NO_SLOT_RECORDS: counts["no_slot"],
        L.H_NO_SLOT_WORKERS: counts["workers"],
        L.H_HELPER_RECORDS: counts["helper"],
        L.H_MASTER_RECORDS: counts["master"],
        L.H_LATE_RECORDS: counts["late"],
    }


class UnseenDrops:
    """The sink's counts that no shared file took (``swmp._runtime.ProcessSink``), logged at
    the process's exit."""

    def __init__(self) -> None:
        # Counts of this process (``_unseen_pid``) that had nowhere to go: the shared file was
        # gone (thread mode: the owner removes the registry at exit). Reported at exit.
        self._unseen = no_counts()
        self._unseen_pid = -1
        self._unseen_reported = False
        self._late_said = False  # the drop after the report said (once a process)
        self._unpublished = no_counts()  # not yet in the shared arena
        self._claiming = 0  # the thread claiming a ring slot now (0: none)
        self._publishing = 0  # the thread publishing drop counts now (0: none)

    def publish_drops(self) -> None:
        """Move this process's unpublished drop counts to where ``swmp status`` reads them."""
        if not any(self._unpublished.values()):
            return
        # Not re-entered by the thread publishing (a signal handler that logs, run inside):
        # the arena's counter lock it holds would be waited for, for good. Left for the next.
        me = threading.get_ident()
        if me in (self._publishing, self._claiming):  # (claim_slot holds that lock too)
            return
        self._publishing = me
        try:
            self._publish_pending()
        finally:
            self._publishing = 0

    def _publish_pending(self) -> None:
        # Swapped, not copied and zeroed, to keep the window small: a drop that another
        # thread of this process counts at the very same instant can still be missed.
        pending, self._unpublished = self._unpublished, no_counts()
        try:
            published = self._publish(pending)
        except Exception:
            published = False
            log.debug("swmp: drop counts not published", exc_info=True)
        if not published:
            self._keep_unseen(pending)

    def _publish(self, counts: dict[str, int]) -> bool:
        """Add ``counts`` to the shared arena; False when there is none that anyone reads."""
        return False

    def _keep_unseen(self, counts: dict[str, int]) -> None:
        """Counts no file took (it was removed): kept for :meth:`report_unseen`."""
        pid = os.getpid()
        if self._unseen_pid != pid:  # a parent's counts are its own to report
            self._unseen_pid, self._unseen = pid, no_counts()
            self._unseen_reported = self._late_said = False
        for kind, n in counts.items():
            self._unseen[kind] += n
        if self._unseen_reported and not self._late_said:
            # After the report at exit: an atexit handler registered before the agent started.
            self._late_said = True
            log.error(
                "swmp: process %d dropped a record made after the agent's exit report; nothing "
                "running can count it (more are dropped silently)",
                pid,
            )

    def unseen_drops(self) -> dict[str, int]:
        """This process's drops that no file took (see :meth:`report_unseen`)."""
        return dict(self._unseen) if self._unseen_pid == os.getpid() else no_counts()

    def report_unseen(self) -> None:
        """At exit, after the application's exit handlers: log how many records this process
        dropped where no ``swmp status`` can see them (in thread mode the owner removed the
        registry at its goodbye; its own later records had nowhere to be counted)."""
        pid = os.getpid()
        if self._unseen_pid != pid:
            self._unseen_pid, self._unseen, self._late_said = pid, no_counts(), False
        self._unseen_reported = True
        counts = self._unseen
        total = sum(counts[kind] for kind in LABELS)
        if total:
            detail = ", ".join(f"{label}: {counts[kind]}" for kind, label in LABELS.items() if counts[kind])
            log.warning(
                "swmp: process %d dropped %d records that nothing running can count any more (%s)",
                pid,
                total,
                detail,
            )
