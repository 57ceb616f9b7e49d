"""Process mode's sink (``SW_AGENT_REPORTER_PROCESS=true``): the slot this process claims in
the application's shared arena is its ring, which the reporter process drains.

What it shares with thread mode (one claim per process, the announce, the re-stamp, the
leave, dropping and counting where there is no ring) is ``swmp._runtime.ProcessSink``.
"""

from __future__ import annotations

from ipc import Arena, RingWriter, still_linked
from swmp._runtime import ProcessSink, header_counts, master_instance_name

__all__ = ["ArenaSink"]


class ArenaSink(ProcessSink):
    """Process mode: writes into the slot this process claimed in the shared arena."""

    def __init__(
        self,
        arena: Arena,
        service: str,
        instance_base: str,
        *,
        namespace: str = "",
        properties: dict[str, str] | None = None,
        owner_pid: int = 0,
    ) -> None:
        super().__init__(
            service, instance_base, namespace=namespace, properties=properties, owner_pid=owner_pid
        )
        self.arena = arena

    def _attach(self, pid: int) -> tuple[RingWriter, int] | None:
        writer = self.arena.claim_slot()
        if writer is None:
            self._warn_once(
                "full",
                "swmp: all %d ring slots of %s are taken; telemetry of process %d is dropped "
                "and counted until a slot frees up (raise SW_AGENT_ARENA_SLOTS)",
                self.arena.slots,
                self.arena.path,
                pid,
            )
            return None
        try:
            self._name_and_announce(writer, pid, writer.slot)
        except BaseException:
            self.arena.release_slot(writer.slot)  # the next attempt claims it again
            raise
        return writer, writer.slot

    def _release(self, timeout: float) -> None:
        self.arena.release_slot()

    def _publish(self, counts: dict[str, int]) -> bool:
        if not still_linked(self.arena):  # the last reporter out removed it
            return False
        self.arena.add_counts(header_counts(counts))
        return True

    def _attach_master(self, pid: int) -> RingWriter | None:
        writer = self.arena.claim_slot(highest=True)
        if writer is None:
            self._warn_once(
                "full-master", "swmp: no free ring slot for the master's logs in %s", self.arena.path
            )
            return None
        self._name_and_announce(writer, pid, writer.slot, master_instance_name(self.instance_base))
        return writer

    def _release_master(self, writer: RingWriter) -> None:
        self.arena.release_slot(writer.slot)

    def report_arena(self) -> Arena | None:
        """The arena whose reporter serves this process (its board carries profile tasks)."""
        return self.arena
