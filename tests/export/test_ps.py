"""Every PS signature, run as TF Serving runs it: TF1 Session, tensor names from the MetaGraph's signature_def."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedgate.export.ps import ArtifactError, check_saved_model_dir, read_ps_tables, write_ps_shard
from schemas.manifest import TableSpec
from schemas.partition import shard_for
from tests.export.tf1 import Tf1Model

SPECS = [TableSpec(name="a", dim=3, default_value=-1.0), TableSpec(name="b", dim=2)]


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ps") / "1"
    rows = {
        "a": (np.array([1, 2, 3], np.int64), np.arange(9, dtype=np.float32).reshape(3, 3)),
        "b": (np.array([7], np.int64), np.array([[0.5, 0.25]], np.float32)),
    }
    write_ps_shard(d, SPECS, rows)
    return d


def _lookup(m: Tf1Model, a: list[int], b: list[int]) -> dict[str, np.ndarray]:
    return m.run("lookup", {"a_ids": np.array(a, np.int64), "b_ids": np.array(b, np.int64)})


def test_signatures_are_exactly_the_contract(shard_dir: Path) -> None:
    m = Tf1Model(shard_dir)
    try:
        assert set(m.signatures) == {"lookup", "row_count", "upsert_a", "upsert_b", "delete_a", "delete_b"}
        assert set(m.signatures["lookup"].inputs) == {"a_ids", "b_ids"}
        assert set(m.signatures["lookup"].outputs) == {"a_values", "b_values"}
        assert set(m.signatures["upsert_a"].inputs) == {"ids", "values"}
        assert set(m.signatures["upsert_a"].outputs) == {"rows"}
        assert set(m.signatures["delete_b"].inputs) == {"ids"}
        assert set(m.signatures["row_count"].inputs) == set()
        assert set(m.signatures["row_count"].outputs) == {"a_rows", "b_rows"}
        ops = {n.op for n in m.meta_graph.graph_def.node}
        for f in m.meta_graph.graph_def.library.function:
            ops |= {n.op for n in f.node_def}
        assert "PyFunc" not in ops and "EagerPyFunc" not in ops
    finally:
        m.close()


def test_rows_restored_and_default_row(shard_dir: Path) -> None:
    m = Tf1Model(shard_dir)
    try:
        out = _lookup(m, [3, 1, 99], [7, 8])
        np.testing.assert_array_equal(out["a_values"], [[6, 7, 8], [0, 1, 2], [-1, -1, -1]])
        np.testing.assert_array_equal(out["b_values"], [[0.5, 0.25], [0, 0]])
        assert out["a_values"].dtype == np.float32
        rc = m.run("row_count", {})
        assert (int(rc["a_rows"]), int(rc["b_rows"])) == (3, 1)
    finally:
        m.close()


def test_upsert_and_delete_mutate_the_loaded_table(shard_dir: Path) -> None:
    m = Tf1Model(shard_dir)
    try:
        r = m.run(
            "upsert_a",
            {
                "ids": np.array([10, 1, 10], np.int64),
                "values": np.array([[1, 1, 1], [2, 2, 2], [3, 3, 3]], np.float32),
            },
        )
        assert int(r["rows"]) == 4  # 10 is new, 1 replaced; the last occurrence of 10 wins
        r = m.run("upsert_a", {"ids": np.array([11], np.int64), "values": np.full((1, 3), 4, np.float32)})
        assert int(r["rows"]) == 5  # a second call in the same session sees the first
        out = _lookup(m, [10, 1, 11, 2], [])
        np.testing.assert_array_equal(out["a_values"], [[3, 3, 3], [2, 2, 2], [4, 4, 4], [3, 4, 5]])
        assert out["b_values"].shape == (0, 2)
        r = m.run("delete_a", {"ids": np.array([10, 12345], np.int64)})  # absent id: no-op
        assert int(r["rows"]) == 4
        np.testing.assert_array_equal(_lookup(m, [10], [])["a_values"], [[-1, -1, -1]])
        r = m.run("upsert_b", {"ids": np.array([], np.int64), "values": np.zeros((0, 2), np.float32)})
        assert int(r["rows"]) == 1
        rc = m.run("row_count", {})
        assert (int(rc["a_rows"]), int(rc["b_rows"])) == (4, 1)
    finally:
        m.close()
    fresh = Tf1Model(shard_dir)  # writes live in the serving session only; the artifact is unchanged
    try:
        assert int(fresh.run("row_count", {})["a_rows"]) == 3
    finally:
        fresh.close()


def test_every_exported_shard_holds_exactly_its_rows(tiny: Any, tiny_tf1: Any) -> None:
    m = tiny.export.manifest
    for t in m.tables:
        ids = np.arange(t.rows, dtype=np.int64)
        shards = shard_for(ids, m.num_shards)
        counts = [int(ps.run("row_count", {})[f"{t.name}_rows"]) for ps in tiny_tf1.ps]
        assert counts == [int((shards == i).sum()) for i in range(m.num_shards)]
        expected = tiny.model.get_layer(t.name).embeddings.numpy()
        np.testing.assert_array_equal(tiny_tf1.lookup(t.name, ids), expected)
        unknown = tiny_tf1.lookup(t.name, [t.rows + 5, -3])
        np.testing.assert_array_equal(unknown, np.full((2, t.dim), t.default_value, np.float32))


def test_entry_runs_in_tf1_session(tiny_tf1: Any, tiny: Any) -> None:
    feeds = {}
    for f in tiny.export.manifest.sparse_features:
        feeds[f.name] = np.ones((2, tiny.export.manifest.table(f.table).dim), np.float32)
    for d in tiny.export.manifest.dense_features:
        feeds[d.name] = np.zeros((2, d.dim), np.float32)
    out = tiny_tf1.entry.run("serving_default", feeds)
    assert out["ctr"].shape == (2, 1) and out["score"].shape == (2, 2)


def test_read_ps_tables_reassembles_rows(tiny: Any) -> None:
    m = tiny.export.manifest
    dirs = [tiny.export.model_dir / f"ps_{i}" / "1" for i in range(m.num_shards)]
    rows = read_ps_tables(dirs, m.tables)
    for t in m.tables:
        ids, vals = rows[t.name]
        np.testing.assert_array_equal(ids, np.arange(t.rows))
        np.testing.assert_array_equal(vals, tiny.model.get_layer(t.name).embeddings.numpy())


def test_half_written_version_dir_is_named(tmp_path: Path) -> None:
    (tmp_path / "3" / "variables").mkdir(parents=True)
    with pytest.raises(ArtifactError, match=r"3: no saved_model\.pb \(half-written"):
        check_saved_model_dir(tmp_path / "3")
    (tmp_path / "3" / "saved_model.pb").write_bytes(b"")
    with pytest.raises(ArtifactError, match="variables.index"):
        check_saved_model_dir(tmp_path / "3")
    with pytest.raises(ArtifactError, match="missing"):
        check_saved_model_dir(tmp_path / "4")


def test_two_loads_do_not_share_tables(shard_dir: Path) -> None:
    a, b = Tf1Model(shard_dir), Tf1Model(shard_dir)  # e.g. two versions during a swap, in one process
    try:
        a.run("upsert_b", {"ids": np.array([42], np.int64), "values": np.ones((1, 2), np.float32)})
        assert int(a.run("row_count", {})["b_rows"]) == 2
        assert int(b.run("row_count", {})["b_rows"]) == 1
    finally:
        a.close()
        b.close()
