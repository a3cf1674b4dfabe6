"""``RowPublisher``: the buffer bound blocks (and is measured), a failure surfaces once as ``PublishError`` on the
next call and on ``flush``, rows go out by the model's keys; against a fake ``DeltaPublisher`` (unit) and the real
broker (integration: consumed back, broker killed and restarted mid-stream with no row lost)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from embedgate.train import PublishError, PublisherState, RowPublisher
from gateway.lookup_mapping import string_key
from schemas.deltas import decode_delta
from schemas.manifest import Manifest
from tests.support.kafka import Broker, restartable_broker
from updater.producer import KeyedTableError, PublishResult

MANIFEST = Manifest.model_validate(
    {
        "model_name": "rp",
        "version": 1,
        "tables": [{"name": "item", "dim": 4}],
        "sparse_features": [{"name": "item_id", "table": "item"}],
        "partition": {"num_shards": 2},
        "entry": {"outputs": [{"name": "p", "shape": [1]}]},
    }
)


class _FakePublisher:
    """Stands in for DeltaPublisher: ``gate`` holds every publish until set; ``fail`` makes the next one raise."""

    gate = threading.Event()
    fail: ClassVar[list[BaseException]] = []
    sent: ClassVar[list[tuple[str, list[int]]]] = []

    def __init__(self, bootstrap: str, **kwargs: Any) -> None:
        self.producer_id = kwargs.get("producer_id")

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def publish(
        self, manifest: Manifest, table: str, ids: Any, values: Any = None, **kw: Any
    ) -> PublishResult:
        while not self.gate.is_set():
            await asyncio.sleep(0.005)
        if self.fail:
            raise self.fail.pop()
        self.sent.append((table, np.asarray(ids).tolist()))
        res = PublishResult("t")
        res.messages = 1
        res.rows_per_shard = {0: len(np.atleast_1d(ids))}
        return res


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[_FakePublisher]:
    import embedgate.train.publisher as mod

    _FakePublisher.gate = threading.Event()
    _FakePublisher.fail = []
    _FakePublisher.sent = []
    monkeypatch.setattr(mod, "DeltaPublisher", _FakePublisher)
    return _FakePublisher


def test_full_buffer_blocks_the_trainer_and_counts_it(fake: type[_FakePublisher]) -> None:
    rows = np.ones((10, 4), np.float32)  # 10 ids (80 B) + 40 floats (160 B) = 240 B per call
    with RowPublisher(MANIFEST, "unused:1", max_pending_bytes=500) as pub:
        pub.publish("item", np.arange(10), rows)
        pub.publish("item", np.arange(10, 20), rows)  # 480 B pending: fits
        released = threading.Timer(0.3, fake.gate.set)
        released.start()
        pub.publish(
            "item", np.arange(20, 30), rows
        )  # would be 720 B: blocks until the first ones are acknowledged
        pub.flush(timeout=30)
        st = pub.stats()
    assert st.blocked_s > 0
    assert st.rows == 30 and st.calls == 3 and st.pending_rows == 0
    assert [ids for _, ids in fake.sent] == [list(range(10)), list(range(10, 20)), list(range(20, 30))]


def test_a_failure_surfaces_once_on_the_next_call_and_on_flush(fake: type[_FakePublisher]) -> None:
    fake.fail.append(TopicAuthorizationFailedError("not allowed"))  # not retriable
    pub = RowPublisher(MANIFEST, "unused:1")
    pub.publish("item", [1, 2], np.zeros((2, 4)))
    pub.publish("item", [3], np.zeros((1, 4)))
    fake.gate.set()
    with pytest.raises(
        PublishError, match=r"publishing 2 rows of table 'item' failed: TopicAuthorizationFailedError"
    ):
        pub.flush(timeout=30)
    assert pub.state is PublisherState.FAILED
    with pytest.raises(PublishError, match="failed"):
        pub.publish("item", [4], np.zeros((1, 4)))
    with pytest.raises(PublishError):
        pub.close()
    assert fake.sent == []  # nothing after the failed call was sent


def test_retriable_errors_are_retried(fake: type[_FakePublisher]) -> None:
    fake.fail.extend([KafkaConnectionError("down"), KafkaConnectionError("down")])
    fake.gate.set()
    with RowPublisher(MANIFEST, "unused:1", retry_s=60) as pub:
        pub.publish("item", [7], np.zeros((1, 4)))
        pub.flush(timeout=30)
        assert pub.stats().retries == 2
    assert fake.sent == [("item", [7])]


def test_bad_rows_are_refused_before_queueing(fake: type[_FakePublisher]) -> None:
    fake.gate.set()
    with RowPublisher(MANIFEST, "unused:1") as pub:
        with pytest.raises(ValueError, match="has dim 4, the values have 3 columns"):
            pub.publish("item", [1], np.zeros((1, 3)))
        with pytest.raises(ValueError, match="has no table 'nope'"):
            pub.publish("nope", [1], np.zeros((1, 4)))
        assert pub.stats().pending_rows == 0
    assert fake.sent == []


@pytest.mark.integration
def test_publish_by_model_keys_consumed_back(kafka: Broker, tiny_export: Any, unique: str) -> None:
    topic = f"{unique}.deltas"
    with RowPublisher(tiny_export.model_dir, kafka.bootstrap, topic=topic) as pub:
        with pytest.raises(KeyedTableError, match="'cat_77' \\(value 0\\) is not in the vocabulary"):
            pub.publish("cat_emb", ["cat_77"], np.zeros((1, 4)))
        with pytest.raises(KeyedTableError, match="expected a string"):
            pub.publish("cat_emb", [1], np.zeros((1, 4)))  # a raw id to a StringLookup table
        pub.publish("cat_emb", ["cat_02"], np.full((1, 4), 0.5))
        pub.publish("item_emb", np.arange(5), np.ones((5, 4)))
        pub.delete("item_emb", [3])
    got = asyncio.run(_consume(kafka.bootstrap, topic, 3))
    by_table = {(d.table, d.op.value): sorted(d.ids.tolist()) for d in got}
    assert by_table[("cat_emb", "upsert")] == [string_key("cat_02")]
    assert sorted(
        i for d in got if d.table == "item_emb" and d.op.value == "upsert" for i in d.ids.tolist()
    ) == list(range(5))
    assert [i for d in got if d.op.value == "delete" for i in d.ids.tolist()] == [3]


async def _consume(
    bootstrap: str, topic: str, count: int = 0, timeout_s: float = 60, ids: set[int] | None = None
) -> list[Any]:
    """The topic's deltas, read until ``count`` deltas, or every id of ``ids``, arrived (or ``timeout_s``)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    out: list[Any] = []
    missing = set(ids or ())
    try:
        deadline = time.monotonic() + timeout_s
        while (len(out) < count or missing) and time.monotonic() < deadline:
            for recs in (await consumer.getmany(timeout_ms=300)).values():
                for r in recs:
                    out.append(decode_delta(r.value))
                    missing.difference_update(out[-1].ids.tolist())
    finally:
        await consumer.stop()
    return out


