"""``StreamRows`` publishes exactly the rows training changed, key by key, with SGD, Adam and Adagrad.

Every publish is checked against an independent full-table diff of snapshots taken after each batch, and the topic
is consumed back from the real broker: its newest row per key is the trained table's row, for exactly the keys whose
rows changed. Keys are the exporter's: row index for ``item_emb``, ``string_key`` / ``OOV_KEY`` for the
``StringLookup`` table, the bin for the ``Hashing`` table.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from gateway.lookup_mapping import OOV_KEY, string_key
from schemas.deltas import DeltaOp, decode_delta
from tests.support.kafka import Broker
from tests.train.conftest import Exported
from tests.train.tiny import CATS, build, examples

pytestmark = pytest.mark.integration

BATCH = 16
BATCHES = 5


def _key_of_row(table: str, row: int) -> int:
    if table == "cat_emb":
        return OOV_KEY if row == 0 else string_key(CATS[row - 1])
    return row  # item_emb: the id; tag_emb: the Hashing bin


def _full_diff(
    before: dict[str, np.ndarray], after: dict[str, np.ndarray]
) -> dict[str, dict[int, np.ndarray]]:
    """table -> key -> new row, for every row whose values differ (compared as floats, row by row)."""
    out: dict[str, dict[int, np.ndarray]] = {}
    for table, old in before.items():
        new = after[table]
        out[table] = {
            _key_of_row(table, r): new[r] for r in range(len(old)) if not np.array_equal(old[r], new[r])
        }
    return out


async def _consume(bootstrap: str, topic: str, idle_s: float = 3.0) -> list[Any]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    out: list[Any] = []
    try:
        last = time.monotonic()
        while time.monotonic() - last < idle_s:
            got = await consumer.getmany(timeout_ms=300)
            for recs in got.values():
                out.extend(decode_delta(r.value) for r in recs)
                last = time.monotonic()
    finally:
        await consumer.stop()
    return out


def _optimizer(name: str) -> Any:
    import keras

    return {
        "sgd": lambda: keras.optimizers.SGD(0.5),
        "adam": lambda: keras.optimizers.Adam(0.05),
        "adagrad": lambda: keras.optimizers.Adagrad(0.5),
    }[name]()


@pytest.mark.parametrize("opt", ["sgd", "adam", "adagrad"])
def test_publishes_exactly_the_changed_rows(
    opt: str, kafka: Broker, tiny_export: Exported, unique: str
) -> None:
    import keras

    from embedgate.train import StreamRows

    tables = ("item_emb", "cat_emb", "tag_emb")
    model = build()
    model.compile(optimizer=_optimizer(opt), loss="binary_crossentropy")
    snapshots: list[dict[str, np.ndarray]] = []

    def snap(*_: Any, **__: Any) -> None:
        snapshots.append({t: np.array(model.get_layer(t).embeddings.numpy()) for t in tables})

    topic = f"{unique}.deltas"
    stream = StreamRows(tiny_export.model_dir, kafka.bootstrap, every_n_batches=2, topic=topic, log_every=0)
    published: list[tuple[int, str, np.ndarray, np.ndarray]] = []
    real = stream.publisher.publish_keys

    def spy(table: str, keys: Any, values: Any, *, delete: bool = False) -> None:
        published.append((stream.publishes, table, np.asarray(keys).copy(), np.asarray(values).copy()))
        real(table, keys, values, delete=delete)

    stream.publisher.publish_keys = spy  # type: ignore[method-assign,unused-ignore]
    x, y = examples(BATCH * BATCHES, seed=1)
    recorder = keras.callbacks.LambdaCallback(on_train_begin=snap, on_train_batch_end=snap)
    with stream:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[stream, recorder])
    assert len(snapshots) == BATCHES + 1
    # publishes: after batches 2 and 4, at the epoch's end (batch 5), at the end of training (nothing left)
    bounds = [(0, 2), (2, 4), (4, 5), (5, 5)]
    assert stream.publishes == len(bounds)
    for k, (a, b) in enumerate(bounds):
        want = _full_diff(snapshots[a], snapshots[b])
        for table in tables:
            calls = [(keys, vals) for (p, t, keys, vals) in published if p == k and t == table]
            got = {int(key): row for keys, vals in calls for key, row in zip(keys, vals, strict=True)}
            assert sorted(got) == sorted(want[table]), (opt, k, table)
            for key, row in want[table].items():
                np.testing.assert_array_equal(got[key], row)
    assert any(want for want in _full_diff(snapshots[0], snapshots[-1]).values())

    # The optimizer's own side effects are rows too: with Adam, rows with no gradient in batches 3-4 still move.
    batch_items = [set(x["item"][i * BATCH : (i + 1) * BATCH].tolist()) for i in range(BATCHES)]
    second = {int(k) for (p, t, keys, _) in published if p == 1 and t == "item_emb" for k in keys}
    untouched = second - batch_items[2] - batch_items[3]
    if opt == "adam":
        assert untouched, "Adam moves rows without a gradient; they must be published"
    else:
        assert not untouched, f"{opt} moved rows without a gradient?"

    # Consumed back from the broker: the newest row per key is the trained row, for exactly the changed keys.
    deltas = asyncio.run(_consume(kafka.bootstrap, topic))
    newest: dict[str, dict[int, np.ndarray]] = {t: {} for t in tables}
    for d in deltas:
        assert d.op is DeltaOp.UPSERT and d.model == "tiny"
        assert d.values is not None
        for key, row in zip(d.ids.tolist(), d.values, strict=True):
            newest[d.table][key] = row
    final = _full_diff(snapshots[0], snapshots[-1])
    for table in tables:
        assert sorted(newest[table]) == sorted(final[table]), table
        for key, row in final[table].items():
            np.testing.assert_array_equal(newest[table][key], row)
    assert stream.publisher.stats().rows == sum(len(v) for v in _per_publish_counts(published))


def _per_publish_counts(published: list[tuple[int, str, np.ndarray, np.ndarray]]) -> list[np.ndarray]:
    return [keys for (_, _, keys, _) in published]
