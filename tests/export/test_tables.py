"""HPS table files: round trips and every malformed-file case, named by file, offset/index and problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedgate.export.tables import TableFileError, check_rows, read_table, write_table


def test_round_trip_and_byte_layout(tmp_path: Path) -> None:
    keys = np.array([5, -2, 1 << 40], np.int64)
    vecs = np.arange(12, dtype=np.float32).reshape(3, 4) / 3
    d = write_table(tmp_path / "t", keys, vecs)
    assert (d / "key").read_bytes() == keys.astype("<i8").tobytes()
    assert (d / "emb_vector").stat().st_size == 3 * 4 * 4
    assert (d / "emb_vector").read_bytes()[:4] == np.float32(0).tobytes()
    k, v = read_table(d)
    np.testing.assert_array_equal(k, keys)
    np.testing.assert_array_equal(v, vecs)
    k, v = read_table(d, dim=4)
    assert v.shape == (3, 4)


def _files(tmp_path: Path, key: bytes, emb: bytes) -> Path:
    d = tmp_path / "bad"
    d.mkdir(exist_ok=True)
    (d / "key").write_bytes(key)
    (d / "emb_vector").write_bytes(emb)
    return d


def test_key_length_not_multiple_of_8(tmp_path: Path) -> None:
    d = _files(tmp_path, b"\0" * 13, b"\0" * 16)
    with pytest.raises(TableFileError, match=r"bad/key: length 13 is not a multiple of 8.*offset 8"):
        read_table(d)


def test_vector_length_not_multiple_of_row(tmp_path: Path) -> None:
    d = _files(tmp_path, np.arange(2, dtype="<i8").tobytes(), b"\0" * 34)
    with pytest.raises(
        TableFileError, match=r"bad/emb_vector: length 34 is not a multiple of 4\*dim = 16.*offset 32"
    ):
        read_table(d, dim=4)
    with pytest.raises(TableFileError, match=r"emb_vector: length 34 is not a multiple of 4 \* 2 keys"):
        read_table(d)


def test_count_mismatch(tmp_path: Path) -> None:
    d = _files(tmp_path, np.arange(3, dtype="<i8").tobytes(), b"\0" * 32)
    with pytest.raises(TableFileError, match=r"key and vector counts differ.*3 keys.*2 rows of dim 4"):
        read_table(d, dim=4)


def test_duplicate_keys(tmp_path: Path) -> None:
    d = _files(tmp_path, np.array([4, 9, 4], "<i8").tobytes(), b"\0" * 24)
    with pytest.raises(
        TableFileError, match=r"bad/key: duplicate key 4 at index 0 and index 2 \(byte offsets 0 and 16\)"
    ):
        read_table(d)


def test_missing_file(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    with pytest.raises(TableFileError, match=r"t/key: cannot read"):
        read_table(tmp_path / "t")


def test_check_rows_errors() -> None:
    with pytest.raises(TableFileError, match="2 keys but 3 vectors"):
        check_rows([1, 2], np.zeros((3, 2)))
    with pytest.raises(TableFileError, match="dim 2, expected 4"):
        check_rows([1, 2], np.zeros((2, 2)), dim=4)
    with pytest.raises(TableFileError, match="keys must be a 1-D integer"):
        check_rows([1.5], np.zeros((1, 2)))


def test_export_and_import_through_artifacts(tiny: Any, tmp_path: Path) -> None:
    import shutil

    from embedgate.export.artifact import export_tables, import_tables
    from schemas.manifest import Manifest
    from tests.export.tf1 import Tf1Artifacts

    counts = export_tables(tiny.export.model_dir, tmp_path / "hps")
    assert counts == {"user_emb": 300, "tag_emb": 120, "item_emb": 500}
    k, v = read_table(tmp_path / "hps" / "item_emb")
    np.testing.assert_array_equal(k, np.arange(500))
    np.testing.assert_array_equal(v, tiny.model.get_layer("item_emb").embeddings.numpy())

    model_dir = tmp_path / "copy" / "tiny"
    shutil.copytree(tiny.export.model_dir, model_dir)
    new_keys = np.array([1_000_000_007, 3], np.int64)
    new_vecs = np.full((2, 4), 9.0, np.float32)
    write_table(tmp_path / "foreign", new_keys, new_vecs)
    result = import_tables(model_dir, {"tag_emb": tmp_path / "foreign"})
    assert result.version == 2
    m = Manifest.load(model_dir)
    assert m.version == 2 and m.table("tag_emb").rows == 2 and m.table("user_emb").rows == 300
    arts = Tf1Artifacts(model_dir, m)
    try:
        np.testing.assert_array_equal(
            arts.lookup("tag_emb", [1_000_000_007, 3, 4]), [[9] * 4, [9] * 4, [0] * 4]
        )
        np.testing.assert_array_equal(
            arts.lookup("user_emb", [7]), tiny.model.get_layer("user_emb").embeddings.numpy()[[7]]
        )
    finally:
        arts.close()
    write_table(tmp_path / "wrongdim", new_keys, np.zeros((2, 5), np.float32))
    with pytest.raises(TableFileError, match=r"wrongdim: rows have dim 5, table 'tag_emb' has dim 4"):
        import_tables(model_dir, {"tag_emb": tmp_path / "wrongdim"})
