"""Manifest validation: every bad declaration is rejected with a message that names the problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.manifest import Manifest, ManifestError


def _doc(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model_name": "demo",
        "version": 3,
        "tables": [{"name": "item", "dim": 8}, {"name": "genre", "dim": 4}],
        "sparse_features": [
            {"name": "item_id", "table": "item"},
            {"name": "genres", "table": "genre", "kind": "multi", "combiner": "mean", "weights": "genres_w"},
        ],
        "dense_features": [{"name": "price", "dim": 1}],
        "partition": {"num_shards": 2},
        "entry": {"outputs": [{"name": "ctr", "shape": [1]}]},
    }
    doc.update(overrides)
    return doc


def test_round_trip(tmp_path: Path) -> None:
    m = Manifest.model_validate(_doc())
    (tmp_path / "manifest.json").write_text(m.dumps())
    loaded = Manifest.load(tmp_path)
    assert loaded == m
    assert loaded.num_shards == 2
    assert loaded.sparse("genres").table == "genre"
    assert loaded.table("genre").dim == 4
    assert loaded.partition.function == "splitmix64_mod"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"tables": [{"name": "item", "dim": 8}, {"name": "item", "dim": 4}]},
            "table 'item' is declared twice",
        ),
        ({"sparse_features": [{"name": "x", "table": "nope"}]}, "reads table 'nope', which is not declared"),
        ({"sparse_features": []}, "sparse_features"),
        ({"dense_features": [{"name": "item_id"}]}, "input name 'item_id' is used by more than one feature"),
        ({"tables": [{"name": "item", "dim": 0}]}, "dim"),
        ({"partition": {"num_shards": 0}}, "num_shards"),
        ({"partition": {"num_shards": 2, "function": "crc32"}}, "function"),
        (
            {"sparse_features": [{"name": "item_id", "table": "item", "max_ids": 3}]},
            "max_ids applies to kind 'multi'",
        ),
        ({"sparse_features": [{"name": "bad-name", "table": "item"}]}, "name"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_invalid_manifests_name_the_problem(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Manifest.model_validate(_doc(**overrides))


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"manifest.json: cannot read manifest"):
        Manifest.load(tmp_path)
    bad = tmp_path / "manifest.json"
    bad.write_text('{"model_name": "demo"}')
    with pytest.raises(ManifestError, match=r"manifest.json: invalid manifest: .*version"):
        Manifest.load(bad)
