"""benchmarks.dlrm_bench without servers: the Criteo-capped cardinalities, the two traffics, and the table it writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import dlrm_bench
from benchmarks.report import write_section


def test_cardinalities_fill_the_row_budget_without_exceeding_it() -> None:
    cards = dlrm_bench.cardinalities(1_780_000)
    assert len(cards) == 26 and 1_700_000 < sum(cards) <= 1_780_000
    assert min(cards) == 3 and cards[8] == 3  # small Criteo features keep their own cardinality


def test_one_user_traffic_repeats_the_user_side_only() -> None:
    cards = dlrm_bench.cardinalities(500_000)
    cols = dlrm_bench.traffic("one_user", 64, cards, seed=1)
    for i in range(26):
        ids = cols[f"s{i}"]
        assert ids.dtype == np.int64 and ids.shape == (64,) and (ids >= 0).all() and (ids < cards[i]).all()
        assert (len(np.unique(ids)) == 1) == (i in dlrm_bench.USER_SIDE or cards[i] <= 3)
    assert cols["dense"].shape == (64, dlrm_bench.DENSE)
    random = dlrm_bench.traffic("random", 64, cards, seed=1)
    assert sum(len(np.unique(random[f"s{i}"])) for i in range(26)) > sum(
        len(np.unique(cols[f"s{i}"])) for i in range(26)
    )


def test_the_table_names_every_column(tmp_path: Path) -> None:
    cell = {"p50_ms": 10.0, "ratio": 1.1, "ratio_min": 1.0, "ratio_max": 1.2}
    report = {
        "command": "python -m benchmarks.dlrm_bench",
        "rows": 1_779_995,
        "machine": {"cores": 2},
        "load_average_start": 1.0,
        "load_average_end": 1.5,
        "results": {
            "one_user/512": {
                "distinct_rows": 3230,
                "slots": 13312,
                "bytes": {"whole": 133754},
                "bytes_ratio": {"entry_dlrm": 6.79, "entry_dlrm_bf16": 3.7, "entry_dlrm_pooled": 25.68},
                "p50": {"whole": cell, "entry_dlrm": cell, "gateway_grpc": cell, "gateway_rest_cache": cell},
            }
        },
    }
    text = dlrm_bench._table(report)
    assert "| one_user/512 | 3,230 / 13,312 | 6.79x / 3.7x / 25.68x (133,754 B whole) |" in text
    assert "1.1x (1.0-1.2) / - / - / 1.1x (1.0-1.2) / - / - / 1.1x (1.0-1.2) | 10.0 ms |" in text
    assert "gateway_rest / gateway_rest_cache | whole p50" in text
    doc = tmp_path / "b.md"
    write_section(doc, dlrm_bench.BEGIN, dlrm_bench.END, text, "## DLRM entry modes")
    assert dlrm_bench.BEGIN in doc.read_text()


def test_the_stage_table_checks_both_variants_and_names_every_stage() -> None:
    import argparse

    import pytest

    from benchmarks import dlrm_stages
    from gateway import native

    if native.path() != "native":
        pytest.skip("embedgate_native is not built (make install)")
    args = argparse.Namespace(rows=20_000, batches="64", traffic="one_user,random", rounds=2, reps=2)
    lines = dlrm_stages.run(args)  # asserts both variants of each stage give the same result
    rows = [line for line in lines if line.startswith(("| one_user/64", "| random/64"))]
    assert [r.split(" | ")[1] for r in rows] == ["spec sizes", "shape check", "features", "read path"] * 2


def test_the_stage_table_takes_the_demo_model_too(demo_artifacts: Any, monkeypatch: Any) -> None:
    import argparse

    import pytest

    from benchmarks import dlrm_stages
    from gateway import native

    if native.path() != "native":
        pytest.skip("embedgate_native is not built (make install)")
    monkeypatch.setattr(dlrm_stages, "_demo_manifest", lambda: demo_artifacts.manifest)  # the session's build
    args = argparse.Namespace(rows=20_000, batches="1,64", traffic="demo", rounds=1, reps=1)
    lines = dlrm_stages.run(args)  # the demo's multi-valued and dense features: both variants agree
    rows = [line for line in lines if line.startswith("| demo/")]
    assert [r.split(" | ")[0:2] for r in rows] == [
        [f"| demo/{b}", stage]
        for b in (1, 64)
        for stage in ("spec sizes", "shape check", "features", "read path")
    ]
