"""Bad input never gives a 5xx: random JSON shapes against an embedding model and a pass-through model."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tests.gateway.conftest import app_client
from tests.gateway.test_rest_embedding import embedding_model

pytestmark = pytest.mark.integration

_LEAVES: list[Any] = [
    0,
    1,
    -1,
    2**63,
    -(2**63) - 1,
    2**64,
    1.5,
    -0.0,
    "x",
    "",
    True,
    False,
    None,
    {"b64": "AAAA"},
    {"b64": "!!"},
    {"b64": 1},
    [],
    {},
]


def _value(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth > 2 or r < 0.5:
        return rng.choice(_LEAVES)
    if r < 0.8:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "x", "b64", "n"]): _value(rng, depth + 1) for _ in range(rng.randint(0, 2))}


def _bodies(features: list[str], n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out: list[bytes] = [
        b"",
        b"{",
        b"[]",
        b"null",
        b'{"instances": [NaN]}',
        b"\xff\xfe",
        b'{"instances": [{}]}',
    ]
    for _ in range(n):
        inst = {f: _value(rng) for f in features if rng.random() < 0.8}
        if rng.random() < 0.2:
            inst[rng.choice(["zzz", "b64"])] = _value(rng)
        kind = rng.random()
        if kind < 0.45:
            doc: Any = {"instances": [inst] * rng.randint(1, 2) if rng.random() < 0.9 else _value(rng)}
        elif kind < 0.7:
            doc = {"inputs": {f: [_value(rng)] for f in inst} if rng.random() < 0.8 else _value(rng)}
        else:
            doc = {"examples": [inst], "context": _value(rng)} if rng.random() < 0.3 else {"examples": [inst]}
        if rng.random() < 0.1:
            doc["signature_name"] = _value(rng)
        out.append(json.dumps(doc).encode())
    return out


async def test_embedding_model_never_5xx(demo_artifacts: Any, demo_backends: Any) -> None:
    m = demo_artifacts.manifest
    features = [f.name for f in m.sparse_features] + [f.name for f in m.dense_features]
    features += [f.weights for f in m.sparse_features if f.weights]
    async with app_client(models=[embedding_model(demo_artifacts, demo_backends.target)]) as gw:
        for i, body in enumerate(_bodies(features, 250, seed=1)):
            verb = ("predict", "regress", "classify")[i % 3]
            r = await gw.post(f"/v1/models/{m.model_name}:{verb}", content=body)
            assert r.status_code < 500, (body, r.text)
            assert "error" in r.json() or r.status_code == 200


async def test_passthrough_model_never_5xx(passthrough_backend: Any) -> None:
    from tests.gateway.conftest import passthrough_models

    async with app_client(models=passthrough_models(passthrough_backend.target)) as gw:
        for i, body in enumerate(_bodies(["a", "n", "s", "x"], 150, seed=2)):
            model = ("multi", "half", "cr")[i % 3]
            verb = "predict" if model != "cr" else ("regress", "classify")[i % 2]
            r = await gw.post(f"/v1/models/{model}:{verb}", content=body)
            assert r.status_code < 500, (model, body, r.text)
