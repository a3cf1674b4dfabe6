"""The slab layout's own behaviour: slot reuse, growth, reserved ids, reduced precision, expiry, both layouts read back.

Signatures run as TF Serving runs them (TF1 Session, :class:`tests.export.tf1.Tf1Model`); the layout's internals
(capacity, free slots) are read from the same artifact loaded with ``tf.saved_model.load``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedgate.export.ps import read_ps_tables, write_ps_shard
from embedgate.export.slab import DELETED_KEY, EMPTY_KEY, MIN_GROWTH
from schemas.manifest import Manifest, PsLayout, TableSpec
from tests.export.tf1 import Tf1Model

DIM = 4


def _w(ids: Any, ts: Any = 0, seqs: Any = 0, *, values: np.ndarray | None = None) -> dict[str, np.ndarray]:
    ids = np.asarray(ids, np.int64)
    n = len(ids)
    feeds = {
        "ids": ids,
        "timestamps_ms": np.broadcast_to(np.asarray(ts, np.int64), (n,)).copy(),
        "seqs": np.broadcast_to(np.asarray(seqs, np.int64), (n,)).copy(),
        "stream_partitions": np.zeros(0, object),
        "stream_offsets": np.zeros(0, np.int64),
        "stream_expected": np.zeros(0, np.int64),
    }
    if values is not None:
        feeds["values"] = values
    return feeds


def _rows(ids: Any) -> np.ndarray:
    """A row that names its id: [id, id + 0.5, ...] (exact in float32 for small ids)."""
    ids = np.asarray(ids, np.int64)
    return (ids[:, None] + 0.5 * np.arange(DIM)[None, :]).astype(np.float32)


def _lookup(m: Tf1Model, ids: Any) -> np.ndarray:
    return m.run("lookup", {"t_ids": np.asarray(ids, np.int64)})["t_values"]


def test_model_of_random_writes_key_by_key(tmp_path: Path) -> None:
    """Random upserts and deletes with random versions, checked against a dict after every call."""
    spec = TableSpec(name="t", dim=DIM, default_value=-7.0)
    ids0 = np.arange(0, 40, dtype=np.int64)
    write_ps_shard(tmp_path / "1", [spec], {"t": (ids0, _rows(ids0))})
    # the model: id -> (version, row or None for a tombstone)
    state: dict[int, tuple[tuple[int, int], np.ndarray | None]] = {
        int(i): ((-1, -1), _rows([i])[0]) for i in ids0
    }
    rng = np.random.default_rng(7)
    m = Tf1Model(tmp_path / "1")
    try:
        for step in range(60):
            n = int(rng.integers(0, 300))
            ids = rng.integers(0, 3000 if step < 30 else 200, n)
            ts = rng.integers(0, 20, n)
            seqs = rng.integers(0, 3, n)
            upsert = rng.random() < 0.6
            values = (_rows(ids) + step * 1000).astype(np.float32)
            if upsert:
                m.run("upsert_t", _w(ids, ts, seqs, values=values))
            else:
                m.run("delete_t", _w(ids, ts, seqs))
            best: dict[int, int] = {}
            for k in range(n):
                i = int(ids[k])
                v = (int(ts[k]), int(seqs[k]))
                if i not in best or v >= (int(ts[best[i]]), int(seqs[best[i]])):
                    best[i] = k
            for i, k in best.items():
                v = (int(ts[k]), int(seqs[k]))
                if i not in state or v >= state[i][0]:
                    state[i] = (v, values[k] if upsert else None)
            probe = np.arange(0, 3000, dtype=np.int64)
            got = _lookup(m, probe)
            want = np.full((len(probe), DIM), -7.0, np.float32)
            for i, (_, row) in state.items():
                if row is not None:
                    want[i] = row
            np.testing.assert_array_equal(got, want, err_msg=f"step {step}")
            live = sum(1 for _, row in state.values() if row is not None)
            assert int(m.run("row_count", {})["t_rows"]) == live
    finally:
        m.close()


def test_deletes_free_slots_that_upserts_reuse_and_the_slab_grows_in_chunks(tmp_path: Path) -> None:
    import tensorflow as tf

    spec = TableSpec(name="t", dim=DIM)
    ids0 = np.arange(100, dtype=np.int64)
    write_ps_shard(tmp_path / "1", [spec], {"t": (ids0, _rows(ids0))})
    ps = tf.saved_model.load(str(tmp_path / "1"))

    def call(sig: str, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        return {
            k: v.numpy()
            for k, v in ps.signatures[sig](**{k: tf.constant(v) for k, v in feeds.items()}).items()
        }

    def capacity() -> int:
        return int(tf.shape(ps.slabs["t"])[0])

    assert capacity() == 100  # exactly the exported rows: no slack after load
    assert int(call("delete_t", _w(np.arange(30), 1))["applied"]) == 30
    assert int(ps.free_count["t"].numpy()) == 30
    new = np.arange(1000, 1030, dtype=np.int64)
    call("upsert_t", _w(new, 1, values=_rows(new)))
    assert capacity() == 100 and int(ps.free_count["t"].numpy()) == 0  # the 30 freed slots were reused
    assert int(ps.used["t"].numpy()) == 100
    more = np.arange(2000, 2001, dtype=np.int64)
    call("upsert_t", _w(more, 1, values=_rows(more)))
    assert capacity() == 100 + MIN_GROWTH  # one growth step, not one row
    big = np.arange(5000, 5000 + 2 * MIN_GROWTH, dtype=np.int64)
    call("upsert_t", _w(big, 1, values=_rows(big)))
    assert capacity() == 101 + 2 * MIN_GROWTH  # a write needing more than a step gets exactly what it needs
    everything = np.concatenate([np.arange(30, 100), new, more, big])
    np.testing.assert_array_equal(call("lookup", {"t_ids": everything})["t_values"], _rows(everything))
    assert int(call("row_count", {})["t_rows"]) == len(everything)


def test_a_lookup_that_resolved_an_id_before_its_slot_was_reused_answers_the_default_row() -> None:
    """The lock-free lookup (embedgate/export/slab.py docstring), step by step: an id's reference taken before a
    delete frees its slot and an upsert gives the slot to another id reads the default row, not the other id's;
    references taken after read the new rows; an in-place rewrite keeps a reference valid."""
    import tensorflow as tf

    from embedgate.export.slab import _module, _signatures, _Table

    spec = TableSpec(name="t", dim=DIM, default_value=-1.0)
    ids0 = np.arange(10, dtype=np.int64)
    ps = _module([spec], {"t": (ids0, _rows(ids0))})  # in memory: the test reads between the graph's steps
    sigs = _signatures(ps, [spec])
    tab = _Table(ps, spec)

    def call(sig: str, feeds: dict[str, np.ndarray]) -> None:
        names = [x.name for x in sigs[sig].input_signature]
        sigs[sig](*(tf.constant(feeds[n]) for n in names))

    def refs(ids: Any) -> Any:
        return tab.refs(tf.constant(np.asarray(ids, np.int64)))

    stale = refs([3, 4])  # exported rows: generation 0
    call("upsert_t", _w([4], 1, values=_rows([4]) + 100))  # in place: the same slot, the same generation
    np.testing.assert_array_equal(tab.read(stale).numpy(), np.stack([_rows([3])[0], _rows([4])[0] + 100]))
    call("delete_t", _w([3], 2))
    np.testing.assert_array_equal(tab.read(stale).numpy()[0], _rows([3])[0])  # freed, not reused: the old row
    call("upsert_t", _w([77], 3, values=_rows([77])))  # takes slot 3 with a new generation
    assert int(np.asarray(stale)[0]) == 3 and int(ps.owners["t"].numpy()[3]) != 0
    np.testing.assert_array_equal(tab.read(stale).numpy()[0], np.full(DIM, -1.0, np.float32))
    fresh = refs([3, 77])
    np.testing.assert_array_equal(tab.read(fresh).numpy(), np.stack([np.full(DIM, -1.0), _rows([77])[0]]))
    call("delete_t", _w([77], 4))
    call("upsert_t", _w([3], 5, values=_rows([3])))  # 3 again, in the same slot: yet another generation
    np.testing.assert_array_equal(tab.read(fresh).numpy(), np.full((2, DIM), -1.0, np.float32))
    looked = sigs["lookup"](tf.constant(np.array([3, 77], np.int64)))["t_values"].numpy()
    np.testing.assert_array_equal(looked, np.stack([_rows([3])[0], np.full(DIM, -1.0)]))


def test_reserved_ids_look_up_to_the_default_row_and_are_never_written(tmp_path: Path) -> None:
    spec = TableSpec(name="t", dim=DIM, default_value=3.0)
    write_ps_shard(tmp_path / "1", [spec], {"t": (np.array([0], np.int64), _rows([0]))})
    m = Tf1Model(tmp_path / "1")
    try:
        ids = [EMPTY_KEY, DELETED_KEY, 0]
        r = m.run("upsert_t", _w(ids, 5, values=np.ones((3, DIM), np.float32)))
        assert int(r["applied"]) == 1 and int(r["rows"]) == 1
        np.testing.assert_array_equal(_lookup(m, ids), [[3.0] * DIM, [3.0] * DIM, [1.0] * DIM])
        assert int(m.run("delete_t", _w([EMPTY_KEY], 9))["applied"]) == 0
    finally:
        m.close()
    with pytest.raises(ValueError, match="reserved"):
        write_ps_shard(tmp_path / "2", [spec], {"t": (np.array([EMPTY_KEY], np.int64), _rows([0]))})


@pytest.mark.parametrize("exported", [True, False], ids=["exported", "written"])
def test_reserved_ids_never_answer_the_row_of_the_largest_ordinary_id(tmp_path: Path, exported: bool) -> None:
    """The lookup searches the index for a reserved id as for DELETED_KEY - 1 (the hash tables refuse the
    sentinels): the row of that id, exported or written later, must not be answered for them."""
    spec = TableSpec(name="t", dim=DIM, default_value=3.0)
    top = DELETED_KEY - 1
    rows = (
        (np.array([0, top], np.int64), _rows([0, 1])) if exported else (np.array([0], np.int64), _rows([0]))
    )
    write_ps_shard(tmp_path / "1", [spec], {"t": rows})
    m = Tf1Model(tmp_path / "1")
    try:
        if not exported:
            assert int(m.run("upsert_t", _w([top], 5, values=_rows([1])))["applied"]) == 1
        np.testing.assert_array_equal(
            _lookup(m, [top, EMPTY_KEY, DELETED_KEY]), [_rows([1])[0], [3.0] * DIM, [3.0] * DIM]
        )
    finally:
        m.close()


def test_the_oov_key_of_lookup_tables_is_an_ordinary_id(tmp_path: Path) -> None:
    """-2**63 is the OOV row of every StringLookup / IntegerLookup table (gateway.lookup_mapping.OOV_KEY): it is
    exported, looked up, rewritten and deleted like any other id."""
    from gateway.lookup_mapping import OOV_KEY

    spec = TableSpec(name="t", dim=DIM, default_value=3.0)
    exported = np.array([OOV_KEY, 0, 7], np.int64)
    write_ps_shard(tmp_path / "1", [spec], {"t": (exported, _rows([1, 0, 7]))})
    m = Tf1Model(tmp_path / "1")
    try:
        np.testing.assert_array_equal(_lookup(m, [OOV_KEY, 7]), _rows([1, 7]))
        assert (
            int(m.run("upsert_t", _w([OOV_KEY], 5, values=np.full((1, DIM), 2.0, np.float32)))["applied"])
            == 1
        )
        np.testing.assert_array_equal(_lookup(m, [OOV_KEY]), [[2.0] * DIM])
        assert int(m.run("delete_t", _w([OOV_KEY], 9))["applied"]) == 1
        np.testing.assert_array_equal(_lookup(m, [OOV_KEY, 0]), [[3.0] * DIM, _rows([0])[0]])
    finally:
        m.close()


@pytest.mark.parametrize(("dtype", "tolerance"), [("float16", 2.0**-11), ("bfloat16", 2.0**-8)])
def test_reduced_precision_rows_answer_float32(tmp_path: Path, dtype: str, tolerance: float) -> None:
    spec = TableSpec(name="t", dim=DIM, row_dtype=dtype)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    ids = np.arange(50, dtype=np.int64)
    rows = rng.normal(size=(50, DIM)).astype(np.float32)
    write_ps_shard(tmp_path / "1", [spec], {"t": (ids, rows)})
    m = Tf1Model(tmp_path / "1")
    try:
        got = _lookup(m, ids)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, rows, rtol=tolerance, atol=0)
        m.run("upsert_t", _w([7], 1, values=np.full((1, DIM), 0.1, np.float32)))
        np.testing.assert_allclose(_lookup(m, [7]), np.full((1, DIM), 0.1), rtol=tolerance)
    finally:
        m.close()
    back = read_ps_tables([tmp_path / "1"], [spec])["t"]
    np.testing.assert_allclose(back[1], rows, rtol=tolerance)


def test_expire_removes_stale_rows_with_a_tombstone(tmp_path: Path) -> None:
    spec = TableSpec(name="t", dim=DIM, ttl_s=10)
    other = TableSpec(name="u", dim=2)
    ids0 = np.arange(5, dtype=np.int64)
    exported_at = 1_000_000
    write_ps_shard(
        tmp_path / "1",
        [spec, other],
        {"t": (ids0, _rows(ids0)), "u": (np.array([1], np.int64), np.ones((1, 2), np.float32))},
        written_ms=exported_at,
    )
    m = Tf1Model(tmp_path / "1")
    try:
        assert set(m.signatures["expire"].inputs) == {"now_ms"}
        assert set(m.signatures["expire"].outputs) == {"t_expired", "u_expired"}

        def expire(now: int) -> tuple[int, int]:
            out = m.run("expire", {"now_ms": np.int64(now)})
            return int(out["t_expired"]), int(out["u_expired"])

        def lookup(ids: list[int]) -> np.ndarray:
            return m.run("lookup", {"t_ids": np.array(ids, np.int64), "u_ids": np.zeros(0, np.int64)})[
                "t_values"
            ]

        assert expire(exported_at + 10_000) == (0, 0)  # exported rows count as written at export time
        # rows 1 and 2 are written later (producer timestamps), so they outlive the exported ones
        m.run("upsert_t", _w([1, 2], exported_at + 5_000, values=_rows([1, 2]) + 100))
        assert expire(exported_at + 10_001) == (3, 0)  # 0, 3, 4: no table without ttl_s loses a row
        assert int(m.run("row_count", {})["t_rows"]) == 2
        np.testing.assert_array_equal(lookup([0, 1]), np.vstack([np.zeros(DIM), _rows([1])[0] + 100]))
        # a late message older than the expiry cannot bring the row back; a newer one does
        late = m.run("upsert_t", _w([0], exported_at + 1, values=_rows([0])))
        assert int(late["applied"]) == 0
        assert int(m.run("upsert_t", _w([3], exported_at + 20_000, values=_rows([3])))["applied"]) == 1
        assert expire(exported_at + 15_001) == (2, 0)  # 1 and 2 (written at +5 000)
        np.testing.assert_array_equal(lookup([1, 3]), np.vstack([np.zeros(DIM), _rows([3])[0]]))
        assert int(m.run("row_count", {})["u_rows"]) == 1
    finally:
        m.close()


def test_hash_layout_takes_no_precision_or_ttl(tmp_path: Path) -> None:
    from embedgate.export.ps import ArtifactError

    with pytest.raises(ArtifactError, match="slab layout"):
        write_ps_shard(
            tmp_path / "1", [TableSpec(name="t", dim=2, row_dtype="float16")], {}, layout=PsLayout.HASH
        )


def test_read_ps_tables_reads_both_layouts(tmp_path: Path) -> None:
    spec = TableSpec(name="t", dim=DIM)
    ids = np.array([5, 1, 9], np.int64)
    for layout in PsLayout:
        write_ps_shard(tmp_path / layout.value, [spec], {"t": (ids, _rows(ids))}, layout=layout)
    for layout in PsLayout:
        keys, vals = read_ps_tables([tmp_path / layout.value], [spec])["t"]
        np.testing.assert_array_equal(keys, [1, 5, 9])
        np.testing.assert_array_equal(vals, _rows([1, 5, 9]))


def test_a_manifest_without_ps_layout_is_of_the_hash_layout() -> None:
    base = {
        "model_name": "m",
        "version": 1,
        "tables": [{"name": "t", "dim": 2}],
        "sparse_features": [{"name": "f", "table": "t"}],
        "partition": {"num_shards": 1},
        "entry": {"outputs": [{"name": "y", "shape": [1]}]},
    }
    assert Manifest.model_validate(base).ps_layout is PsLayout.HASH
    assert Manifest.model_validate({**base, "ps_layout": "slab"}).ps_layout is PsLayout.SLAB
    with pytest.raises(ValueError, match="need ps_layout 'slab'"):
        Manifest.model_validate({**base, "tables": [{"name": "t", "dim": 2, "ttl_s": 5}]})


def test_tombstones_survive_rewrites_and_deletes_of_many_ids(tmp_path: Path) -> None:
    """Large calls that re-create and delete the same ids again and again, against a model key by key. With a
    tombstone removed when its id was written again (TF's ``DenseHashTable.remove``), a later lookup of that id could
    find a stale older tombstone, and an older upsert resurrected a deleted row (seed 100 did at call 47)."""
    spec = TableSpec(name="t", dim=DIM, default_value=-1.0)
    pool = 2000
    exported = np.arange(0, pool, 2, dtype=np.int64)
    write_ps_shard(tmp_path / "1", [spec], {"t": (exported, _rows(exported))})
    newest: dict[int, tuple[tuple[int, int], bool]] = {int(i): ((-1, -1), True) for i in exported}
    values: dict[int, np.ndarray] = {
        int(i): r for i, r in zip(exported.tolist(), _rows(exported), strict=True)
    }
    rng = np.random.default_rng(100)
    m = Tf1Model(tmp_path / "1")
    try:
        for call in range(60):
            n = int(rng.integers(1, pool))
            ids = rng.integers(0, pool, n).astype(np.int64)
            ts = rng.integers(0, 1000, n).astype(np.int64)
            seqs = (np.arange(n) * 60 + call).astype(np.int64)  # unique versions
            rows = np.stack([ids, ts, seqs, ids], 1).astype(
                np.float32
            )  # [id, ts, seq, id]: names its write (DIM 4)
            upsert = bool(rng.random() < 0.65)
            if upsert:
                m.run("upsert_t", _w(ids, ts, seqs, values=rows))
            else:
                m.run("delete_t", _w(ids, ts, seqs))
            for j, (i, t_, s_) in enumerate(zip(ids.tolist(), ts.tolist(), seqs.tolist(), strict=True)):
                if i not in newest or (t_, s_) > newest[i][0]:
                    newest[i] = ((t_, s_), upsert)
                    if upsert:
                        values[i] = rows[j]
        probe = np.arange(pool, dtype=np.int64)
        got = _lookup(m, probe)
    finally:
        m.close()
    for i in probe.tolist():
        live = newest.get(i, ((-1, -1), False))[1]
        want = values[i] if live else np.full(DIM, -1.0, np.float32)
        np.testing.assert_array_equal(got[i], want, err_msg=f"id {i}")
