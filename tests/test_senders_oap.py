"""gRPC and HTTP senders against a real SkyWalking OAP (10.1.0): what the backend stores."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from reporter_proc.senders import create_sender
from reporter_proc.senders.base import Sender
from reporter_proc.settings import ReporterSettings
from tests.oap_graphql import wait_for
from tests.realpeers import OapServer
from tests.test_senders import run

pytestmark = pytest.mark.e2e


def _records(service: str) -> tuple[list[Any], list[Any], str]:
    now = int(time.time() * 1000)
    trace_id = uuid.uuid4().hex
    instance = f"{service}-0@test"
    segment = [
        trace_id,
        f"{trace_id}.1",
        service,
        instance,
        False,
        [
            [
                0,
                -1,
                now - 30,
                now,
                "GET /e2e",
                "",
                0,
                3,
                7000,
                False,
                False,
                ["http.method", "GET", "url", "http://127.0.0.1/e2e", "http.status_code", "200"],
                [],
                [],
            ],
            [
                1,
                0,
                now - 20,
                now - 5,
                "SELECT",
                "db:5432",
                1,
                1,
                7001,
                True,
                False,
                ["db.statement", "SELECT 1"],
                [[now - 10, ["event", "error", "message", "boom"]]],
                [],
            ],
        ],
    ]
    log = [
        now,
        service,
        instance,
        "GET /e2e",
        "text",
        f"hello from {service}",
        trace_id,
        f"{trace_id}.1",
        0,
        ["level", "INFO"],
        "",
    ]
    return segment, log, trace_id


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_oap_stores_what_the_sender_sent(oap_server: OapServer, protocol: str) -> None:
    service = f"swmp-e2e-{protocol}-{uuid.uuid4().hex[:6]}"
    segment, log, trace_id = _records(service)
    address = oap_server.grpc if protocol == "grpc" else oap_server.rest
    sender = create_sender(ReporterSettings(protocol=protocol, backends=(address,), service=service))

    async def body(s: Sender) -> None:
        await s.start()
        try:
            await s.report_properties(service, segment[3], [("language", "python"), ("Process No.", "7")])
            await s.keep_alive(service, segment[3])
            await s.send_segments([segment])
            await s.send_logs([log])
        finally:
            await s.close()

    run(body(sender))
    q = oap_server.query
    spans = wait_for(lambda: q.trace(trace_id), timeout=60, what=f"trace {trace_id}")
    by_id = {sp.span_id: sp for sp in spans}
    assert by_id[0].operation_name == "GET /e2e" and by_id[0].type == "Entry" and by_id[0].layer == "Http"
    assert by_id[0].tags["http.status_code"] == "200" and by_id[0].service_code == service
    assert by_id[1].type == "Exit" and by_id[1].is_error and by_id[1].peer == "db:5432"
    assert by_id[1].logs[0].data == {"event": "error", "message": "boom"}
    service_id = wait_for(lambda: q.service_id(service), timeout=60, what=f"service {service}")
    logs = wait_for(lambda: q.logs(service_id, trace_id=trace_id), timeout=60, what="the log")
    assert logs[0].content == f"hello from {service}" and logs[0].tags.get("level") == "INFO"
    instances = wait_for(
        lambda: [i for i in q.instances(service_id) if i.attributes.get("Process No.")],
        timeout=60,
        what="instance properties",
    )
    assert instances[0].name == segment[3] and instances[0].language.lower() == "python"
