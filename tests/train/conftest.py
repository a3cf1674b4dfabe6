"""Fixtures of the trainer-side tests: one real Kafka broker, and a tiny model with a plain table, a table behind a
``StringLookup`` and one behind ``Hashing``, exported once (tiny: TF training is CPU-heavy on shared machines)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from schemas.manifest import Manifest
from tests.support.kafka import Broker, kafka_broker

_counter = itertools.count()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with kafka_broker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture
def unique() -> str:
    """A name unique in the session, for topics and producer ids."""
    return f"t{next(_counter)}"


@dataclass(frozen=True)
class Exported:
    root: Path
    model_dir: Path
    manifest: Manifest


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    from embedgate.export.exporter import export_model
    from tests.train.tiny import DECLARATION, build

    root = tmp_path_factory.mktemp("tiny")
    result = export_model(build(), DECLARATION, root, num_shards=2)
    return Exported(root, result.model_dir, result.manifest)
