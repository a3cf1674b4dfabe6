"""An export records the stream cut its snapshot contains, and the updater replays only what comes after it.

Real parts: the Kafka broker, ``embedgate export --stream-cut auto`` as a subprocess, serve-local replicas of the
export and the updater with a fresh consumer group. Rows published before the export deliberately differ from the
snapshot's (values the trainer has since overwritten in its tables): if the cut were ignored (by the exporter, or by
the updater starting the partitions at their beginning) they would be re-applied and the final state check fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas.deltas import delta_topic
from schemas.deployment import EmbeddingModel
from schemas.manifest import Manifest, stream_partition_key
from tests.support.kafka import Broker
from tests.updater.harness import eventually, running, updater_settings
from tests.updater.psmodel import lookup
from updater.apply import ShardWriter
from updater.producer import DeltaPublisher
from updater.replicas import Replica

pytestmark = pytest.mark.integration

_REPO = Path(__file__).resolve().parents[2]
_VOCAB = 64
_DIM = 4


def _keras_model(path: Path, name: str) -> None:
    """A tiny Keras model with one Embedding table ``item_emb``, saved in a subprocess (no TF in the test)."""
    script = textwrap.dedent(
        f"""
        import keras
        ids = keras.Input((), dtype="int64", name="item")
        vec = keras.layers.Identity(name="item_vec")(keras.layers.Embedding({_VOCAB}, {_DIM}, name="item_emb")(ids))
        out = keras.layers.Dense(1, activation="sigmoid", name="p")(vec)
        keras.Model(ids, out, name={name!r}).save({str(path)!r})
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, cwd=_REPO, timeout=300)


async def _end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[str, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return {stream_partition_key(tp.topic, tp.partition): off for tp, off in ends.items()}


async def test_export_records_the_stream_cut_and_the_updater_replays_only_after_it(
    kafka: Broker, unique: str, tmp_path: Path
) -> None:
    from tests.support.servers import serve_local

    name = f"cut_{unique}"
    topic = delta_topic(name)
    keys = np.arange(_VOCAB, dtype=np.int64)
    snapshot = (keys[:, None] + np.array([0.0, 0.25, 0.5, 0.75])).astype(
        np.float32
    )  # the trainer's table now
    # What the trainer will have published before the export: older values of keys 0..39 (its table moved on since).
    pre_keys = keys[:40]
    pre_values = -snapshot[:40] - 1.0
    # Published after the export: a quarter of those keys and 5 keys the snapshot does not have.
    post_keys = np.concatenate([keys[:40:4], np.arange(100, 105, dtype=np.int64)])
    post_values = (1000.0 + np.arange(len(post_keys))[:, None] + np.zeros(_DIM)).astype(np.float32)

    plan = Manifest.model_validate(  # what the export will describe: enough for the publisher
        {
            "model_name": name,
            "version": 1,
            "tables": [{"name": "item_emb", "dim": _DIM}],
            "sparse_features": [{"name": "item", "table": "item_emb"}],
            "partition": {"num_shards": 2},
            "entry": {"outputs": [{"name": "p", "shape": [1]}]},
        }
    )
    keras_path = tmp_path / "model.keras"
    await asyncio.to_thread(_keras_model, keras_path, name)
    decl = tmp_path / "decl.yaml"
    decl.write_text(
        yaml.safe_dump(
            {"model_name": name, "sparse": [{"name": "item", "table": "item_emb", "pooled": "item_vec"}]}
        )
    )
    np.savez(tmp_path / "item_emb.npz", keys=keys, vectors=snapshot)

    async with DeltaPublisher(kafka.bootstrap) as pub:  # the model's own topic, created with 4 partitions
        await pub.publish(plan, "item_emb", pre_keys, pre_values)
        newer = pre_values[::2] - 1.0  # a newer value of half of them, still before the cut
        await pub.publish(plan, "item_emb", pre_keys[::2], newer)
        partitions = await pub.partitions(topic)
    cut_expected = await _end_offsets(kafka.bootstrap, topic, partitions)

    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "embedgate",
        "export",
        "--model",
        str(keras_path),
        "--declaration",
        str(decl),
    ]
    cmd += ["--out", str(out), "--shards", "2", "--table", f"item_emb={tmp_path / 'item_emb.npz'}"]
    cmd += ["--no-self-check", "--stream-cut", "auto", "--bootstrap", kafka.bootstrap]
    done = await asyncio.to_thread(
        subprocess.run, cmd, cwd=_REPO, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr
    manifest = Manifest.load(out / name)
    assert manifest.stream_cut == cut_expected, "manifest.json records the end offsets at export time"
    assert manifest.stream_cut[f"{topic}:0"] > 0 and manifest.stream_cut[f"{topic}:1"] > 0
    assert "stream cut: " in done.stdout

    async with DeltaPublisher(kafka.bootstrap) as pub:
        await pub.publish(manifest, "item_emb", post_keys, post_values)

    all_keys = np.concatenate([keys, post_keys[-5:]])
    expected = np.concatenate([snapshot, np.zeros((5, _DIM), np.float32)])
    expected[post_keys[:-5]] = post_values[:-5]  # keys 0..63 sit at index = key
    expected[_VOCAB:] = post_values[-5:]

    with contextlib.ExitStack() as stack:
        ps = {f"{name}_ps_{s}": out / name / f"ps_{s}" for s in (0, 1)}
        server = await asyncio.to_thread(stack.enter_context, serve_local(ps))
        model = EmbeddingModel.model_validate(
            {
                "name": name,
                "manifest": str(out / name),
                "entry": server.target,
                "shards": [{"replicas": [server.target]}, {"replicas": [server.target]}],
            }
        )

        writer = ShardWriter([model], deadline_s=10.0, max_rows_per_call=1000)
        try:
            for s in (0, 1):  # before any write: every table of every replica sits at the cut
                reported = await writer.stream_position(Replica(server.target, name, s))
                assert reported == {"item_emb": manifest.stream_cut}, f"shard {s}: {reported}"
        finally:
            await writer.close()

        async def view() -> np.ndarray:
            from schemas.partition import shard_for

            got = np.full((len(all_keys), _DIM), np.nan, np.float32)
            owner = shard_for(all_keys, 2)
            for s in (0, 1):
                got[owner == s] = await asyncio.to_thread(
                    lookup, server.target, f"{name}_ps_{s}", manifest, "item_emb", all_keys[owner == s]
                )
            return got

        settings = updater_settings(kafka, None, unique, models=[model.model_dump(mode="json")], topics=None)
        async with running(settings) as upd:

            async def converged() -> bool:
                return bool(np.array_equal((await view())[_VOCAB:], expected[_VOCAB:]))

            await eventually(converged, timeout_s=60, what="the rows published after the cut")
            got = await view()
            for k, row, want in zip(all_keys.tolist(), got.tolist(), expected.tolist(), strict=True):
                assert row == want, (
                    f"key {k}: PS has {row}, expected {want} (snapshot, then rows after the cut)"
                )
            applied = upd.metrics.registry.get_sample_value(
                "embedgate_updater_rows_applied_total", {"model": name, "table": "item_emb", "op": "upsert"}
            )
            assert applied == len(post_keys), "only the rows published after the cut were applied"
            catchups = sum(
                upd.metrics.registry.get_sample_value(
                    "embedgate_updater_replica_catchups_total", {"model": name, "shard": str(s)}
                )
                or 0
                for s in (0, 1)
            )
            assert catchups == 0, "no replica was found behind: they start at the cut"