@pytest.mark.integration
def test_broker_killed_and_restarted_loses_no_row(tmp_path: Path) -> None:
    """The trainer keeps publishing while the broker is SIGKILLed and restarted: calls block once the buffer is
    full, then resume; every row arrives (counted on the topic, key by key)."""
    topic = "kill.deltas"
    sent: list[int] = []
    with restartable_broker(tmp_path / "kafka") as broker:
        pub = RowPublisher(MANIFEST, broker.bootstrap, topic=topic, max_pending_bytes=64 * 1024, retry_s=300)
        stop = threading.Event()
        errors: list[BaseException] = []

        def train() -> None:
            i = 0
            try:
                while not stop.is_set() or i < 2000:
                    ids = np.arange(i, i + 20)
                    pub.publish("item", ids, np.full((20, 4), float(i), np.float32))
                    sent.extend(ids.tolist())
                    i += 20
                    time.sleep(0.002)
            except Exception as exc:  # noqa: BLE001  (surfaced by the test below)
                errors.append(exc)

        trainer = threading.Thread(target=train)
        trainer.start()
        time.sleep(1.0)
        broker.kill()
        time.sleep(2.0)
        blocked_before_restart = pub.stats().pending_rows
        broker.restart()
        time.sleep(1.0)
        stop.set()
        trainer.join(300)
        assert not trainer.is_alive() and not errors, errors
        pub.flush(timeout=300)
        st = pub.stats()
        pub.close()
        assert blocked_before_restart > 0  # the trainer's rows waited in the buffer while the broker was down
        got = asyncio.run(_consume(broker.bootstrap, topic, ids=set(sent), timeout_s=120))
    received = {i for d in got for i in d.ids.tolist()}
    assert received == set(sent), f"{len(set(sent) - received)} rows lost"
    assert st.rows >= len(sent) and st.blocked_s > 0


def test_metrics_count_rows_bytes_lag_and_blocked_time(fake: type[_FakePublisher]) -> None:
    import urllib.request

    from embedgate.train import TrainerMetrics

    metrics = TrainerMetrics()
    rows = np.ones((10, 4), np.float32)
    with RowPublisher(MANIFEST, "unused:1", max_pending_bytes=300, metrics=metrics) as pub:
        pub.publish("item", np.arange(10), rows)
        threading.Timer(0.2, fake.gate.set).start()
        pub.publish("item", np.arange(10, 20), rows)  # blocks until the first is acknowledged
        pub.flush(timeout=30)
    port = metrics.serve(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    finally:
        metrics.close()
    assert 'embedgate_trainer_rows_total{table="item"} 20.0' in text
    assert 'embedgate_trainer_bytes_total{table="item"} 480.0' in text
    assert "embedgate_trainer_publish_lag_seconds_count 2.0" in text
    assert "embedgate_trainer_pending_rows 0.0" in text
    blocked = metrics.registry.get_sample_value("embedgate_trainer_blocked_seconds_total")
    assert blocked is not None and blocked > 0
