"""The RabbitMQ fixture: a private real broker that routes messages and stops without leftovers."""

from __future__ import annotations

from pathlib import Path

import pika

from tests.brokers import RabbitMQBroker, _alive, start_rabbitmq
from tests.realpeers import unique_name


def test_broker_routes_a_message(rabbitmq: RabbitMQBroker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq.url))
    try:
        ch = conn.channel()
        queue = unique_name("q")
        ch.queue_declare(queue, auto_delete=True)
        ch.basic_publish("", queue, b"hello", pika.BasicProperties(headers={"k": "v"}))
        _method, props, body = ch.basic_get(queue, auto_ack=True)
        assert body == b"hello"
        assert props.headers == {"k": "v"}
    finally:
        conn.close()
    # A private node: its own name, its data in the fixture's temporary directory.
    env = Path(f"/proc/{rabbitmq.pid}/environ").read_text().split("\0")
    assert f"RABBITMQ_NODENAME=swmp-test-{rabbitmq.port}@localhost" in env
    assert (rabbitmq.dir / "mnesia").is_dir()


def test_stop_leaves_no_process_and_no_directory() -> None:
    d = start_rabbitmq()
    try:
        vm = d.vm_pid
        assert vm is not None and _alive(vm)
        pids = [vm, d.pid, d.epmd.pid]
    finally:
        d.stop()
    assert not [p for p in pids if _alive(p)]
    assert not d.dir.exists() and not d.epmd.dir.exists()
