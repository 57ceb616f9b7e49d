"""Taking in what agents send: count it, store it, and refuse bad input without falling over.

Both receivers (gRPC and HTTP) hand decoded messages to :class:`Intake`. A refusal (garbage
protobuf, a body that is not JSON, too large, the wrong content type) is counted under its
reason and logged once per reason, with the first example; the counters are on the web page
and in ``/api/stats``.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from google.protobuf.message import Message

from swmp.collector import decode
from swmp.collector.store import Store
from swmp.ops.fmt import terminal_safe

log = logging.getLogger("swmp.collector")


class Intake:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.started = time.time()
        self._lock = threading.Lock()
        self.received: Counter[str] = Counter()  # messages per kind
        self.calls: Counter[str] = Counter()  # "grpc:collectInSync", "http:/v3/segments", ...
        self.refused: Counter[str] = Counter()  # refusals per reason
        self.first_refusal: dict[str, str] = {}  # reason -> the first example's detail

    def call(self, transport: str, method: str) -> None:
        with self._lock:
            self.calls[f"{transport}:{method}"] += 1

    def refuse(self, where: str, reason: str, detail: str) -> None:
        # the path and the detail quote what the sender sent: no ESC from it reaches the log
        where, detail = terminal_safe(where), terminal_safe(detail)
        with self._lock:
            self.refused[reason] += 1
            first = reason not in self.first_refusal
            if first:
                self.first_refusal[reason] = f"{where}: {detail}"
        if first:
            log.warning(
                "collector: refused %s (%s: %s); further refusals of this kind are only counted",
                where,
                reason,
                detail,
            )

    def accept(self, kind: str, messages: Iterable[Message], transport: str) -> int:
        """Store decoded messages of one kind; the number taken."""
        msgs = list(messages)
        if kind == "segment":
            n = self.store.add_segments([decode.segment_doc(m) for m in msgs], transport)  # type: ignore[arg-type]
        elif kind == "log":
            n = self.store.add_logs([decode.log_doc(m) for m in msgs])  # type: ignore[arg-type]
        elif kind == "meter":
            docs = [decode.meter_doc(m) for m in msgs]  # type: ignore[arg-type]
            # a meter stream names its service and instance only on its first message
            for prev, cur in itertools.pairwise(docs):
                cur["service"] = cur["service"] or prev["service"]
                cur["instance"] = cur["instance"] or prev["instance"]
            n = self.store.add_meters(docs)
        elif kind == "properties":
            for m in msgs:
                d = decode.properties_doc(m)  # type: ignore[arg-type]
                self.store.touch_instance(d["service"], d["instance"], properties=d["properties"])
            n = len(msgs)
        elif kind == "ping":
            for m in msgs:
                d = decode.ping_doc(m)  # type: ignore[arg-type]
                self.store.touch_instance(d["service"], d["instance"], ping=True)
            n = len(msgs)
        else:  # profile snapshots and task reports: counted, not kept
            n = len(msgs)
        with self._lock:
            self.received[kind] += n
        return n

    def stats(self) -> dict[str, Any]:
        with self._lock:
            doc: dict[str, Any] = {
                "uptime_s": round(time.time() - self.started, 1),
                "received": dict(self.received),
                "calls": dict(self.calls),
                "refused": dict(self.refused),
                "refused_examples": dict(self.first_refusal),
            }
        doc["stored"] = self.store.counts()
        doc["database"] = self.store.path
        return doc
