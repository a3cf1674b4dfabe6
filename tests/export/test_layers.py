"""EmbeddingPooling (Keras) against the numpy reference the gateway follows; serialization."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embedgate.export.pooling import pool, pool_padded


def test_numpy_reference_edge_cases() -> None:
    e = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    np.testing.assert_allclose(pool(e, None, "sum"), [4, 6])
    np.testing.assert_allclose(pool(e, [1, 3], "mean"), [2.5, 3.5])
    np.testing.assert_allclose(pool(e, [3, 4], "sqrtn"), [3, 22 / 5])
    for c in ("sum", "mean", "sqrtn"):
        np.testing.assert_array_equal(pool(np.zeros((0, 2)), None, c), [0, 0])  # no ids: a zero row
        np.testing.assert_array_equal(pool(e, [0, 0], c), [0, 0])  # all weights 0: a zero row
    with pytest.raises(ValueError, match=r"weights must have shape \(2,\)"):
        pool(e, [1], "sum")


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_keras_layer_matches_numpy(combiner: str) -> None:
    import keras

    from embedgate.export.layers import EmbeddingPooling

    rng = np.random.default_rng(0)
    emb = rng.normal(size=(5, 4, 3)).astype(np.float32)
    w = rng.uniform(0, 2, (5, 4)).astype(np.float32)
    w[0] = 0  # no ids
    w[1, 2:] = 0  # padding
    layer = EmbeddingPooling(combiner)
    got = np.asarray(layer([emb, w]))
    np.testing.assert_allclose(got, pool_padded(emb, w, combiner), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(layer(emb)), pool_padded(emb, np.ones((5, 4)), combiner), rtol=1e-6)
    clone = EmbeddingPooling.from_config(layer.get_config())
    assert clone.combiner == combiner
    assert (
        keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer)).combiner == combiner
    )


def test_bad_combiner() -> None:
    from embedgate.export.layers import EmbeddingPooling

    with pytest.raises(ValueError, match="'max' is not a valid Combiner"):
        EmbeddingPooling("max")


def test_cli_module_is_light() -> None:
    code = "import sys, embedgate.export.cli; print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path.cwd()
    )
    assert out.stdout.strip() == "[]"


def test_to_keras_inputs_too_many_ids() -> None:
    from embedgate.export.declaration import Declaration
    from embedgate.export.instances import to_keras_inputs
    from tests.export.conftest import DECLARATION, tiny_instances

    inst = tiny_instances()[:2]
    inst[1]["genres"] = list(range(7))
    shapes = {
        "user": (None,),
        "genres": (None, 6),
        "tags": (None, 6),
        "clicks": (None, 6),
        "recent": (None, 6),
    }
    with pytest.raises(ValueError, match="instance 1: feature 'genres' has 7 ids, the model takes 6"):
        to_keras_inputs(inst, Declaration.model_validate(DECLARATION), shapes)
