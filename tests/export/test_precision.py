"""Reduced-precision rows (``row_dtype`` float16 / bfloat16) end to end: export with the self-check's report, then
serve-local (entry + PS shards) -> the gateway's REST predict, within the documented tolerance of the trained model."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from embedgate.export.selfcheck import TOLERANCE
from schemas.manifest import PsLayout, entry_model_name, ps_dir_name, ps_model_name
from tests.export.conftest import DECLARATION, build_tiny_model, tiny_instances

pytestmark = pytest.mark.integration


def _declaration(**dtypes: str) -> dict[str, Any]:
    tables = {name: {**DECLARATION["tables"].get(name, {}), "row_dtype": d} for name, d in dtypes.items()}  # type: ignore[attr-defined]
    return {**DECLARATION, "tables": {**DECLARATION["tables"], **tables}}  # type: ignore[dict-item]


def test_float16_and_bfloat16_rows_served_through_the_gateway(tmp_path: Path) -> None:
    from embedgate.export.declaration import Declaration
    from embedgate.export.exporter import export_model
    from embedgate.export.instances import to_keras_inputs
    from tests.support.gateway import run_gateway
    from tests.support.servers import serve_local

    model = build_tiny_model()
    decl = Declaration.model_validate(_declaration(user_emb="float16", item_emb="bfloat16"))
    result = export_model(model, decl, tmp_path / "out", num_shards=2)
    manifest = result.manifest
    assert manifest.ps_layout is PsLayout.SLAB
    assert {t.name: t.row_dtype for t in manifest.tables} == {
        "user_emb": "float16",
        "tag_emb": "float32",
        "item_emb": "bfloat16",
    }
    report = result.self_check
    assert report is not None and report.tolerance == TOLERANCE["bfloat16"]
    # rounding to 11 (float16) or 8 (bfloat16) significant bits, measured on the served rows: not zero, within bound
    for table, bits in (("user_emb", 11), ("item_emb", 8)):
        biggest = float(np.max(np.abs(model.get_layer(table).embeddings.numpy())))
        assert 0 < report.row_error[table] <= biggest * 2.0**-bits
    assert report.row_error["tag_emb"] == 0.0

    instances = tiny_instances()
    inputs = to_keras_inputs(instances, decl, {t.name: tuple(t.shape) for t in model.inputs})
    want = [np.asarray(x) for x in model(inputs, training=False)]
    served = {entry_model_name("tiny"): result.model_dir / "entry"}
    served |= {
        ps_model_name("tiny", i): result.model_dir / ps_dir_name(i) for i in range(manifest.num_shards)
    }
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(serve_local(served))
        gw_model = {
            "kind": "embedding",
            "name": "tiny",
            "manifest": str(result.model_dir),
            "entry": server.target,
            "shards": [{"replicas": [server.target]} for _ in range(manifest.num_shards)],
        }
        cfg = tmp_path / "gateway.yaml"
        cfg.write_text(yaml.safe_dump({"models": [gw_model]}))
        gw = stack.enter_context(run_gateway(cfg))
        r = httpx.post(
            f"{gw.url}/v1/models/tiny:predict", content=json.dumps({"instances": instances}), timeout=30
        )
    assert r.status_code == 200, r.text
    preds = r.json()["predictions"]
    got_ctr = np.array([p["ctr"] for p in preds], np.float64)
    got_score = np.array([p["score"] for p in preds], np.float64)
    rtol, atol = TOLERANCE["bfloat16"]
    for got, ref in ((got_ctr, want[0]), (got_score, want[1])):
        ref = ref.reshape(got.shape).astype(np.float64)
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol * max(1.0, float(np.max(np.abs(ref)))))
    assert not np.array_equal(got_score, want[1].reshape(got_score.shape))  # the rows were really rounded


def test_float16_overflow_is_refused_naming_the_table(tmp_path: Path) -> None:
    from embedgate.export.ps import write_ps_shard
    from schemas.manifest import TableSpec

    spec = TableSpec(name="big", dim=2, row_dtype="float16")
    rows = {"big": (np.array([1], np.int64), np.array([[1.0, 1e6]], np.float32))}
    with pytest.raises(ValueError, match=r"table 'big'.*does not fit row_dtype float16"):
        write_ps_shard(tmp_path / "1", [spec], rows)
