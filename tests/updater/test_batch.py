"""updater.batch: shard split and last-wins coalescing, against a dict reference model (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.deltas import EmbeddingDelta
from schemas.partition import shard_for
from updater.apply import GroupKey
from updater.batch import GroupBuffer, coalesce, split_by_shard

DIM = 2


def test_split_by_shard_keeps_row_order_per_shard() -> None:
    ids = np.arange(50, dtype=np.int64)
    values = np.stack([ids, -ids], axis=1).astype(np.float32)
    delta = EmbeddingDelta(model="m", table="t", op="upsert", ids=ids, values=values, timestamp_ms=0)
    parts = split_by_shard(delta, 3)
    assert [p[0] for p in parts] == sorted({int(s) for s in shard_for(ids, 3)})
    for shard, s_ids, s_vals in parts:
        assert (shard_for(s_ids, 3) == shard).all()
        assert list(s_ids) == sorted(s_ids)  # original order kept
        assert s_vals is not None and (s_vals[:, 0] == s_ids).all()
    assert sum(len(p[1]) for p in parts) == 50


def test_coalesce_last_op_wins_in_arrival_order() -> None:
    chunks = [
        (np.array([1, 2, 3]), np.array([[1, 1], [2, 2], [3, 3]], np.float32)),
        (np.array([2]), None),  # delete 2
        (np.array([3, 1]), np.array([[30, 30], [10, 10]], np.float32)),
        (np.array([4, 4]), np.array([[4, 4], [44, 44]], np.float32)),  # within one chunk the last wins too
        (np.array([5]), None),
    ]
    up_ids, up_vals, del_ids = coalesce(chunks, DIM)
    assert up_ids.tolist() == [3, 1, 4]
    assert up_vals.tolist() == [[30, 30], [10, 10], [44, 44]]
    assert del_ids.tolist() == [2, 5]


def test_coalesce_empty() -> None:
    up_ids, up_vals, del_ids = coalesce([], DIM)
    assert up_ids.shape == (0,) and up_vals.shape == (0, DIM) and del_ids.shape == (0,)


ops = st.lists(
    st.tuples(
        st.lists(st.integers(0, 9), min_size=1, max_size=6),
        st.booleans(),  # True = upsert
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_group_buffer_matches_sequential_application(seq: list[tuple[list[int], bool]]) -> None:
    reference: dict[int, tuple[float, float] | None] = {}
    buf = GroupBuffer(key=GroupKey("m", 0, "t"), dim=DIM)
    counter = 0
    for i, (ids, upsert) in enumerate(seq):
        values = None
        if upsert:
            values = np.array([[counter + j, i] for j in range(len(ids))], np.float32)
            counter += len(ids)
        for j, k in enumerate(ids):
            reference[k] = None if values is None else (float(values[j, 0]), float(values[j, 1]))
        buf.add(np.array(ids, np.int64), values, timestamp_ms=i, record=i)
    group = buf.build()
    state: dict[int, tuple[float, float] | None] = {}
    for k in group.delete_ids.tolist():
        state[k] = None
    for k, row in zip(group.upsert_ids.tolist(), group.upsert_values.tolist(), strict=True):
        state[k] = (row[0], row[1])
    assert state == reference
    assert group.rows == len(reference)
    assert buf.records == list(range(len(seq)))


def test_absorb_appends_newer_rows_after_older() -> None:
    old = GroupBuffer(key=GroupKey("m", 0, "t"), dim=DIM)
    old.add(np.array([1]), np.array([[1, 1]], np.float32), 1, "r1")
    new = GroupBuffer(key=GroupKey("m", 0, "t"), dim=DIM)
    new.add(np.array([1]), np.array([[2, 2]], np.float32), 2, "r2")
    old.absorb(new)
    group = old.build()
    assert group.upsert_values.tolist() == [[2, 2]]
    assert old.records == ["r1", "r2"] and old.timestamps_ms == [1, 2]
