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


def test_fetch_is_a_no_op_once_cached() -> None:
    import time

    from embedgate.devkafka import fetch_jars

    t0 = time.monotonic()
    libs = fetch_jars()
    assert time.monotonic() - t0 < 1.0
    assert any(libs.glob("kafka_2.13-3.9.1.jar")) and any(libs.glob("reload4j-*.jar"))


def test_cli_start_status_stop(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    from tests.support.ports import free_port

    def kafka(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "embedgate", "kafka", *args, "--workdir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    port, cport = free_port(), free_port()
    started = kafka("start", "--port", str(port), "--controller-port", str(cport), "--heap-mb", "256")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"listening on 127.0.0.1:{port}" in started.stdout
        pid = int((tmp_path / "broker.pid").read_text())
        assert kafka("status").returncode == 0
        again = kafka("start", "--port", str(port), "--controller-port", str(cport))
        assert again.returncode == 1 and f"already running (pid {pid}" in again.stdout
    finally:
        stopped = kafka("stop")
    assert stopped.returncode == 0 and f"stopped kafka broker pid {pid}" in stopped.stdout
    assert not (tmp_path / "broker.pid").exists()
    assert kafka("status").returncode == 3


def test_cluster_ids_never_start_with_a_dash() -> None:
    from embedgate.devkafka import _cluster_id

    ids = {_cluster_id() for _ in range(5000)}
    assert len(ids) == 5000
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
