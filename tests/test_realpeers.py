"""The real-backend launchers and fixtures work: what other e2e tests build on.

Sends telemetry the way an agent does (generated protobuf modules, plain gRPC / Kafka
clients, no swmp code) and reads it back from the OAP through GraphQL, so a failure here
points at the test infrastructure, not at the agent.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import grpc
import pytest

from reporter_proc.protocol.generated import (
    common_pb2,
    logging_pb2,
    logging_pb2_grpc,
    management_pb2,
    management_pb2_grpc,
    meter_pb2,
    meter_pb2_grpc,
    tracing_pb2,
    tracing_pb2_grpc,
)
from tests.oap_graphql import MqeResult, entity, wait_for
from tests.realpeers import OAP_VERSION, SCRIPTS, KafkaBroker, OapServer, check_tools, free_ports, unique_name

SpanType = tracing_pb2.SpanType
SpanLayer = tracing_pb2.SpanLayer


def _segment(service: str, instance: str, trace_id: str, segment_id: str) -> tracing_pb2.SegmentObject:
    """An HTTP entry span (Flask) with a database exit span (Psycopg) below it."""
    now = int(time.time() * 1000)
    seg = tracing_pb2.SegmentObject(
        traceId=trace_id, traceSegmentId=segment_id, service=service, serviceInstance=instance
    )
    seg.spans.add(
        spanId=1,
        parentSpanId=0,
        startTime=now - 40,
        endTime=now - 10,
        operationName="SELECT swmp_items",
        peer="db.local:5432",
        spanType=SpanType.Exit,
        spanLayer=SpanLayer.Database,
        componentId=7010,
        tags=[
            common_pb2.KeyStringValuePair(key="db.type", value="PostgreSQL"),
            common_pb2.KeyStringValuePair(key="db.statement", value="SELECT 1"),
        ],
    )
    seg.spans.add(
        spanId=0,
        parentSpanId=-1,
        startTime=now - 50,
        endTime=now,
        operationName="GET:/swmp/items",
        spanType=SpanType.Entry,
        spanLayer=SpanLayer.Http,
        componentId=7001,
        isError=True,
        tags=[
            common_pb2.KeyStringValuePair(key="http.method", value="GET"),
            common_pb2.KeyStringValuePair(key="http.status_code", value="500"),
        ],
    )
    return seg


# ---------------------------------------------------------------------------- OAP over gRPC
@pytest.mark.e2e
def test_oap_stores_segment_sent_over_grpc(oap_server: OapServer) -> None:
    service = unique_name()
    instance = f"{service}-0@127.0.0.1"
    trace_id, segment_id = uuid.uuid4().hex, uuid.uuid4().hex
    with grpc.insecure_channel(oap_server.grpc) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        management_pb2_grpc.ManagementServiceStub(channel).reportInstanceProperties(
            management_pb2.InstanceProperties(
                service=service,
                serviceInstance=instance,
                properties=[
                    common_pb2.KeyStringValuePair(key="language", value="python"),
                    common_pb2.KeyStringValuePair(key="Process No.", value=str(os.getpid())),
                ],
            ),
            timeout=30,
        )
        tracing_pb2_grpc.TraceSegmentReportServiceStub(channel).collect(
            iter([_segment(service, instance, trace_id, segment_id)]), timeout=30
        )

    q = oap_server.query
    service_id = wait_for(lambda: q.service_id(service), timeout=60, what=f"service {service}")
    briefs = wait_for(lambda: q.traces(service_id), timeout=60, what="a trace of the service")
    assert briefs[0].trace_ids == (trace_id,)
    assert briefs[0].segment_id == segment_id
    assert briefs[0].endpoint_names == ("GET:/swmp/items",)
    assert briefs[0].is_error

    spans = {s.span_id: s for s in q.trace(trace_id)}
    assert set(spans) == {0, 1}
    entry, exit_ = spans[0], spans[1]
    assert (entry.operation_name, entry.type, entry.layer, entry.component) == (
        "GET:/swmp/items",
        "Entry",
        "Http",
        "Flask",
    )
    assert entry.is_error and entry.parent_span_id == -1
    assert entry.tags == {"http.method": "GET", "http.status_code": "500"}
    assert (exit_.operation_name, exit_.type, exit_.layer, exit_.component, exit_.peer) == (
        "SELECT swmp_items",
        "Exit",
        "Database",
        "Psychopg",
        "db.local:5432",
    )
    assert exit_.tags["db.statement"] == "SELECT 1"
    assert {s.service_code for s in spans.values()} == {service}
    assert {s.service_instance_name for s in spans.values()} == {instance}

    instances = wait_for(lambda: q.instances(service_id), timeout=30, what="the service instance")
    assert [i.name for i in instances] == [instance]
    assert instances[0].attributes.get("Process No.") == str(os.getpid())


@pytest.mark.e2e
def test_oap_stores_log_and_test_meter(oap_server: OapServer) -> None:
    service = unique_name()
    instance = f"{service}-0"
    trace_id = uuid.uuid4().hex
    now = int(time.time() * 1000)
    log = logging_pb2.LogData(
        timestamp=now,
        service=service,
        serviceInstance=instance,
        endpoint="GET:/swmp/log",
        body=logging_pb2.LogDataBody(type="text", text=logging_pb2.TextLog(text="swmp says hello")),
        traceContext=logging_pb2.TraceContext(traceId=trace_id, traceSegmentId=uuid.uuid4().hex, spanId=0),
        tags=logging_pb2.LogTags(data=[common_pb2.KeyStringValuePair(key="level", value="WARNING")]),
    )
    gauge = meter_pb2.MeterData(
        singleValue=meter_pb2.MeterSingleValue(
            name="swmp_test_gauge", labels=[meter_pb2.Label(name="kind", value="e2e")], value=42.0
        ),
        service=service,
        serviceInstance=instance,
        timestamp=now,
    )
    with grpc.insecure_channel(oap_server.grpc) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        logging_pb2_grpc.LogReportServiceStub(channel).collect(iter([log]), timeout=30)
        meter_pb2_grpc.MeterReportServiceStub(channel).collectBatch(
            iter([meter_pb2.MeterDataCollection(meterData=[gauge])]), timeout=30
        )

    q = oap_server.query
    service_id = wait_for(lambda: q.service_id(service), timeout=60, what=f"service {service}")
    logs = wait_for(lambda: q.logs(service_id), timeout=60, what="the log record")
    assert [(lg.content, lg.trace_id, lg.tags.get("level")) for lg in logs] == [
        ("swmp says hello", trace_id, "WARNING")
    ]
    assert logs[0].service_instance_name == instance

    # Meters reach storage after the OAP's persistence period (5 s in the launcher's config).
    def gauge_stored() -> MqeResult | None:
        result = q.mqe("meter_swmp_test_gauge", entity(service, instance))
        return result if result.values() else None

    result = wait_for(gauge_stored, timeout=90, what="meter_swmp_test_gauge")
    assert result.error is None
    assert 42.0 in result.values()


# ---------------------------------------------------------------------------- Kafka
@pytest.mark.e2e
def test_kafka_produce_and_consume(kafka_broker: KafkaBroker) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = f"swmp-realpeers-{uuid.uuid4().hex[:8]}"

    async def roundtrip() -> tuple[bytes | None, bytes | None]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"hello swmp", key=b"k1")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=kafka_broker.bootstrap, auto_offset_reset="earliest", group_id=None
        )
        await consumer.start()
        try:
            msg = await asyncio.wait_for(consumer.getone(), timeout=60)
        finally:
            await consumer.stop()
        return msg.key, msg.value

    assert asyncio.run(roundtrip()) == (b"k1", b"hello swmp")
    assert kafka_broker.bootstrap.startswith("127.0.0.1:")
    os.kill(kafka_broker.pid, 0)  # the pid is the live broker


@pytest.mark.e2e
def test_oap_reads_segment_from_kafka(oap_with_kafka: OapServer, kafka_broker: KafkaBroker) -> None:
    from aiokafka import AIOKafkaProducer

    assert oap_with_kafka.kafka_bootstrap == kafka_broker.bootstrap
    service = unique_name()
    trace_id, segment_id = uuid.uuid4().hex, uuid.uuid4().hex
    seg = _segment(service, f"{service}-0", trace_id, segment_id)
    topic = (
        "skywalking-segments"
        if not oap_with_kafka.namespace
        else f"{oap_with_kafka.namespace}-skywalking-segments"
    )

    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(topic, seg.SerializeToString(), key=segment_id.encode())
        finally:
            await producer.stop()

    asyncio.run(produce())
    q = oap_with_kafka.query
    service_id = wait_for(lambda: q.service_id(service), timeout=60, what=f"service {service} via Kafka")
    spans = wait_for(lambda: q.trace(trace_id), timeout=60, what="the trace sent via Kafka")
    assert sorted((s.operation_name, s.type) for s in spans) == [
        ("GET:/swmp/items", "Entry"),
        ("SELECT swmp_items", "Exit"),
    ]
    assert q.traces(service_id)[0].segment_id == segment_id


# ---------------------------------------------------------------------------- launcher scripts (no JVM)
def test_launcher_refuses_a_busy_port(tmp_path: Path) -> None:
    """A taken port is reported with exit status 3 (the fixtures retry on new ports)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        (cport,) = free_ports(1)
        env = {
            **os.environ,
            "RUN_DIR": str(tmp_path),
            "KAFKA_PORT": str(port),
            "KAFKA_CONTROLLER_PORT": str(cport),
        }
        proc = subprocess.run(
            ["bash", str(SCRIPTS / "start_kafka.sh")], env=env, capture_output=True, text=True, check=False
        )
    assert proc.returncode == 3, proc.stderr
    assert f"port {port} is already in use" in proc.stderr
    assert not (tmp_path / "kafka.pid").exists()


