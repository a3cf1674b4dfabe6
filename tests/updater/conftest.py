"""Session fixtures for the updater tests: one real Kafka broker per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.kafka import Broker, kafka_broker


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with kafka_broker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker
