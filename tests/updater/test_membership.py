"""A second deployment cannot join a consumer group in use with another model list: the consumer subscription
decoder and the comparison (pure), then a real broker: updater A runs in group g, updater B (another model, same
group) exits 2 with one line naming the group and both topic lists, and A keeps applying."""

from __future__ import annotations

import asyncio
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from schemas.deltas import delta_topic
from schemas.manifest import Manifest
from tests.support.kafka import Broker
from tests.updater.conftest import PsCluster
from tests.updater.harness import eventually, running, updater_settings
from tests.updater.psmodel import lookup
from updater.membership import GroupMember, foreign_members, subscribed_topics
from updater.producer import DeltaPublisher

_REPO = Path(__file__).resolve().parents[2]


def _subscription(version: int, topics: list[str], tail: bytes = b"") -> bytes:
    """A ConsumerProtocolSubscription as Kafka clients write it (classic encoding)."""
    out = struct.pack(">hi", version, len(topics))
    for t in topics:
        raw = t.encode()
        out += struct.pack(">h", len(raw)) + raw
    return out + tail


@pytest.mark.parametrize(
    "tail",
    [
        b"",  # v0 without user data (some clients)
        struct.pack(">i", -1),  # v0: null user data
        struct.pack(">i", 2) + b"ud" + struct.pack(">i", 0),  # v1: user data, no owned partitions
        struct.pack(">i", -1) + struct.pack(">i", 0) + struct.pack(">i", 7) + struct.pack(">h", -1),  # v3
    ],
)
def test_subscribed_topics_of_every_version(tail: bytes) -> None:
    topics = ["embedgate.deltas.demo", "hps_et.demo.user", "ünïcode"]
    assert subscribed_topics(_subscription(3, topics, tail)) == tuple(topics)
    assert subscribed_topics(_subscription(0, [], tail)) == ()


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x00",
        _subscription(0, ["abc"])[:-1],
        struct.pack(">hi", 0, -2),
        b"\x00\x00\x00\x00\x00\x01\xff\xff",
    ],
)
def test_truncated_or_foreign_metadata_is_an_error(raw: bytes) -> None:
    with pytest.raises(ValueError, match="not a consumer subscription"):
        subscribed_topics(raw)


def test_foreign_members_compare_topic_sets_leaving_our_hps_pattern_out() -> None:
    ours = ["embedgate.deltas.a", "embedgate.deltas.b"]
    same = GroupMember("m1", "c", "/h", ("embedgate.deltas.b", "embedgate.deltas.a", "hps_et.a.t"))
    other = GroupMember("m2", "c", "/h", ("embedgate.deltas.c",))
    more = GroupMember("m3", "c", "/h", ("embedgate.deltas.a", "embedgate.deltas.b", "hps_et.c.t"))
    unknown = GroupMember("m4", "c", "/h", None)
    pattern = r"hps_et\.(?:a|b)\..*"
    assert foreign_members([same, other, more, unknown], ours, pattern) == [other, more]
    assert foreign_members([same], ours, None) == [
        same
    ]  # without a pattern, hps_et.a.t is a topic like any other


@pytest.mark.integration
async def test_second_deployment_with_another_model_in_the_same_group_is_refused(
    kafka: Broker, ps_cluster: PsCluster, unique: str, tmp_path: Path
) -> None:
    settings = updater_settings(kafka, ps_cluster, unique)
    group, topic = settings["group_id"], settings["topics"][0]
    other = Manifest.model_validate(
        {
            "model_name": f"other_{unique}",
            "version": 1,
            "tables": [{"name": "t", "dim": 2}],
            "sparse_features": [{"name": "f", "table": "t"}],
            "partition": {"num_shards": 1},
            "entry": {"outputs": [{"name": "p", "shape": [1]}]},
        }
    )
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "manifest.json").write_text(other.dumps())
    config_b = tmp_path / "b.yaml"
    config_b.write_text(
        yaml.safe_dump(
            {
                "models": [
                    {
                        "kind": "embedding",
                        "name": other.model_name,
                        "manifest": str(tmp_path / "other"),
                        "entry": "127.0.0.1:1",
                        "shards": [{"replicas": ["127.0.0.1:1"]}],
                    }
                ],
                "bootstrap_servers": kafka.bootstrap,
                "group_id": group,
                "dead_letter_topic": f"{unique}.dlq",
                "hps_topic_pattern": None,
                "create_topics": False,
                "metrics_port": 0,
                "log_level": "warning",  # stderr: only the refusal
            }
        )
    )
    keys = np.arange(15000, 15040, dtype=np.int64)
    values = np.repeat(keys[:, None], 4, axis=1).astype(np.float32) + 0.5
    async with running(settings) as a:

        async def a_owns_its_partitions() -> bool:
            return len(a.assignment()) > 0

        await eventually(a_owns_its_partitions, what="updater A owning its partitions")
        before = a.assignment()
        b = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "embedgate", "updater", "--config", str(config_b)],
            cwd=_REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert b.returncode == 2, b.stderr
        line = b.stderr.strip()
        assert "Traceback" not in b.stderr and len(line.splitlines()) == 1, b.stderr
        assert f"consumer group {group!r}" in line
        assert repr([delta_topic(other.model_name)]) in line, "our topics"
        assert repr([topic]) in line, "their topics"
        assert a.assignment() == before, "A kept its partitions: B never joined"

        async with DeltaPublisher(kafka.bootstrap, topic=topic) as pub:
            await pub.publish(ps_cluster.manifest, "item", keys, values)

        async def applied() -> bool:
            from schemas.partition import shard_for

            shards = shard_for(keys, 2)
            for s in (0, 1):
                got = await asyncio.to_thread(
                    lookup, ps_cluster.a.target, f"emb_ps_{s}", ps_cluster.manifest, "item", keys[shards == s]
                )
                if not np.array_equal(got, values[shards == s]):
                    return False
            return True

        await eventually(applied, what="A applying rows after B was refused")
