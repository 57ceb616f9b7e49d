"""Finding the records to blame when a send is refused, for live delivery and replay alike.

A call the backend refuses as too large or invalid (``TooLargeError``, ``InvalidDataError``)
is sent again in halves, recursively, until the refused records are alone; a call the
encoder chokes on is sent one record at a time. Either way a bad record costs itself, not
the records sent with it. Records whose part failed for a reason worth retrying are handed
back to the caller, which owns the retries (live delivery's backoff, replay's next probe).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from reporter_proc.journal import Journal
from reporter_proc.senders.base import (
    FatalSendError,
    InvalidDataError,
    Record,
    SendError,
    TooLargeError,
    UnsupportedError,
)

RETRYABLE = (SendError, asyncio.TimeoutError, OSError)

Send = Callable[[str, list[Record]], Awaitable[None]]


async def split(
    journal: Journal, send: Send, kind: str, records: list[Record], exc: FatalSendError, *, keep: list[Record]
) -> int:
    """The backend refused ``records`` as too large or invalid: send halves, recursively.

    A single record refused is dropped and counted (``dropped.too_large`` or
    ``dropped.rejected``); records whose part failed for a retryable reason go to ``keep``
    for the caller's next attempt. Returns how many records were sent (counted in ``sent``).
    """
    j = journal
    if len(records) == 1:
        if isinstance(exc, TooLargeError):
            j.dropped("too_large")
            j.log_once(
                f"too-large-{kind}",
                logging.WARNING,
                "dropped a %s record the backend finds too large (%s); more are only counted",
                kind,
                exc,
            )
        else:
            j.dropped("rejected")
            j.log_once(
                f"invalid-{kind}",
                logging.WARNING,
                "dropped a %s record the backend refused as invalid (%s); more are only counted",
                kind,
                exc,
            )
        return 0
    sent = 0
    mid = len(records) // 2
    for part in (records[:mid], records[mid:]):
        try:
            await send(kind, part)
        except (TooLargeError, InvalidDataError) as part_exc:
            sent += await split(j, send, kind, part, part_exc, keep=keep)
        except UnsupportedError:
            keep.extend(part)  # the caller's next attempt shuts the kind
        except FatalSendError as part_exc:
            j.dropped("rejected", len(part))
            msg = "backend refused %d %s records: %s"
            j.log_once(f"fatal-{kind}", logging.ERROR, msg, len(part), kind, part_exc)
        except RETRYABLE:
            keep.extend(part)
        except asyncio.CancelledError:
            raise
        except Exception:
            keep.extend(part)  # an encoder problem: the caller's next attempt isolates it
        else:
            j.counters.add(j.counters.sent, kind, len(part))
            j.counters.success()
            sent += len(part)
    return sent


async def isolate(journal: Journal, send: Send, kind: str, records: list[Record]) -> tuple[list[Record], int]:
    """Send records one by one so one bad record costs itself, not its call.

    A record the encoder refuses is counted in ``dropped.invalid``. Returns the records to try
    again (their send failed for a retryable reason, or the kind is unsupported: the caller's
    next attempt counts them) and how many were sent (counted in ``sent``).
    """
    j = journal
    keep: list[Record] = []
    sent = 0
    for rec in records:
        try:
            await send(kind, [rec])
        except (UnsupportedError, *RETRYABLE):
            keep.append(rec)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            j.invalid(f"{kind} record could not be encoded: {exc!r}")
        else:
            j.counters.add(j.counters.sent, kind)
            j.counters.success()
            sent += 1
    return keep, sent
