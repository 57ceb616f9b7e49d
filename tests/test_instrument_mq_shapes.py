"""Message-queue clients called in unusual shapes behave as without the agent, against a real
Kafka broker."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from swmp.config import load
from swmp.tracing.context import new_local_span
from tests.instrumented import instrumented
from tests.realpeers import KafkaBroker, unique_name


class _Headers(list):  # type: ignore[type-arg]
    pass


@pytest.fixture(params=["native", "python"])
def form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """aiokafka's send wrapper in C (KafkaSend) or its Python reference, installed in a trace."""
    import aiokafka  # noqa: F401

    from swmp.instrument import aiokafka as instr

    with instrumented():
        if request.param == "python":
            instr.uninstall()
            monkeypatch.setattr(instr, "_KafkaSend", None)
            instr.install(load({}, agent_log_reporter_active=False))
        elif instr._KafkaSend is None:
            pytest.skip("no native core")
        yield request.param


@pytest.mark.parametrize("headers", [(("a", b"1"),), _Headers([("a", b"1")])], ids=["tuple", "list-subclass"])
def test_aiokafka_headers_it_refuses_are_refused_in_a_trace(
    kafka_broker: KafkaBroker, form: str, headers: Any
) -> None:
    """aiokafka's record builder takes headers as an exact list and refuses anything else with
    its TypeError; the agent's merge made a plain list of them and the record was sent."""
    from aiokafka import AIOKafkaProducer

    async def send() -> Any:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
        await producer.start()
        try:
            with new_local_span("caller"):
                return await producer.send(unique_name("t"), b"v", headers=headers)
        finally:
            await producer.stop()

    with pytest.raises(TypeError, match=f"Expected list, got {type(headers).__name__}"):
        asyncio.run(send())
