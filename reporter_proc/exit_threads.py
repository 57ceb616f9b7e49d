"""May this process still start a thread? Python 3.12.0 and 3.12.1 refuse to start one once
the program's exit has begun, from its first exit hook on (CPython gh-104690; 3.12.2 allows it
again until the program's own threads are gone, gh-113964). Every sender starts one as it
connects: grpc.aio its completion-queue poller (and, refused, grpcio 1.85 crashed the process
with SIGSEGV: measured on 3.12.1), aiohttp and aiokafka a resolver thread. A thread-mode
reporter still starting up when the program exits (its first records came within ~0.1 s of
the end) asks first, and gives up with an error the user can read instead."""

from __future__ import annotations

import logging
import platform
import sys
import threading

log = logging.getLogger("swmp.reporter")

# The releases that refuse (3.12.0's release candidates too).
REFUSING_RELEASES = ((3, 12, 0), (3, 12, 1))


def _nothing() -> None:
    pass


def threads_refused() -> bool:
    """True when this interpreter refuses new threads now (only ever on REFUSING_RELEASES)."""
    if sys.version_info[:3] not in REFUSING_RELEASES:
        return False
    probe = threading.Thread(target=_nothing, name="swmp-thread-probe", daemon=True)
    try:
        probe.start()
    except RuntimeError:
        return True
    probe.join()
    return False


def sender_refused_at_exit(protocol: str) -> bool:
    """``threads_refused()``, with the error logged when so."""
    if not threads_refused():
        return False
    log.error(
        "the reporter thread cannot start its %s sender: the program is exiting, and Python %s "
        "starts no thread then (3.12.2 and later do); what it recorded is not delivered. "
        "Process mode (SW_AGENT_REPORTER_PROCESS=true, the default) is not affected",
        protocol,
        platform.python_version(),
    )
    return True
