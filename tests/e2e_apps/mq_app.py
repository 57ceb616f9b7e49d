"""A Flask app for the message-queue end-to-end tests (Gunicorn under ``swmp run``).

``/kafka?bootstrap=B&topic=T`` sends one record with kafka-python and
``/rabbitmq?url=U&queue=Q`` publishes one message with pika (a blocking connection), each
inside the request's trace; both answer ``"<worker pid> <trace id>"``. Clients are created
per request: nothing opened in the master is shared by forked workers.
"""

from __future__ import annotations

import os

from flask import Flask, request

import swmp

app = Flask(__name__)


@app.route("/kafka")
def kafka_send() -> str:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=request.args["bootstrap"])
    try:
        producer.send(request.args["topic"], b"order").get(timeout=30)
    finally:
        producer.close(timeout=10)
    return f"{os.getpid()} {swmp.trace_id()}"


@app.route("/rabbitmq")
def rabbitmq_publish() -> str:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(request.args["url"]))
    try:
        conn.channel().basic_publish("", request.args["queue"], b"order")
    finally:
        conn.close()
    return f"{os.getpid()} {swmp.trace_id()}"
