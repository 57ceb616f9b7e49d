"""Web request -> message queue -> consumer process, as one trace in a real SkyWalking OAP.

A Flask app under ``swmp run -- gunicorn`` (2 sync workers, gRPC) sends a message per
request, to the real Kafka broker (kafka-python) or the real RabbitMQ (pika); a separate
consumer process under ``swmp run`` (another service) reads them. Read back through the
OAP's GraphQL API, each request's trace holds the web worker's segment (Flask entry span,
MQ exit span) and the consumer's segment (MQ entry span) from a different service and
instance, linked by a CrossProcess ref to the producer's exit span.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.brokers import RabbitMQBroker
from tests.oap_graphql import Span, wait_for
from tests.realpeers import KafkaBroker, OapServer, free_ports, unique_name
from tests.servers import SWMP_RUN, Proc, agent_env, gunicorn_command, run_server
from tests.servers import request as http_get

pytestmark = [pytest.mark.e2e, pytest.mark.servers, pytest.mark.timeout(240)]

MESSAGES = 3
WORKERS = 2
DATA_TIMEOUT = 90.0


def _consume(tmp: Path, env: dict[str, str], args: list[str]) -> None:
    proc = Proc(
        [*SWMP_RUN, sys.executable, "-m", "tests.e2e_apps.mq_consumer", *args], env, tmp / "consumer.log"
    )
    proc.start()
    try:
        code = proc.wait_exit(120)
        assert code == 0, f"consumer exited with {code}:\n{proc.tail()}"
        assert f"consumed {MESSAGES}" in proc.log(), proc.tail()
    finally:
        proc.stop()


@pytest.mark.parametrize("mq", ["kafka", "rabbitmq"])
def test_one_trace_across_web_queue_and_consumer(
    mq: str, oap_server: OapServer, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    web, consumer = unique_name(f"e2e-{mq}-web"), unique_name(f"e2e-{mq}-consumer")
    name = unique_name("mq")
    extra = {"SW_AGENT_PROTOCOL": "grpc"}
    web_env = agent_env(tmp_path / "web", oap_server.grpc, service=web, extra=extra)
    consumer_env = agent_env(tmp_path / "consumer", oap_server.grpc, service=consumer, extra=extra)
    if mq == "kafka":
        kafka_broker: KafkaBroker = request.getfixturevalue("kafka_broker")  # started only when needed
        path = f"/kafka?bootstrap={kafka_broker.bootstrap}&topic={name}"
        consumer_args = ["kafka", kafka_broker.bootstrap, name, "group-1", str(MESSAGES)]
        producer_op, consumer_op = f"Kafka/{name}/Producer", f"Kafka/{name}/Consumer/group-1"
        components = ("kafka-producer", "kafka-consumer")
        broker = kafka_broker.bootstrap
    else:
        import pika

        rabbitmq: RabbitMQBroker = request.getfixturevalue("rabbitmq")
        conn = pika.BlockingConnection(pika.URLParameters(rabbitmq.url))
        try:
            conn.channel().queue_declare(name)
        finally:
            conn.close()
        path = f"/rabbitmq?url={rabbitmq.url}&queue={name}"
        consumer_args = ["rabbitmq", rabbitmq.url, name, str(MESSAGES)]
        producer_op = f"RabbitMQ/Topic//Queue/{name}/Producer"
        consumer_op = f"RabbitMQ/Topic//Queue/{name}/Consumer"
        components = ("rabbitmq-producer", "rabbitmq-consumer")
        broker = f"{rabbitmq.host}:{rabbitmq.port}"

    port = free_ports(1)[0]
    cmd = gunicorn_command(port, app="tests.e2e_apps.mq_app:app", workers=WORKERS)
    with run_server("gunicorn", tmp_path, cmd, web_env, port=port, workers=WORKERS, name=web) as srv:
        results = [http_get(srv.port, path) for _ in range(MESSAGES)]
        assert [r.status for r in results] == [200] * MESSAGES, (results, srv.proc.tail())
    trace_ids = [r.body.decode().split()[1] for r in results]
    assert len(set(trace_ids)) == MESSAGES and all(trace_ids)

    _consume(tmp_path, consumer_env, consumer_args)

    q = oap_server.query
    for trace_id in trace_ids:

        def both(trace_id: str = trace_id) -> list[Span] | None:
            spans = q.trace(trace_id)
            return spans if {s.service_code for s in spans} == {web, consumer} else None

        spans = wait_for(both, DATA_TIMEOUT, what=f"trace {trace_id} with segments of {web} and {consumer}")
        web_spans = [s for s in spans if s.service_code == web]
        consumer_spans = [s for s in spans if s.service_code == consumer]
        assert {s.segment_id for s in web_spans} != {s.segment_id for s in consumer_spans}
        assert (
            len({s.segment_id for s in web_spans}) == 1 and len({s.segment_id for s in consumer_spans}) == 1
        )

        assert sorted((s.type, s.layer, s.component, s.operation_name) for s in web_spans) == [
            ("Entry", "Http", "Flask", path.split("?")[0]),
            ("Exit", "MQ", components[0], producer_op),
        ]
        exit_span = next(s for s in web_spans if s.type == "Exit")
        assert exit_span.peer == broker
        assert exit_span.tags.get("mq.broker") == broker

        [entry] = consumer_spans
        assert (entry.type, entry.layer, entry.component, entry.operation_name) == (
            "Entry",
            "MQ",
            components[1],
            consumer_op,
        )
        assert entry.tags.get("mq.broker") == broker
        assert entry.service_instance_name != exit_span.service_instance_name
        assert [(r.type, r.trace_id, r.parent_segment_id, r.parent_span_id) for r in entry.refs] == [
            ("CROSS_PROCESS", trace_id, exit_span.segment_id, exit_span.span_id)
        ]
