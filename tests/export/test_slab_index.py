"""The slab layout's index of exported ids (a fence of every FENCE_BLOCK-th key, then a search within one block), and
artifacts of the layout exported before the fence existed.

``data/slab_before_fence`` is one PS shard written by ``write_ps_shard`` at commit a3de037 (the build before the
fence: unpadded ``keys``, no ``fence`` variable, one search over all keys): table ``t``, dim 4, default row -1,
exported ids 3, 9, 12, 40, 41, 100 with rows ``[id, id + 0.5, id + 1, id + 1.5]``, stream cut ``deltas:0`` = 5."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from embedgate.export.ps import read_ps_tables, write_ps_shard
from embedgate.export.slab import DELETED_KEY, EMPTY_KEY, FENCE_BLOCK
from schemas.manifest import TableSpec
from tests.export.test_slab import DIM, _rows, _w
from tests.export.tf1 import Tf1Model

_OLD = Path(__file__).parent / "data" / "slab_before_fence"
_OLD_IDS = np.array([3, 9, 12, 40, 41, 100], np.int64)


@pytest.mark.parametrize("n", [0, 1, FENCE_BLOCK - 1, FENCE_BLOCK, FENCE_BLOCK + 1, 3 * FENCE_BLOCK + 5])
def test_every_exported_id_is_found_and_every_other_misses_at_block_boundaries(n: int) -> None:
    """Sparse exported ids (negatives and the largest ordinary id included) around multiples of the block size;
    probes: every exported id, each one's neighbours, the extremes and the reserved ids."""
    import tensorflow as tf

    from embedgate.export.slab import _module, _Table

    rng = np.random.default_rng(n)
    ids = (np.unique(rng.integers(-(2**40), 2**40, 4 * n + 8)) * 3)[:n]  # sorted, gaps of at least 3
    if n >= 2:
        ids[0], ids[-1] = np.iinfo(np.int64).min, DELETED_KEY - 1  # the smallest and the largest ordinary id
    ids = rng.permutation(ids)
    spec = TableSpec(name="t", dim=DIM, default_value=-1.0)
    tab = _Table(_module([spec], {"t": (ids, np.zeros((n, DIM), np.float32))}), spec)
    keys = tab.keys.numpy()
    assert len(keys) % FENCE_BLOCK == 0 and len(keys) > n and np.all(keys[n:] == EMPTY_KEY)
    extremes = [np.iinfo(np.int64).min, -1, 0, DELETED_KEY - 2, DELETED_KEY - 1, DELETED_KEY, EMPTY_KEY]
    with np.errstate(over="ignore"):  # the neighbours of the extremes wrap around: still probes
        probe = np.unique(np.concatenate([ids, ids - 1, ids + 1, np.array(extremes, np.int64)]))
    refs = tab.refs(tf.constant(probe)).numpy()
    slot_of = {int(i): s for s, i in enumerate(np.sort(ids).tolist())}
    want = np.array([slot_of.get(int(i), -1) for i in probe], np.int64)
    np.testing.assert_array_equal(np.where(refs < 0, -1, refs), want)


def test_an_artifact_exported_before_the_fence_loads_and_answers(tmp_path: Path) -> None:
    """The stored graph of an earlier build keeps working: lookups, writes, deletes, row counts, stream position,
    and ``read_ps_tables`` (``embedgate tables export``) read it."""
    import tensorflow as tf

    shard = tmp_path / "1"
    shutil.copytree(
        _OLD, shard
    )  # writes change the loaded variables only, but keep the checked-in files pristine
    names = {name for name, _ in tf.train.list_variables(str(shard / "variables" / "variables"))}
    assert "keys/t/.ATTRIBUTES/VARIABLE_VALUE" in names
    assert not any(name.startswith("fence/") for name in names)  # it is the layout before the fence
    spec = TableSpec(name="t", dim=DIM, default_value=-1.0)
    got_ids, got_rows = read_ps_tables([shard], [spec])["t"]
    np.testing.assert_array_equal(got_ids, _OLD_IDS)
    np.testing.assert_array_equal(got_rows, _rows(_OLD_IDS))
    m = Tf1Model(shard)
    try:
        probe = np.array([3, 4, 41, 100, 101, -5, EMPTY_KEY], np.int64)
        want = np.where(np.isin(probe, _OLD_IDS)[:, None], _rows(probe), np.float32(-1.0))
        np.testing.assert_array_equal(m.run("lookup", {"t_ids": probe})["t_values"], want)
        m.run("upsert_t", _w([7, 41], 1, values=_rows([7, 41]) + 100))
        m.run("delete_t", _w([9], 1))
        after = m.run("lookup", {"t_ids": np.array([7, 9, 41, 100], np.int64)})["t_values"]
        np.testing.assert_array_equal(
            after, np.stack([_rows([7])[0] + 100, np.full(DIM, -1.0), _rows([41])[0] + 100, _rows([100])[0]])
        )
        assert int(m.run("row_count", {})["t_rows"]) == 6
        position = m.run("stream_position", {})
        assert [p.decode() for p in position["t_stream_partitions"]] == ["deltas:0"]
        assert position["t_stream_offsets"].tolist() == [5]
    finally:
        m.close()


def test_a_new_export_reads_back_with_its_padding_and_fence(tmp_path: Path) -> None:
    """Padding keys are no rows: ``read_ps_tables`` and ``row_count`` see the exported ids only."""
    spec = TableSpec(name="t", dim=DIM)
    ids = np.arange(FENCE_BLOCK + 3, dtype=np.int64) * 7
    write_ps_shard(tmp_path / "1", [spec], {"t": (ids, _rows(ids))})
    got_ids, got_rows = read_ps_tables([tmp_path / "1"], [spec])["t"]
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_array_equal(got_rows, _rows(ids))
    m = Tf1Model(tmp_path / "1")
    try:
        assert int(m.run("row_count", {})["t_rows"]) == len(ids)
        np.testing.assert_array_equal(
            m.run("lookup", {"t_ids": ids[::-1].copy()})["t_values"], _rows(ids[::-1])
        )
    finally:
        m.close()
