"""``replay_since`` / ``embedgate updater --replay-since WHEN``: parsing WHEN (units), and the one-command recovery of
rows a restarted PS replica lost (real Kafka broker, real serve-local restarted on the same port, key by key)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from schemas.deployment import EmbeddingModel
from schemas.updater_settings import UpdaterSettings, parse_replay_since
from tests.support.kafka import Broker
from tests.support.ports import free_port
from tests.updater.conftest import PsCluster
from tests.updater.harness import eventually, running, updater_settings
from tests.updater.test_consumer import DEFAULT, _assert_committed_to_end, _kill, _rows, _spawn_updater
from updater.consumer import replay_timestamp_ms
from updater.errors import ConfigError
from updater.producer import DeltaPublisher

NOW = datetime(2026, 11, 22, 4, 30, tzinfo=UTC).timestamp()


# -- parsing WHEN ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("when", "expected"),
    [
        ("2026-11-22T04:00:00Z", datetime(2026, 11, 22, 4, tzinfo=UTC).timestamp()),
        ("2026-11-22T04:00:00.250Z", datetime(2026, 11, 22, 4, tzinfo=UTC).timestamp() + 0.25),
        ("2026-11-22T06:00:00+02:00", datetime(2026, 11, 22, 4, tzinfo=UTC).timestamp()),
        ("2026-11-22T04:00:00", datetime(2026, 11, 22, 4, tzinfo=UTC).timestamp()),  # no offset: UTC
        (" 2026-11-22T04:00:00Z ", datetime(2026, 11, 22, 4, tzinfo=UTC).timestamp()),
        ("90s", NOW - 90),
        ("15m", NOW - 900),
        ("2h", NOW - 7200),
        ("1.5h", NOW - 5400),
        ("1d", NOW - 86400),
        ("0s", NOW),
        ("export", None),
    ],
)
def test_parse_replay_since(when: str, expected: float | None) -> None:
    assert parse_replay_since(when, now=NOW) == expected


@pytest.mark.parametrize(
    "bad",
    ["", "yesterday", "15", "15y", "-5m", "m", "2026-13-01T00:00:00Z", "Export", "1969-12-31T00:00:00Z"],
)
def test_bad_replay_since_rejected_naming_the_value(bad: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        parse_replay_since(bad, now=NOW)


def test_replay_since_setting_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    models = [
        {
            "kind": "embedding",
            "name": "m",
            "manifest": "/m",
            "entry": "127.0.0.1:1",
            "shards": [{"replicas": ["127.0.0.1:1"]}],
        }
    ]
    assert UpdaterSettings(models=models).replay_since is None
    assert UpdaterSettings(models=models, replay_since="15m").replay_since == "15m"
    with pytest.raises(ValidationError, match="replay_since 'soon'"):
        UpdaterSettings(models=models, replay_since="soon")
    monkeypatch.setenv("EMBEDGATE_REPLAY_SINCE", "export")
    assert UpdaterSettings(models=models, replay_since="15m").replay_since == "export"  # env over file
    monkeypatch.setenv("EMBEDGATE_REPLAY_SINCE", "2 hours")
    with pytest.raises(ValidationError, match="replay_since '2 hours'"):
        UpdaterSettings(models=models)


def _model(name: str, manifest: Path, shards: int) -> EmbeddingModel:
    return EmbeddingModel(
        name=name, manifest=manifest, entry="127.0.0.1:1", shards=[{"replicas": ["127.0.0.1:1"]}] * shards
    )


def test_export_is_the_oldest_newest_ps_version_mtime(tmp_path: Path) -> None:
    """Per model and shard the newest numeric version directory counts (9 < 10); the oldest of those wins."""
    mtimes = {"a/ps_0/9": 100, "a/ps_0/10": 5000, "a/ps_0/tmp": 1, "a/ps_1/1": 4000, "b/ps_0/3": 4500}
    for rel, mtime in mtimes.items():
        (tmp_path / rel).mkdir(parents=True)
        os.utime(tmp_path / rel, (mtime, mtime))
    (tmp_path / "b" / "manifest.json").write_text("{}")  # a manifest given as the file: its directory counts
    models = [_model("a", tmp_path / "a", 2), _model("b", tmp_path / "b" / "manifest.json", 1)]
    assert replay_timestamp_ms("export", models) == 4_000_000
    assert replay_timestamp_ms("export", models[1:]) == 4_500_000
    assert replay_timestamp_ms("90s", models, now=1000.0) == 910_000
    assert replay_timestamp_ms("1970-01-01T00:00:01Z", models) == 1000
    (tmp_path / "c" / "ps_0").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"replay_since 'export': model 'c': no PS version directory"):
        replay_timestamp_ms("export", [_model("c", tmp_path / "c", 1)])
    (tmp_path / "c" / "ps_0" / "1").mkdir()
    with pytest.raises(ConfigError, match=r"replay_since 'export': model 'c': cannot list .*ps_1"):
        replay_timestamp_ms("export", [_model("c", tmp_path / "c", 2)])


def test_cli_rejects_bad_replay_since_at_startup(tmp_path: Path) -> None:
    cfg = tmp_path / "updater.yaml"
    cfg.write_text(
        "models: [{kind: embedding, name: m, manifest: /nonexistent, entry: '127.0.0.1:1', shards: [{replicas: ['127.0.0.1:1']}]}]\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDGATE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "embedgate", "updater", "--config", str(cfg), "--replay-since", "last week"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--replay-since" in proc.stderr and "'last week'" in proc.stderr


# -- PS restart, then one command restores every streamed row ---------------------------------------------------------
_REPLAY_LINE = re.compile(r"replay since \S+: (\S+)\[(\d+)\] from offset (.+?) to (\d+)$", re.MULTILINE)


@pytest.mark.integration
async def test_replay_since_restores_rows_a_restarted_ps_lost(
    kafka: Broker, ps_cluster: PsCluster, unique: str, tmp_path: Path
) -> None:
    """Server D (the only replica of both shards) gets streamed rows; the updater commits them and stops; D restarts
    on the same port and shows its exported snapshot again; ``embedgate updater --replay-since <before the publish>``
    brings every key back to the last value published for it, checked key by key."""
    from tests.support.servers import serve_local

    port = free_port()
    d = f"127.0.0.1:{port}"
    d_models = {"emb_ps_0": ps_cluster.model_dir / "ps_0", "emb_ps_1": ps_cluster.model_dir / "ps_1"}
    targets = {0: [d], 1: [d]}
    model = ps_cluster.model_config()
    model["shards"] = [{"replicas": [d]}, {"replicas": [d]}]
    s = updater_settings(kafka, ps_cluster, unique, models=[model])
    exported = np.arange(10, 40, dtype=np.int64)  # rows [id, id, id, id] in the snapshot
    new = np.arange(9000, 9040, dtype=np.int64)  # not in the snapshot: the default row
    keys = np.concatenate([exported, new])
    snapshot = np.concatenate([np.repeat(exported[:, None], 4, 1), np.full((len(new), 4), DEFAULT)])
    want = np.stack([keys, np.ones(len(keys)), np.zeros(len(keys)), np.full(len(keys), 0.5)], 1)
    want = want.astype(np.float32)
    want[::2, 1] = 2  # overwritten by a second publish
    want[:5] = DEFAULT  # deleted (exported rows)
    want[-3:] = DEFAULT  # deleted (streamed rows)

    async def ps_has(values: np.ndarray) -> bool:
        return all(np.array_equal(v, values) for v in await _rows(ps_cluster, "item", keys, targets))

    with contextlib.ExitStack() as stack:
        server = await asyncio.to_thread(stack.enter_context, serve_local(d_models, port=port))
        since = datetime.now(UTC) - timedelta(seconds=1)  # before the first publish
        async with running(s), DeltaPublisher(kafka.bootstrap, topic=s["topics"][0]) as pub:
            first = want.copy()
            first[:, 1] = 1
            await pub.publish(ps_cluster.manifest, "item", keys, first)
            await pub.publish(ps_cluster.manifest, "item", keys[::2], want[::2])
            await pub.publish(ps_cluster.manifest, "item", np.concatenate([keys[:5], keys[-3:]]), delete=True)
            await eventually(lambda: ps_has(want), what="streamed rows on D")
        await _assert_committed_to_end(kafka, s)  # a plain restart would re-apply nothing

        server.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(server.proc.wait, 20) is not None
        await asyncio.to_thread(stack.enter_context, serve_local(d_models, port=port))
        for view in await _rows(
            ps_cluster, "item", keys, targets
        ):  # D reloaded its export: streamed rows lost
            assert np.array_equal(view, snapshot)

        when = since.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        proc = _spawn_updater(s, tmp_path, "replay", ["--replay-since", when])
        try:
            await eventually(lambda: ps_has(want), what="every row restored by the replay")
            for view in await _rows(ps_cluster, "item", keys, targets):
                for k, got, row in zip(keys.tolist(), view.tolist(), want.tolist(), strict=True):
                    assert got == row, f"key {k}: PS has {got}, last published {row}"
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(proc.wait, 30) == 0
        finally:
            _kill(proc)
    log = (tmp_path / "updater-replay.log").read_text()
    moves = {int(p): (was, int(to)) for t, p, was, to in _REPLAY_LINE.findall(log) if t == s["topics"][0]}
    assert sorted(moves) == [0, 1, 2, 3], log  # every partition of the first assignment
    # partitions holding records went back from the committed end to the first record (the topic is this test's)
    assert sum(was not in ("0", "none (uncommitted)") for was, _ in moves.values()) >= 2, log
    assert all(to == 0 for _, to in moves.values()), log
    await _assert_committed_to_end(kafka, s)