def _wait_gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_stop_pid_stops_only_the_named_process(tmp_path: Path) -> None:
    target = subprocess.Popen(["sleep", "300"])
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        pid_file = tmp_path / "x.pid"
        pid_file.write_text(f"{target.pid}\n")
        subprocess.run(["bash", str(SCRIPTS / "stop_pid.sh"), str(pid_file)], check=True, timeout=60)
        assert target.wait(timeout=30) == -signal.SIGTERM
        assert bystander.poll() is None
        assert not pid_file.exists()
        # A second stop (file gone) and a stale pid file are both harmless.
        subprocess.run(["bash", str(SCRIPTS / "stop_pid.sh"), str(pid_file)], check=True, timeout=60)
        pid_file.write_text(f"{target.pid}\n")
        subprocess.run(["bash", str(SCRIPTS / "stop_pid.sh"), str(pid_file)], check=True, timeout=60)
        assert bystander.poll() is None
    finally:
        for p in (target, bystander):
            p.kill()
            p.wait()


def test_watchdog_stops_server_when_owner_dies(tmp_path: Path) -> None:
    """REALPEERS_OWNER_PID: a killed test run must not leave a server behind."""
    owner = subprocess.Popen(["sleep", "300"])
    server = subprocess.Popen(["sleep", "300"])
    try:
        subprocess.run(
            ["bash", "-c", f'log() {{ :; }}; . "{SCRIPTS}/_lib.sh"; start_watchdog {owner.pid} {server.pid}'],
            check=True,
            timeout=30,
        )
        assert server.poll() is None  # the owner is alive: the server is left alone
        owner.kill()
        owner.wait()
        assert server.wait(timeout=30) == -signal.SIGTERM
    finally:
        for p in (owner, server):
            p.kill()
            p.wait()


def test_fixtures_fail_without_java(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No Java must FAIL the e2e tests with a clear message, never skip them."""
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no java, no mvn
    with pytest.raises(pytest.fail.Exception, match="`java` not found"):
        check_tools(f"oap-{OAP_VERSION}")
