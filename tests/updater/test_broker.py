"""The development broker: real produce/consume round trip through aiokafka."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from embedgate.devkafka import BrokerError, BrokerState, KafkaBroker
from tests.support.kafka import Broker

pytestmark = pytest.mark.integration


async def test_produce_consume_round_trip(kafka: Broker) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait("broker-smoke", b"hello", key=b"k")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        "broker-smoke", bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest", group_id="smoke"
    )
    await consumer.start()
    try:
        msg = await consumer.getone()
    finally:
        await consumer.stop()
    assert (msg.key, msg.value) == (b"k", b"hello")


def test_broker_life_cycle_misuse(tmp_path) -> None:  # type: ignore[no-untyped-def]
    b = KafkaBroker(tmp_path)
    assert b.state is BrokerState.NEW
    with pytest.raises(BrokerError, match="before start"):
        b.stop()


def test_running_broker_has_pid_file(kafka: Broker) -> None:
    assert kafka.pid_path.read_text().strip() == str(kafka.proc.pid)  # type: ignore[union-attr]
