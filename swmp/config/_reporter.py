"""How the data leaves the application: reporter process, shared memory, batches, spool."""

from __future__ import annotations

from dataclasses import dataclass

from reporter_proc.settings import BOUNDS
from swmp.config._declare import (
    KIB,
    MIB,
    REPORTER,
    opt,
    power_of_two,
)


@dataclass(frozen=True)
class ReporterProcessSettings:
    """The reporter process and the arena (swmp's own settings)."""

    agent_reporter_process: bool = opt(
        True,
        "SW_AGENT_REPORTER_PROCESS",
        "Ship data from a dedicated reporter process; false: a background thread in the application. "
        "Keep `true` for a program that closes every descriptor it did not open (a daemon): with gRPC "
        "a reporter thread stops for good then ([reporter.md, Thread mode](reporter.md#thread-mode)).",
        REPORTER,
    )
    agent_arena_dir: str = opt(
        "/dev/shm",
        "SW_AGENT_ARENA_DIR",
        "Directory of the shared-memory arena file (a tmpfs); the files go in a private 0700 "
        "subdirectory `swmp-<uid>`.",
        REPORTER,
    )
    agent_arena_slots: int = opt(
        64,
        "SW_AGENT_ARENA_SLOTS",
        "Ring slots in the arena: the most workers that can report at once.",
        REPORTER,
        check=lambda v: None if 1 <= v <= 4096 else "must be between 1 and 4096",
    )
    agent_ring_size: int = opt(
        4 * MIB,
        "SW_AGENT_RING_SIZE",
        "Bytes per worker ring (power of two, 4 KiB..1 GiB): the most a worker's records can wait "
        "unread. A ring of 256 KiB or more gives the pages the reporter has read back to the "
        "system, so it keeps resident about what is unread plus 256 KiB.",
        REPORTER,
        check=power_of_two(4 * KIB, 1024 * MIB),
    )
    agent_reporter_batch_size: int = opt(
        1000,
        "SW_AGENT_REPORTER_BATCH_SIZE",
        "Most records the reporter sends in one batch.",
        REPORTER,
        check=BOUNDS["batch_max_records"],
    )
    agent_reporter_batch_max_bytes: int = opt(
        4 * MIB,
        "SW_AGENT_REPORTER_BATCH_MAX_BYTES",
        "Most payload bytes in one batch (well under the OAP's 50 MiB gRPC message limit); "
        "a batch the backend still finds too large is split and retried.",
        REPORTER,
        check=BOUNDS["batch_max_bytes"],
    )
    agent_reporter_flush_interval: float = opt(
        5.0,
        "SW_AGENT_REPORTER_FLUSH_INTERVAL",
        "Longest time in seconds a record waits in the reporter below saturation before it is "
        "sent (plus up to the 1 s between its reads of the rings). A batch of 500 records or "
        "more is sent at the next read, a full one at once: a send costs about the same CPU "
        "whatever it carries, so a quiet application sends seldom and a busy one about once a second "
        "(0.001 to 86400).",
        REPORTER,
        check=BOUNDS["flush_interval_s"],
    )
    agent_reporter_send_timeout: float = opt(
        10.0,
        "SW_AGENT_REPORTER_SEND_TIMEOUT",
        "Seconds one send to the backend may take (0.1 to 86400).",
        REPORTER,
        check=BOUNDS["send_timeout_s"],
    )
    agent_reporter_max_pending_bytes: int = opt(
        64 * MIB,
        "SW_AGENT_REPORTER_MAX_PENDING_BYTES",
        "Bytes of unsent data the reporter keeps in memory before spooling or dropping.",
        REPORTER,
        check=BOUNDS["max_pending_bytes"],
    )
    agent_reporter_shutdown_timeout: float = opt(
        5.0,
        "SW_AGENT_REPORTER_SHUTDOWN_TIMEOUT",
        "Seconds the reporter may spend flushing at shutdown (0 to 86400).",
        REPORTER,
        check=BOUNDS["shutdown_deadline_s"],
    )
    agent_spool_dir: str = opt(
        "auto",
        "SW_AGENT_SPOOL_DIR",
        "Directory for spooling data during a long backend outage (one private sub-directory per "
        "service). `auto`: `$XDG_STATE_HOME/swmp/spool`, else `~/.local/state/swmp/spool`, else "
        "`/var/tmp/swmp-<uid>/spool` (`/var/tmp/swmp-<uid>.<random>/spool` if another user took that "
        "name); empty or `off` = no spool. A directory another user could tamper with is refused "
        "(spool off, logged).",
        REPORTER,
    )
    agent_spool_max_bytes: int = opt(
        1024 * MIB,
        "SW_AGENT_SPOOL_MAX_BYTES",
        "Size cap of the spool directory (a 10-minute outage at 1,000 segments/s of ~500 bytes "
        "needs ~320 MiB); above it the oldest records are dropped and counted.",
        REPORTER,
        check=BOUNDS["spool_max_bytes"],
    )
    agent_tls_ca_file: str = opt(
        "",
        "SW_AGENT_TLS_CA_FILE",
        "PEM file of the CA(s) to trust for the gRPC/HTTP backend instead of the system's; implies TLS.",
        REPORTER,
    )
    agent_tls_cert_file: str = opt(
        "",
        "SW_AGENT_TLS_CERT_FILE",
        "PEM client certificate for mutual TLS to the gRPC/HTTP backend (with SW_AGENT_TLS_KEY_FILE); "
        "implies TLS.",
        REPORTER,
    )
    agent_tls_key_file: str = opt(
        "",
        "SW_AGENT_TLS_KEY_FILE",
        "PEM private key (unencrypted) of SW_AGENT_TLS_CERT_FILE; implies TLS.",
        REPORTER,
    )
    agent_tls_server_name: str = opt(
        "",
        "SW_AGENT_TLS_SERVER_NAME",
        "Name the backend's certificate must carry when it differs from the address's host; implies TLS.",
        REPORTER,
    )
