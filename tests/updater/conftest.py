"""Session fixtures for the updater tests: one real Kafka broker, a small PS-only model and serve-local replicas.

Replica layout of model ``emb`` (2 shards): server ``a`` serves ``emb_ps_0`` and ``emb_ps_1``; server ``b`` serves
``emb_ps_1`` again, so shard 1 has two replicas and every write must reach both. Tests share these servers, so each
test uses its own id range, topic and consumer group.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from schemas.manifest import Manifest
from tests.support.kafka import Broker, kafka_broker
from tests.updater.psmodel import build_ps_model

_counter = itertools.count()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with kafka_broker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@dataclass
class PsCluster:
    root: Path
    manifest: Manifest
    a: Any
    b: Any

    @property
    def model_dir(self) -> Path:
        return self.root / self.manifest.model_name

    def replicas(self, shard: int) -> list[str]:
        return [self.a.target] if shard == 0 else [self.a.target, self.b.target]

    def model_config(self, shard0: list[str] | None = None) -> dict[str, Any]:
        """The ``models:`` entry for the updater's settings (shard 0 may be redirected, e.g. to a server we stop)."""
        return {
            "kind": "embedding",
            "name": self.manifest.model_name,
            "manifest": str(self.model_dir),
            "entry": self.a.target,
            "shards": [{"replicas": shard0 or self.replicas(0)}, {"replicas": self.replicas(1)}],
        }


@pytest.fixture(scope="session")
def ps_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PsCluster]:
    from tests.support.servers import serve_local

    root = tmp_path_factory.mktemp("psmodel")
    manifest = build_ps_model(root)
    d = root / manifest.model_name
    with (
        serve_local({"emb_ps_0": d / "ps_0", "emb_ps_1": d / "ps_1"}) as a,
        serve_local({"emb_ps_1": d / "ps_1"}) as b,
    ):
        yield PsCluster(root, manifest, a, b)


@pytest.fixture
def unique() -> str:
    """A name unique in the session, for topics and consumer groups."""
    return f"t{next(_counter)}"
