"""updater.resume without a broker: which replicas a partition concerns and where an uncommitted partition starts."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from aiokafka import TopicPartition

from schemas.deltas import delta_topic
from schemas.deployment import EmbeddingModel
from schemas.manifest import Manifest
from updater.errors import ShardUnavailable
from updater.replicas import Replica
from updater.resume import concerned_replicas, replica_start_offsets


def _model(name: str, shards: int, tables: tuple[str, ...] = ("t",)) -> tuple[EmbeddingModel, Manifest]:
    manifest = Manifest.model_validate(
        {
            "model_name": name,
            "version": 1,
            "tables": [{"name": t, "dim": 2} for t in tables],
            "sparse_features": [{"name": f"f_{t}", "table": t} for t in tables],
            "partition": {"num_shards": shards},
            "entry": {"outputs": [{"name": "p", "shape": [1]}]},
        }
    )
    config = EmbeddingModel.model_validate(
        {
            "name": name,
            "manifest": str(Path("/nowhere") / name),
            "entry": "e:1",
            "shards": [{"replicas": [f"{name}-{s}a:1", f"{name}-{s}b:1"]} for s in range(shards)],
        }
    )
    return config, manifest


MODELS = {"a": _model("a", 3, ("t", "u")), "b": _model("b", 2)}


def test_own_topic_concerns_only_its_model_and_the_shards_of_the_partition() -> None:
    got = concerned_replicas(
        delta_topic("a"), 1, 2, MODELS
    )  # shards 0..2 on 2 partitions: shard 1 -> partition 1
    assert got == [Replica("a-1a:1", "a", 1), Replica("a-1b:1", "a", 1)]
    got = concerned_replicas(delta_topic("a"), 0, 2, MODELS)
    assert {r.shard for r in got} == {0, 2} and {r.model for r in got} == {"a"}
    assert concerned_replicas(delta_topic("a"), 3, 4, MODELS) == []  # no shard lands there
    assert {r.model for r in concerned_replicas("hps_et.b.t", 0, 2, MODELS)} == {"b"}


def test_a_shared_topic_concerns_every_model() -> None:
    assert {(r.model, r.shard) for r in concerned_replicas("custom.deltas", 0, 2, MODELS)} == {
        ("a", 0),
        ("a", 2),
        ("b", 0),
    }


async def test_start_is_the_lowest_position_of_every_table_of_every_concerned_replica() -> None:
    key0, key1 = f"{delta_topic('a')}:0", f"{delta_topic('a')}:1"
    reports = {
        "a-0a:1": {"t": {key0: 40}, "u": {key0: 35}},
        "a-0b:1": {"t": {key0: 50}, "u": {key0: 50}},
        "a-2a:1": {"t": {key0: 60}, "u": {key0: 60}},
        "a-2b:1": {"t": {key0: 60}, "u": {key0: 60}},
        "a-1a:1": {"t": {key1: 7}, "u": {key1: 7}},
        "a-1b:1": {"t": {key1: 7}},  # table u has no position: -1
    }

    async def position(r: Replica) -> dict[str, dict[str, int]]:
        return reports[r.target]

    tps = [TopicPartition(delta_topic("a"), 0), TopicPartition(delta_topic("a"), 1)]
    got = await replica_start_offsets(tps, partitions=lambda t: 2, models=MODELS, position=position)
    assert got == {tps[0]: 35}  # partition 1 has a replica table without a position: reset policy


async def test_a_replica_that_does_not_answer_leaves_its_partitions_to_the_reset_policy() -> None:
    key = f"{delta_topic('b')}:0"

    async def position(r: Replica) -> dict[str, dict[str, int]]:
        if r.target == "b-0b:1":
            raise ShardUnavailable("down", target=r.target, code=grpc.StatusCode.UNAVAILABLE)
        return {"t": {key: 9, f"{delta_topic('b')}:1": 4}}

    tps = [TopicPartition(delta_topic("b"), 0), TopicPartition(delta_topic("b"), 1)]
    got = await replica_start_offsets(tps, partitions=lambda t: 2, models=MODELS, position=position)
    assert got == {tps[1]: 4}


async def test_unknown_partition_count_and_unexpected_errors() -> None:
    async def boom(r: Replica) -> dict[str, dict[str, int]]:
        raise RuntimeError("bug")

    tp = TopicPartition(delta_topic("b"), 0)
    assert await replica_start_offsets([tp], partitions=lambda t: 0, models=MODELS, position=boom) == {}
    with pytest.raises(RuntimeError, match="bug"):
        await replica_start_offsets([tp], partitions=lambda t: 2, models=MODELS, position=boom)
