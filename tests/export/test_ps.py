"""Every PS signature, run as TF Serving runs it: TF1 Session, tensor names from the MetaGraph's signature_def."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedgate.export.ps import ArtifactError, check_saved_model_dir, read_ps_tables, write_ps_shard
from schemas.manifest import PsLayout, TableSpec
from schemas.partition import shard_for
from tests.export.tf1 import Tf1Model

SPECS = [TableSpec(name="a", dim=3, default_value=-1.0), TableSpec(name="b", dim=2)]


@pytest.fixture(scope="module", params=list(PsLayout))
def layout(request: pytest.FixtureRequest) -> PsLayout:
    """Both layouts answer every signature the same way (the hash layout stays for one release)."""
    return PsLayout(request.param)


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory: pytest.TempPathFactory, layout: PsLayout) -> Path:
    d = tmp_path_factory.mktemp(f"ps-{layout}") / "1"
    rows = {
        "a": (np.array([1, 2, 3], np.int64), np.arange(9, dtype=np.float32).reshape(3, 3)),
        "b": (np.array([7], np.int64), np.array([[0.5, 0.25]], np.float32)),
    }
    write_ps_shard(d, SPECS, rows, layout=layout)
    return d


def _lookup(m: Tf1Model, a: list[int], b: list[int]) -> dict[str, np.ndarray]:
    return m.run("lookup", {"a_ids": np.array(a, np.int64), "b_ids": np.array(b, np.int64)})


def _w(
    ids: list[int],
    ts: list[int] | int = 0,
    seqs: list[int] | int = 0,
    *,
    values: np.ndarray | None = None,
    position: dict[str, int] | None = None,
    expected: int = -1,
) -> dict[str, np.ndarray]:
    """Feeds of an upsert (``values`` given) or delete: per-id versions, optional stream position."""
    n = len(ids)
    feeds = {
        "ids": np.array(ids, np.int64),
        "timestamps_ms": np.broadcast_to(np.asarray(ts, np.int64), (n,)).copy(),
        "seqs": np.broadcast_to(np.asarray(seqs, np.int64), (n,)).copy(),
        "stream_partitions": np.array(list(position or {}), dtype=object),
        "stream_offsets": np.array(list((position or {}).values()), np.int64),
        "stream_expected": np.full(len(position or {}), expected, np.int64),
    }
    if values is not None:
        feeds["values"] = values
    return feeds


def test_signatures_are_exactly_the_contract(shard_dir: Path) -> None:
    m = Tf1Model(shard_dir)
    try:
        assert set(m.signatures) == {
            "lookup",
            "row_count",
            "stream_position",
            "upsert_a",
            "upsert_b",
            "delete_a",
            "delete_b",
        }
        assert set(m.signatures["lookup"].inputs) == {"a_ids", "b_ids"}
        assert set(m.signatures["lookup"].outputs) == {"a_values", "b_values"}
        versioned = {"timestamps_ms", "seqs", "stream_partitions", "stream_offsets", "stream_expected"}
        assert set(m.signatures["upsert_a"].inputs) == {"ids", "values", *versioned}
        assert set(m.signatures["upsert_a"].outputs) == {"rows", "applied", "stream_previous"}
        assert set(m.signatures["delete_b"].inputs) == {"ids", *versioned}
        assert set(m.signatures["delete_b"].outputs) == {"rows", "applied", "stream_previous"}
        assert set(m.signatures["stream_position"].outputs) == {
            "a_stream_partitions",
            "a_stream_offsets",
            "b_stream_partitions",
            "b_stream_offsets",
        }
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
            _w([10, 1, 10], values=np.array([[1, 1, 1], [2, 2, 2], [3, 3, 3]], np.float32)),
        )
        assert int(r["rows"]) == 4  # 10 is new, 1 replaced; the last occurrence of 10 wins (same version)
        r = m.run("upsert_a", _w([11], values=np.full((1, 3), 4, np.float32)))
        assert int(r["rows"]) == 5  # a second call in the same session sees the first
        out = _lookup(m, [10, 1, 11, 2], [])
        np.testing.assert_array_equal(out["a_values"], [[3, 3, 3], [2, 2, 2], [4, 4, 4], [3, 4, 5]])
        assert out["b_values"].shape == (0, 2)
        r = m.run("delete_a", _w([10, 12345]))  # absent id: only a tombstone
        assert int(r["rows"]) == 4
        np.testing.assert_array_equal(_lookup(m, [10], [])["a_values"], [[-1, -1, -1]])
        r = m.run("upsert_b", _w([], values=np.zeros((0, 2), np.float32)))
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
    feeds = tiny_tf1.unique_feeds(tiny.instances[:2])  # the default entry: unique rows + indices
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
        a.run("upsert_b", _w([42], values=np.ones((1, 2), np.float32)))
        assert int(a.run("row_count", {})["b_rows"]) == 2
        assert int(b.run("row_count", {})["b_rows"]) == 1
    finally:
        a.close()
        b.close()


def test_newest_version_wins_per_row_and_tombstones_keep_theirs(shard_dir: Path) -> None:
    m = Tf1Model(shard_dir)
    try:

        def row(i: int) -> list[float]:
            return [float(x) for x in _lookup(m, [i], [])["a_values"][0]]

        one = np.ones((1, 3), np.float32)
        assert int(m.run("upsert_a", _w([50], 200, 0, values=one * 2))["applied"]) == 1
        assert int(m.run("upsert_a", _w([50], 100, 9, values=one * 1))["applied"]) == 0  # older: ignored
        assert row(50) == [2, 2, 2]
        assert int(m.run("upsert_a", _w([50], 200, 1, values=one * 3))["applied"]) == 1  # same ts, later seq
        assert (
            int(m.run("upsert_a", _w([50], 200, 0, values=one * 4))["applied"]) == 0
        )  # same ts, earlier seq
        assert (
            int(m.run("upsert_a", _w([50], 200, 1, values=one * 5))["applied"]) == 1
        )  # a tie: later call wins
        assert row(50) == [5, 5, 5]
        assert int(m.run("delete_a", _w([50], 150))["applied"]) == 0  # an older delete changes nothing
        assert int(m.run("delete_a", _w([50], 300))["applied"]) == 1
        assert row(50) == [-1, -1, -1]
        assert int(m.run("upsert_a", _w([50], 250, 7, values=one * 6))["applied"]) == 0  # tombstone is newer
        assert row(50) == [-1, -1, -1]
        assert int(m.run("upsert_a", _w([50], 301, values=one * 7))["applied"]) == 1
        assert row(50) == [7, 7, 7]
        # within one call: the highest (timestamp, seq) per id wins, ties to the last occurrence
        vals = np.array([[1] * 3, [2] * 3, [3] * 3, [4] * 3, [5] * 3], np.float32)
        m.run("upsert_a", _w([60, 60, 60, 61, 61], [5, 9, 9, 1, 1], [0, 1, 0, 0, 0], values=vals))
        assert (row(60), row(61)) == ([2, 2, 2], [5, 5, 5])
        assert row(1) == [0, 1, 2]  # exported rows have version (-1, -1): any write wins
        m.run("upsert_a", _w([1], 0, 0, values=one * 8))
        assert row(1) == [8, 8, 8]
    finally:
        m.close()


def test_writes_record_the_stream_position(tmp_path: Path, layout: PsLayout) -> None:
    write_ps_shard(tmp_path / "1", SPECS, {}, stream_cut={"t:0": 40, "t:1": 7}, layout=layout)
    m = Tf1Model(tmp_path / "1")
    try:

        def position(table: str) -> dict[str, int]:
            out = m.run("stream_position", {})
            keys = [k.decode() for k in out[f"{table}_stream_partitions"].tolist()]
            return dict(zip(keys, out[f"{table}_stream_offsets"].tolist(), strict=True))

        assert position("a") == position("b") == {"t:0": 40, "t:1": 7}  # the export's stream cut
        one = np.ones((1, 3), np.float32)
        r = m.run(
            "upsert_a", _w([1], values=one, position={"t:0": 45, "u:3": 2})
        )  # expected -1: unconditional
        assert r["stream_previous"].tolist() == [40, -1]  # u:3 had none
        m.run("delete_a", _w([2], position={"t:1": 9}, expected=7))
        m.run("upsert_a", _w([3], values=one, position={"t:0": 41}, expected=40))  # never back
        assert position("a") == {"t:0": 45, "t:1": 9, "u:3": 2}
        # a writer that has not written everything since the stored position must not move it over the gap
        r = m.run("upsert_a", _w([4], values=one, position={"t:0": 60}, expected=50))
        assert r["stream_previous"].tolist() == [45] and position("a")["t:0"] == 45
        assert _lookup(m, [4], [])["a_values"].tolist() == [[1, 1, 1]]  # the rows are written all the same
        assert position("b") == {"t:0": 40, "t:1": 7}  # each table has its own
    finally:
        m.close()
