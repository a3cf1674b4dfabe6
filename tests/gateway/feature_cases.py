"""What the gateway's feature-parsing tests share: the manifest they parse against, the odd leaves and the
one-defect mutation of a well-formed example that make their hypothesis examples exercise every error branch."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from schemas.manifest import Manifest

__all__ = ["MANIFEST", "ODD", "defect", "manifest_doc"]


def manifest_doc() -> dict[str, Any]:
    """A fresh copy of the manifest document: single and multi features over two tables, weights, ``max_ids``, dense
    features of dim 1 and 2."""
    return {
        "model_name": "m",
        "version": 1,
        "tables": [{"name": "users", "dim": 4}, {"name": "items", "dim": 3}],
        "sparse_features": [
            {"name": "user", "table": "users"},
            {"name": "item", "table": "items", "weights": "item_w"},
            {
                "name": "genres",
                "table": "items",
                "kind": "multi",
                "combiner": "mean",
                "weights": "genres_w",
                "max_ids": 5,
            },
            {"name": "tags", "table": "items", "kind": "multi", "combiner": "sqrtn"},
        ],
        "dense_features": [{"name": "age", "dim": 1}, {"name": "ctx", "dim": 2}],
        "partition": {"num_shards": 3},
        "entry": {"outputs": [{"name": "score", "shape": [1]}]},
    }


MANIFEST = Manifest.model_validate(manifest_doc())

# Odd leaves, each wrong for some kind of feature: bools, null, strings, floats as ids, ids beyond int64, -0, values beyond float32 and
# double, NaN and infinity, empty and nested lists, objects.
ODD = st.sampled_from(
    [
        True,
        False,
        None,
        "1",
        1.0,
        2**63,
        -(2**63) - 1,
        10**400,
        math.nan,
        math.inf,
        -0.0,
        3.5e38,
        -1e39,
        [],
        [[1]],
        {},
    ]
)


def defect(draw: st.DrawFn, ex: dict[str, Any], odd: st.SearchStrategy[Any]) -> None:
    """One defect in ``ex`` (in place): a value or a list element replaced by a leaf drawn from ``odd``, a list made
    longer or shorter, a key dropped, an unknown key added, or a value wrapped in a list."""
    key = draw(st.sampled_from(sorted(ex)))
    how = draw(st.sampled_from(["leaf", "element", "length", "drop", "unknown", "wrap"]))
    value = ex[key]
    if how == "leaf":
        ex[key] = draw(odd)
    elif how == "element" and isinstance(value, list) and value:
        value[draw(st.integers(0, len(value) - 1))] = draw(odd)
    elif how == "length" and isinstance(value, list):
        if value and draw(st.booleans()):
            value.pop()
        else:
            value.extend([1] * draw(st.integers(1, 6)))
    elif how == "drop":
        del ex[key]
    elif how == "unknown":
        ex["unknown"] = 1
    elif how == "wrap":
        ex[key] = [value]
