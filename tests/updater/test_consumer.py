"""The updater end to end against the real Kafka broker and real serve-local PS replicas (no mocks).

Every test uses its own topic, consumer group and id range, so they share the session's broker and PS servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from schemas.deltas import EmbeddingDelta, encode_delta, encode_delta_json, encode_hps
from schemas.partition import shard_for
from tests.support.kafka import Broker
from tests.support.ports import free_port
from tests.updater.conftest import PsCluster
from tests.updater.harness import eventually, running, updater_settings
from tests.updater.psmodel import lookup
from updater.consumer import Updater
from updater.producer import DeltaPublisher, message_key

pytestmark = pytest.mark.integration

_REPO = Path(__file__).resolve().parents[2]
DEFAULT = -1.0  # the item table's default_value


async def _rows(
    cluster: PsCluster, table: str, ids: np.ndarray, shard_targets: dict[int, list[str]] | None = None
) -> list[np.ndarray]:
    """Rows of ``ids`` as seen by every replica of their shards: one array per replica index (aligned to ids)."""
    m = cluster.manifest
    shards = shard_for(ids, m.num_shards)
    out = []
    for replica in range(2):
        view = np.full((len(ids), m.table(table).dim), np.nan, np.float32)
        for s in range(m.num_shards):
            targets = (shard_targets or {}).get(s, cluster.replicas(s))
            target = targets[min(replica, len(targets) - 1)]
            mask = shards == s
            if mask.any():
                view[mask] = await asyncio.to_thread(lookup, target, f"emb_ps_{s}", m, table, ids[mask])
        out.append(view)
    return out


def _sample(upd: Updater, name: str, labels: dict[str, str] | None = None) -> float:
    return upd.metrics.registry.get_sample_value(name, labels or {}) or 0.0


# -- publish -> visible -----------------------------------------------------------------------------------------------
async def test_published_rows_reach_every_replica(kafka: Broker, ps_cluster: PsCluster, unique: str) -> None:
    # 7 rows per Predict call: every group is written in several chunks
    s = updater_settings(
        kafka, ps_cluster, unique, batch={"max_messages": 512, "max_delay_ms": 10, "max_rows_per_call": 7}
    )
    ids = np.arange(1000, 1040, dtype=np.int64)
    values = np.random.default_rng(0).normal(size=(40, 4)).astype(np.float32)
    async with running(s) as upd:
        async with DeltaPublisher(kafka.bootstrap, topic=s["topics"][0]) as pub:
            res = await pub.publish(ps_cluster.manifest, "item", ids, values)
            assert res.rows == 40 and set(res.rows_per_shard) == {0, 1}
            await pub.publish(
                ps_cluster.manifest, "item", [3, 4], delete=True
            )  # exported rows 3 (shard 1), 4 (0)

        async def visible() -> bool:
            views = await _rows(ps_cluster, "item", ids)
            return all(np.array_equal(v, values) for v in views)

        await eventually(visible, what="published rows on every replica")

        async def deleted() -> bool:
            views = await _rows(ps_cluster, "item", np.array([3, 4]))
            return all((v == DEFAULT).all() for v in views)

        await eventually(deleted, what="deleted rows")
        assert (
            _sample(
                upd, "embedgate_updater_rows_applied_total", {"model": "emb", "table": "item", "op": "upsert"}
            )
            >= 40
        )
        assert (
            _sample(
                upd, "embedgate_updater_rows_applied_total", {"model": "emb", "table": "item", "op": "delete"}
            )
            >= 2
        )
        assert _sample(upd, "embedgate_updater_freshness_seconds_count", {"model": "emb"}) >= 2
        assert _sample(upd, "embedgate_updater_apply_latency_seconds_count", {"model": "emb"}) >= 2


# -- HPS format ----------------------------------------------------------------------------------------------------
async def test_hps_messages_are_applied(kafka: Broker, ps_cluster: PsCluster, unique: str) -> None:
    topic = "hps_et.emb.item"
    ids = np.arange(2000, 2010, dtype=np.int64)
    values = np.arange(40, dtype=np.float32).reshape(10, 4) / 8
    shards = shard_for(ids, 2)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"HCTR" + (16).to_bytes(4, "little"))  # beacon: ignored
        for shard in (0, 1):  # no key, as HPS sends; one shard's rows per message, in partition shard % 4
            mask = shards == shard
            await producer.send_and_wait(topic, encode_hps(ids[mask], values[mask]), partition=shard)
    finally:
        await producer.stop()
    s = updater_settings(
        kafka, ps_cluster, unique, hps_topic_pattern=r"hps_et\.emb\..*", metadata_max_age_ms=1000
    )
    async with running(s) as upd:

        async def visible() -> bool:
            return all(np.array_equal(v, values) for v in await _rows(ps_cluster, "item", ids))

        await eventually(visible, what="HPS rows")
        assert _sample(upd, "embedgate_updater_messages_total", {"kind": "hps"}) == 2
        assert _sample(upd, "embedgate_updater_messages_total", {"kind": "beacon"}) == 1

        # the publisher's HPS mode (what `embedgate publish --format hps` uses) while the updater runs
        later = np.arange(2010, 2030, dtype=np.int64)
        later_values = np.full((20, 4), 0.75, np.float32)
        async with DeltaPublisher(kafka.bootstrap) as pub:
            res = await pub.publish_hps(ps_cluster.manifest, "item", later, later_values)
        assert res.rows == 20 and res.messages == len(res.rows_per_shard)

        async def later_visible() -> bool:
            return all(np.array_equal(v, later_values) for v in await _rows(ps_cluster, "item", later))

        await eventually(later_visible, what="HPS rows from publish_hps")


# -- dead letters ------------------------------------------------------------------------------------------------------
def _delta(
    ids: list[int], values: Any, *, model: str = "emb", table: str = "item", ts: int = 1
) -> EmbeddingDelta:
    return EmbeddingDelta(
        model=model, table=table, op="upsert", ids=ids, values=np.asarray(values, np.float32), timestamp_ms=ts
    )


async def test_bad_messages_go_to_the_dead_letter_topic(
    kafka: Broker, ps_cluster: PsCluster, unique: str
) -> None:
    s = updater_settings(kafka, ps_cluster, unique)
    # every id below is on shard 0, so every message belongs in partition 0 (of 4)
    good1 = _delta([3000, 3003], [[1, 1, 1, 1], [2, 2, 2, 2]])
    good2 = _delta([3000, 3004], [[5, 5, 5, 5], [6, 6, 6, 6]])
    nan_ok = _delta([3008], [[np.nan, 1, 2]], table="user")  # the user table allows NaN
    bad_ids = [3011, 3012]
    assert (shard_for(np.array([3000, 3003, 3004, 3008, *bad_ids, 3013, 3014]), 2) == 0).all()
    valid = encode_delta(_delta(bad_ids, [[9, 9, 9, 9], [9, 9, 9, 9]]))
    bad: list[tuple[str, bytes]] = [
        ("bad_magic", b"NOPE" + valid[4:]),
        ("truncated", valid[:-3]),
        ("dim_mismatch", encode_delta(_delta(bad_ids, [[9] * 5, [9] * 5]))),
        ("unknown_model", encode_delta(_delta(bad_ids, [[9] * 4, [9] * 4], model="nosuch"))),
        ("unknown_table", encode_delta(_delta(bad_ids, [[9] * 4, [9] * 4], table="nosuch"))),
        ("nan_values", encode_delta(_delta(bad_ids, [[9, 9, 9, 9], [9, np.nan, 9, 9]]))),
        ("invalid_json", b'{"model": "emb", "table": "item", "op": "upsert", "ids": [3011], "values": [[1'),
        (
            "invalid_json",
            b'{"model": "emb", "table": "item", "op": "upsert", "ids": ["x"], "timestamp_ms": 1}',
        ),
    ]
    # a valid message in the wrong partition, what a producer hashing the key (librdkafka's default) can do: without
    # a timestamp only log order could place it (dead-lettered); with one, its version does (applied)
    misplaced = encode_delta(_delta([3013], [[7, 7, 7, 7]], ts=0))
    misplaced_versioned = encode_delta(_delta([3014], [[8, 8, 8, 8]], ts=2))
    key = message_key("emb", 0)  # all in partition 0: the good ones behind the bad ones must still pass
    topic = s["topics"][0]
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, encode_delta(good1), key=key, partition=0)
        for _, raw in bad:
            await producer.send_and_wait(topic, raw, key=key, partition=0)
        await producer.send_and_wait(topic, misplaced, key=key, partition=1)
        await producer.send_and_wait(topic, misplaced_versioned, key=key, partition=1)
        await producer.send_and_wait(topic, encode_delta_json(good2), key=key, partition=0)
        await producer.send_and_wait(topic, encode_delta(nan_ok), key=key, partition=0)
    finally:
        await producer.stop()
    async with running(s) as upd:
        expected = np.array([[5, 5, 5, 5], [2, 2, 2, 2], [6, 6, 6, 6]], np.float32)

        async def good_applied() -> bool:
            views = await _rows(ps_cluster, "item", np.array([3000, 3003, 3004]))
            return all(np.array_equal(v, expected) for v in views)

        await eventually(good_applied, what="good messages behind bad ones")

        async def all_dead() -> bool:
            return _sample(upd, "embedgate_updater_dead_letters_total", {"reason": "wrong_partition"}) == 1

        await eventually(all_dead, what="the misplaced message dead-lettered")

        async def versioned_applied() -> bool:
            views = await _rows(ps_cluster, "item", np.array([3014]))
            return all(np.array_equal(v, [[8, 8, 8, 8]]) for v in views)

        await eventually(versioned_applied, what="the versioned misplaced message applied")
        assert _sample(upd, "embedgate_updater_misplaced_messages_total", {"model": "emb"}) == 1
        user = (await _rows(ps_cluster, "user", np.array([3008])))[0]
        assert np.isnan(user[0, 0]) and user[0, 1:].tolist() == [1, 2]
        for view in await _rows(ps_cluster, "item", np.array([*bad_ids, 3013])):
            assert (view == DEFAULT).all(), "a bad message touched the PS"
        for reason in {r for r, _ in bad}:
            want = sum(1 for r, _ in bad if r == reason)
            assert _sample(upd, "embedgate_updater_dead_letters_total", {"reason": reason}) == want, reason

    got = await _read_all(kafka, s["dead_letter_topic"], f"{unique}-dlq-reader", len(bad) + 1)
    assert len(got) == len(bad) + 1
    wrong = [r for r in got if dict(r.headers)["embedgate.reason"] == b"wrong_partition"]
    assert len(wrong) == 1 and wrong[0].value == misplaced
    wrong_headers = {k: v.decode() for k, v in wrong[0].headers}
    assert wrong_headers["embedgate.partition"] == "1"
    assert "belong in partition 0 of 4" in wrong_headers["embedgate.error"]
    got = [r for r in got if r is not wrong[0]]
    got.sort(key=lambda r: int(dict(r.headers)["embedgate.offset"]))
    for rec, (reason, raw) in zip(got, bad, strict=True):
        headers = {k: v.decode() for k, v in rec.headers}
        assert headers["embedgate.reason"] == reason
        assert headers["embedgate.topic"] == topic
        assert headers["embedgate.error"]  # the human-readable problem
        assert rec.value == raw and rec.key == key


async def _read_all(kafka: Broker, topic: str, group: str, count: int) -> list[Any]:
    """The first ``count`` records of ``topic`` (fails naming what arrived if they do not within 30 s)."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest", group_id=group
    )
    await consumer.start()
    got: list[Any] = []
    try:

        async def enough() -> bool:
            for recs in (await consumer.getmany(timeout_ms=200)).values():
                got.extend(recs)
            return len(got) >= count

        await eventually(enough, what=f"{count} records on {topic}")
    finally:
        await consumer.stop()
    return got


