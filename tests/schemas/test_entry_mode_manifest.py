"""schemas.manifest: the entry input mode, row dtype and mask_zero fields (optional; old manifests read as pooled)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from schemas.manifest import EntryInputMode, EntryRowDtype, Manifest


def _manifest(**entry: Any) -> dict[str, Any]:
    return {
        "model_name": "m",
        "version": 1,
        "tables": [{"name": "t", "dim": 2}],
        "sparse_features": [
            {"name": "f", "table": "t"},
            {"name": "h", "table": "t", "kind": "multi", "weights": "h_w", "mask_zero": True},
        ],
        "partition": {"num_shards": 2},
        "entry": {"outputs": [{"name": "y", "shape": [1]}], **entry},
    }


def test_a_manifest_without_the_fields_is_pooled_float32() -> None:
    data = _manifest()
    del data["sparse_features"][1]["mask_zero"]
    m = Manifest.model_validate(data)
    assert m.entry.input_mode is EntryInputMode.POOLED and m.entry.row_dtype is EntryRowDtype.FLOAT32
    assert not m.sparse("h").mask_zero


def test_unique_rows_round_trips() -> None:
    m = Manifest.model_validate(_manifest(input_mode="unique_rows", row_dtype="bfloat16"))
    again = Manifest.model_validate_json(m.dumps())
    assert again == m and again.entry.row_dtype is EntryRowDtype.BFLOAT16 and again.sparse("h").mask_zero


def test_reduced_rows_need_the_unique_rows_mode() -> None:
    with pytest.raises(ValidationError, match="row_dtype applies to entry.input_mode 'unique_rows' only"):
        Manifest.model_validate(_manifest(row_dtype="float16"))


def test_a_feature_named_like_an_entry_input_is_refused_in_unique_rows_mode() -> None:
    data = _manifest(input_mode="unique_rows")
    data["dense_features"] = [{"name": "index__f"}]
    with pytest.raises(ValidationError, match="entry input name 'index__f' is used twice"):
        Manifest.model_validate(data)
    data["entry"]["input_mode"] = "pooled"
    Manifest.model_validate(data)  # a pooled entry has no such input


def test_mask_zero_is_for_multi_features() -> None:
    data = _manifest()
    data["sparse_features"][0]["mask_zero"] = True
    with pytest.raises(ValidationError, match="mask_zero applies to kind 'multi' only"):
        Manifest.model_validate(data)
