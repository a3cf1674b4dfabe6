"""updater.batch: shard split and last-wins coalescing, against a dict reference model (hypothesis)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.deltas import EmbeddingDelta
from schemas.partition import shard_for
from updater.apply import GroupKey
from updater.batch import Chunk, GroupBuffer, coalesce, split_by_shard

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


def _chunk(ids: list[int], values: Any, ts: int = 0, seq: int = 0) -> Chunk:
    return Chunk(np.array(ids, np.int64), None if values is None else np.array(values, np.float32), ts, seq)


def test_coalesce_same_version_last_op_wins_in_arrival_order() -> None:
    chunks = [
        _chunk([1, 2, 3], [[1, 1], [2, 2], [3, 3]]),
        _chunk([2], None),  # delete 2
        _chunk([3, 1], [[30, 30], [10, 10]]),
        _chunk([4, 4], [[4, 4], [44, 44]]),  # within one chunk the last wins too
        _chunk([5], None),
    ]
    r = coalesce(chunks, DIM)
    assert r.upsert_ids.tolist() == [1, 3, 4]
    assert r.upsert_values.tolist() == [[10, 10], [30, 30], [44, 44]]
    assert r.delete_ids.tolist() == [2, 5]


def test_coalesce_newest_version_wins_whatever_the_arrival_order() -> None:
    chunks = [
        _chunk([1, 2], [[1, 1], [2, 2]], ts=200, seq=0),
        _chunk([1], [[9, 9]], ts=100, seq=5),  # older timestamp, arrived later: loses
        _chunk([2], None, ts=200, seq=1),  # same timestamp, later sequence: the delete wins
        _chunk([3], [[3, 3]], ts=50, seq=0),
        _chunk([3], None, ts=40, seq=9),  # an older delete does not remove a newer row
    ]
    r = coalesce(chunks, DIM)
    assert r.upsert_ids.tolist() == [1, 3] and r.upsert_values.tolist() == [[1, 1], [3, 3]]
    assert r.upsert_timestamps_ms.tolist() == [200, 50] and r.upsert_seqs.tolist() == [0, 0]
    assert r.delete_ids.tolist() == [2]
    assert (r.delete_timestamps_ms.tolist(), r.delete_seqs.tolist()) == ([200], [1])


def test_coalesce_empty() -> None:
    r = coalesce([], DIM)
    assert r.upsert_ids.shape == (0,) and r.upsert_values.shape == (0, DIM) and r.delete_ids.shape == (0,)


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
    assert group.row_count == len(reference)
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


versioned_ops = st.lists(
    st.tuples(
        st.lists(st.integers(0, 6), min_size=1, max_size=5),
        st.booleans(),  # True = upsert
        st.integers(0, 3),  # timestamp
        st.integers(0, 2),  # sequence
    ),
    min_size=1,
    max_size=12,
)


_Row = tuple[tuple[int, int], tuple[float, float] | None]


def _store(store: dict[int, _Row], k: int, version: tuple[int, int], row: tuple[float, float] | None) -> None:
    if k not in store or version >= store[k][0]:
        store[k] = (version, row)


def _applied(r: Any) -> dict[int, _Row]:
    """A newest-wins store after the built group's deletes and upserts."""
    state: dict[int, _Row] = {}
    for k, t, q in zip(
        r.delete_ids.tolist(), r.delete_timestamps_ms.tolist(), r.delete_seqs.tolist(), strict=True
    ):
        _store(state, k, (t, q), None)
    for k, row, t, q in zip(
        r.upsert_ids.tolist(),
        r.upsert_values.tolist(),
        r.upsert_timestamps_ms.tolist(),
        r.upsert_seqs.tolist(),
        strict=True,
    ):
        _store(state, k, (t, q), (row[0], row[1]))
    return state


@settings(max_examples=200, deadline=None)
@given(versioned_ops)
def test_group_buffer_matches_a_newest_wins_store(seq: list[tuple[list[int], bool, int, int]]) -> None:
    """Applying the built group to a newest-wins store equals applying every chunk one by one to it."""
    reference: dict[int, _Row] = {}
    buf = GroupBuffer(key=GroupKey("m", 0, "t"), dim=DIM)
    for i, (ids, upsert, ts, sq) in enumerate(seq):
        values = np.array([[i, j] for j in range(len(ids))], np.float32) if upsert else None
        for j, k in enumerate(ids):
            _store(reference, k, (ts, sq), None if values is None else (float(i), float(j)))
        buf.add(np.array(ids, np.int64), values, timestamp_ms=ts, record=i, sequence=sq)
    assert _applied(buf.build().rows) == reference


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=40, unique=True),
    st.lists(
        st.tuples(st.integers(1, 8), st.booleans(), st.integers(0, 3), st.integers(0, 2)),
        min_size=1,
        max_size=8,
    ),
)
def test_group_buffer_without_repeated_ids_matches_a_newest_wins_store(
    ids: list[int], cuts: list[tuple[int, bool, int, int]]
) -> None:
    """The no-repeat fast paths (bulk upserts, upserts mixed with deletes, one chunk or many) keep arrival order."""
    reference: dict[int, _Row] = {}
    buf = GroupBuffer(key=GroupKey("m", 0, "t"), dim=DIM)
    pos = 0
    for i, (size, upsert, ts, sq) in enumerate(cuts):
        part = ids[pos : pos + size]
        if not part:
            break
        pos += size
        values = np.array([[i, j] for j in range(len(part))], np.float32) if upsert else None
        for j, k in enumerate(part):
            _store(reference, k, (ts, sq), None if values is None else (float(i), float(j)))
        buf.add(np.array(part, np.int64), values, timestamp_ms=ts, record=i, sequence=sq)
    r = buf.build().rows
    assert _applied(r) == reference
    arrival = [k for k in ids if k in reference]
    assert r.upsert_ids.tolist() + r.delete_ids.tolist() == [
        k for k in arrival if reference[k][1] is not None
    ] + [k for k in arrival if reference[k][1] is None]


def test_one_bulk_chunk_is_passed_through_without_a_copy() -> None:
    """A group of one message's rows (no repeats, upserts): the write sends views of the decoded message."""
    ids = np.arange(1000, dtype=np.int64)
    values = np.ones((1000, DIM), np.float32)
    r = coalesce([Chunk(ids, values, 5, 1)], DIM)
    assert np.shares_memory(r.upsert_ids, ids) and np.shares_memory(r.upsert_values, values)
    assert r.upsert_timestamps_ms.tolist() == [5] * 1000 and r.upsert_seqs.tolist() == [1] * 1000
    many = coalesce([Chunk(ids[:500], values[:500]), Chunk(ids[500:], values[500:])], DIM)
    assert many.upsert_ids.tolist() == ids.tolist() and many.upsert_values.shape == (1000, DIM)


def test_split_by_shard_of_a_one_shard_delta_returns_its_own_arrays() -> None:
    ids = np.arange(200, dtype=np.int64)
    ids = ids[shard_for(ids, 4) == 3]
    delta = EmbeddingDelta(
        model="m",
        table="t",
        op="upsert",
        ids=ids,
        values=np.zeros((len(ids), DIM), np.float32),
        timestamp_ms=0,
    )
    ((shard, s_ids, s_vals),) = split_by_shard(delta, 4)
    assert shard == 3 and s_ids is delta.ids and s_vals is delta.values