# -- SIGKILL mid-stream ----------------------------------------------------------------------------------------------
def _spawn_updater(
    config: dict[str, Any], workdir: Path, tag: str, extra_args: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    cfg = workdir / "updater.yaml"
    cfg.write_text(yaml.safe_dump(config))
    log = open(workdir / f"updater-{tag}.log", "wb")  # noqa: SIM115 - closed below, the child keeps its copy
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDGATE_")}
        return subprocess.Popen(
            [sys.executable, "-m", "embedgate", "updater", "--config", str(cfg), *extra_args],
            cwd=_REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    finally:
        log.close()


def _kill(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def test_sigkill_mid_stream_then_restart_loses_nothing(
    kafka: Broker, ps_cluster: PsCluster, unique: str, tmp_path: Path
) -> None:
    """Random overwrites and deletes of 300 keys, then a sweep giving every key its final value one slice at a time;
    the updater process is SIGKILLed three times (mid-stream, and twice mid-sweep right after a slice was published)
    and restarted each time. Every key must end at the last value published for it, on every replica."""
    s = updater_settings(kafka, ps_cluster, unique, batch={"max_messages": 8, "max_delay_ms": 5})
    keys = np.arange(5000, 5300, dtype=np.int64)
    rng = random.Random(7)
    expected: dict[int, list[float] | None] = {}
    procs: list[subprocess.Popen[bytes]] = []

    def kill_and_restart() -> None:
        _kill(procs[-1], signal.SIGKILL)
        assert procs[-1].returncode == -signal.SIGKILL
        procs.append(_spawn_updater(s, tmp_path, f"run{len(procs)}"))

    async def applied(col: int, at_least: float) -> None:
        async def cond() -> bool:
            return bool((np.concatenate(await _rows(ps_cluster, "item", keys))[:, col] >= at_least).any())

        await eventually(cond, what=f"updater {len(procs) - 1} applying")

    try:
        procs.append(_spawn_updater(s, tmp_path, "run0"))
        async with DeltaPublisher(kafka.bootstrap, topic=s["topics"][0], max_rows_per_message=40) as pub:
            for rnd in range(20):  # phase 1: random overwrites and deletes
                chosen = np.array(sorted(rng.sample(range(len(keys)), 180)), dtype=np.int64)
                ids = keys[chosen]
                if rnd % 7 == 6:
                    await pub.publish(ps_cluster.manifest, "item", ids[:20], delete=True)
                    for k in ids[:20].tolist():
                        expected[k] = None
                else:
                    vals = np.stack([np.full(len(ids), rnd), ids, chosen, np.full(len(ids), 0.5)], 1)
                    await pub.publish(ps_cluster.manifest, "item", ids, vals.astype(np.float32))
                    for k, row in zip(ids.tolist(), vals.astype(np.float32).tolist(), strict=True):
                        expected[k] = row
                if rnd == 8:
                    await applied(3, 0.5)  # the first updater is really applying before it is killed
                if rnd == 12:
                    kill_and_restart()
                await asyncio.sleep(0.05)
            await applied(0, 13)  # the second updater is applying
            for j, part in enumerate(np.array_split(keys, 10)):  # phase 2: the final value of every key
                if j == 5:
                    await pub.publish(ps_cluster.manifest, "item", part, delete=True)
                    expected.update(dict.fromkeys(part.tolist()))
                else:
                    vals = np.stack(
                        [np.full(len(part), 100 + j), part, np.full(len(part), j), np.ones(len(part))], 1
                    )
                    await pub.publish(ps_cluster.manifest, "item", part, vals.astype(np.float32))
                    for k, row in zip(part.tolist(), vals.astype(np.float32).tolist(), strict=True):
                        expected[k] = row
                await asyncio.sleep(0.1)
                if j in (3, 7):
                    if j == 7:
                        await applied(0, 104)  # the third updater is applying
                    kill_and_restart()  # the slice just published may be fetched, half-written, uncommitted

        want = np.array([expected.get(k) or [DEFAULT] * 4 for k in keys.tolist()], np.float32)

        async def converged() -> bool:
            return all(np.array_equal(v, want) for v in await _rows(ps_cluster, "item", keys))

        await eventually(converged, timeout_s=60, what="final state after SIGKILLs + restarts")
        # key by key, on every replica: the last value published (or the default row after a delete)
        for view in await _rows(ps_cluster, "item", keys):
            for k, got, row in zip(keys.tolist(), view.tolist(), want.tolist(), strict=True):
                assert got == row, f"key {k}: PS has {got}, last published {row}"
    finally:
        for p in procs:
            _kill(p)


# -- a PS shard down for several seconds ----------------------------------------------------------------------------
async def test_ps_down_then_back_nothing_lost(kafka: Broker, ps_cluster: PsCluster, unique: str) -> None:
    """Server D is the only replica of shard 0 and the second replica of shard 1 (A is the first). D goes away while
    updates are published; the updater keeps them waiting (partitions paused, bounded retries), shard 1's healthy
    replica A is written meanwhile, and once D is back on the same port every update reaches it."""
    from tests.support.servers import serve_local

    port = free_port()
    d_models = {"emb_ps_0": ps_cluster.model_dir / "ps_0", "emb_ps_1": ps_cluster.model_dir / "ps_1"}
    d = f"127.0.0.1:{port}"
    a = ps_cluster.a.target
    ids = np.arange(7000, 7060, dtype=np.int64)
    shard1 = shard_for(ids, 2) == 1
    targets = {0: [d], 1: [a, d]}
    model = ps_cluster.model_config()
    model["shards"] = [{"replicas": targets[0]}, {"replicas": targets[1]}]
    with contextlib.ExitStack() as stack:
        server = await asyncio.to_thread(stack.enter_context, serve_local(d_models, port=port))
        s = updater_settings(kafka, ps_cluster, unique, models=[model])
        async with running(s) as upd, DeltaPublisher(kafka.bootstrap, topic=s["topics"][0]) as pub:
            v1 = np.full((60, 4), 1, np.float32)
            await pub.publish(ps_cluster.manifest, "item", ids, v1)

            async def at(values: np.ndarray) -> bool:
                return all(np.array_equal(v, values) for v in await _rows(ps_cluster, "item", ids, targets))

            await eventually(lambda: at(v1), what="rows before D goes down")

            server.proc.send_signal(
                signal.SIGTERM
            )  # D goes away: shard 0 has no replica, shard 1 has one left
            await asyncio.to_thread(server.proc.wait, 20)
            v2 = np.stack([np.full(60, 2), ids, np.zeros(60), np.ones(60)], 1).astype(np.float32)
            await pub.publish(ps_cluster.manifest, "item", ids, v2)  # published while D is down
            v3 = v2.copy()
            v3[::2, 0] = 3
            await pub.publish(ps_cluster.manifest, "item", ids[::2], v3[::2])

            def failures() -> float:
                return sum(
                    _sample(
                        upd,
                        "embedgate_updater_apply_failures_total",
                        {"model": "emb", "shard": sh, "retriable": "true"},
                    )
                    for sh in ("0", "1")
                )

            # several failed attempts: the writes wait and are retried, not dropped; what waits counts as lag
            async def retrying() -> bool:
                paused = _sample(upd, "embedgate_updater_paused_partitions") >= 1
                return failures() >= 3 and paused and await _lag(upd, s["topics"][0]) >= 2

            await eventually(
                retrying, what="failed writes retried while D is down, partitions paused, lag >= 2"
            )
            # (that the retries back off rather than spin is tests/updater/test_scheduler.py, without a stopwatch)
            # the healthy replica of shard 1 was written by the first attempt (v2; v3 may still wait in the paused
            # partition); nothing is committed until D has the rows too
            on_a = await asyncio.to_thread(lookup, a, "emb_ps_1", ps_cluster.manifest, "item", ids[shard1])
            assert (on_a[:, 0] >= 2).all() and np.array_equal(on_a[:, 1:], v2[shard1][:, 1:])

            # D back on the same port: it reloads the export from disk (v1 rows gone); the retried writes restore all
            await asyncio.to_thread(stack.enter_context, serve_local(d_models, port=port))
            await eventually(
                lambda: at(v3), timeout_s=40, what="every update on every replica after D returned"
            )
            await eventually(
                lambda: _zero(upd, "embedgate_updater_paused_partitions"), what="partitions resumed"
            )

            async def no_lag() -> bool:
                return await _lag(upd, s["topics"][0]) == 0

            await eventually(no_lag, what="lag back to 0")
        await _assert_committed_to_end(kafka, s)


async def _assert_committed_to_end(kafka: Broker, s: dict[str, Any]) -> None:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap, group_id=s["group_id"], enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = [
            TopicPartition(s["topics"][0], p) for p in range(4)
        ]  # the updater created it with 4 partitions
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            assert await consumer.committed(tp) == (ends[tp] or None), tp
    finally:
        await consumer.stop()


async def _zero(upd: Updater, name: str) -> bool:
    return _sample(upd, name) == 0


async def _lag(upd: Updater, topic: str) -> float:
    return sum(
        _sample(upd, "embedgate_updater_consumer_lag", {"topic": topic, "partition": str(p)})
        for p in range(4)
    )


def _scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


# -- graceful shutdown ---------------------------------------------------------------------------------------------
async def test_sigterm_finishes_commits_and_leaves(
    kafka: Broker, ps_cluster: PsCluster, unique: str, tmp_path: Path
) -> None:
    metrics_port = free_port()
    s = updater_settings(kafka, ps_cluster, unique, metrics_port=metrics_port)
    ids = np.arange(8000, 8100, dtype=np.int64)
    values = np.full((100, 4), 8, np.float32)
    proc = _spawn_updater(s, tmp_path, "graceful")
    try:
        async with DeltaPublisher(kafka.bootstrap, topic=s["topics"][0], max_rows_per_message=10) as pub:
            await pub.publish(ps_cluster.manifest, "item", ids, values)

        async def visible() -> bool:
            return all(np.array_equal(v, values) for v in await _rows(ps_cluster, "item", ids))

        await eventually(visible, what="rows applied by the subprocess updater")
        metrics = await asyncio.to_thread(_scrape, metrics_port)
        applied = re.search(
            r'embedgate_updater_rows_applied_total\{model="emb",op="upsert",table="item"\} (\S+)', metrics
        )
        assert applied is not None and float(applied.group(1)) >= 100
        for name in (
            "consumer_lag{",
            "apply_latency_seconds_bucket",
            "freshness_seconds_bucket",
            "commits_total",
        ):
            assert f"embedgate_updater_{name}" in metrics, name
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        _kill(proc)
    log = (tmp_path / "updater-graceful.log").read_text()
    assert "offsets committed, group left" in log

    await _assert_committed_to_end(kafka, s)


# -- startup checks --------------------------------------------------------------------------------------------------
def test_models_must_match_their_manifests(tmp_path: Path) -> None:
    from schemas.deployment import EmbeddingModel
    from tests.updater.test_producer import MANIFEST  # model "pemb", 3 shards
    from updater.consumer import load_models
    from updater.errors import ConfigError

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "manifest.json").write_text(MANIFEST.dumps())

    def model(name: str, shards: int, manifest: Path) -> EmbeddingModel:
        return EmbeddingModel(
            name=name, manifest=manifest, entry="127.0.0.1:1", shards=[{"replicas": ["127.0.0.1:1"]}] * shards
        )

    assert set(load_models([model("pemb", 3, tmp_path / "m")])) == {"pemb"}
    with pytest.raises(ConfigError, match="2 shards configured, the manifest has 3"):
        load_models([model("pemb", 2, tmp_path / "m")])
    with pytest.raises(ConfigError, match="describes model 'pemb'"):
        load_models([model("other", 3, tmp_path / "m")])
    with pytest.raises(ConfigError, match="cannot read manifest"):
        load_models([model("pemb", 3, tmp_path / "missing")])
