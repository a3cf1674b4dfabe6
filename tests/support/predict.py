"""What the served-model tests send and read as a TF Serving client would: a REST predict call, its predictions as
one flat array, and one instance as a base64 ``tf.Example``."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any, Literal

import httpx
import numpy as np

__all__ = ["Kind", "example_b64", "post_predict", "predictions"]

Kind = Literal["bytes", "int64", "float"]


def post_predict(url: str, model: str, body: Mapping[str, Any], *, timeout: float = 60) -> httpx.Response:
    """``POST {url}/v1/models/{model}:predict`` with ``body`` as JSON; the response as it came."""
    return httpx.post(f"{url}/v1/models/{model}:predict", content=json.dumps(body), timeout=timeout)


def predictions(r: httpx.Response, output: str | None = None) -> np.ndarray:
    """The response's predictions (row format) or outputs (columnar) as one flat float64 array; ``output`` picks one
    named output of each row's object. Fails the test, showing the body, unless the status is 200."""
    assert r.status_code == 200, r.text
    doc = r.json()
    preds = doc["predictions"] if "predictions" in doc else doc["outputs"]
    if output is not None:
        preds = [p[output] if isinstance(p, dict) else p for p in preds]
    return np.asarray(preds, np.float64).reshape(-1)


def example_b64(inst: Mapping[str, Any], kinds: Mapping[str, Kind] | None = None) -> str:
    """``inst`` as a client writes it into a base64 ``tf.Example``. A feature named in ``kinds`` takes that list kind;
    otherwise strings go to ``bytes_list``, ints to ``int64_list`` and floats to ``float_list``, a list taking the kind
    of its first value. An empty list not named in ``kinds`` has no kind, so it is refused (ValueError), not guessed."""
    from schemas.proto import tfs_pb2

    ex = tfs_pb2.Example()
    for name, value in inst.items():
        values = value if isinstance(value, list) else [value]
        kind = (kinds or {}).get(name) or _kind_of(name, values)
        feature = ex.features.feature[name]
        if kind == "bytes":
            feature.bytes_list.value.extend(v.encode() for v in values)
        elif kind == "float":
            feature.float_list.value.extend(values)
        else:
            feature.int64_list.value.extend(values)
    return base64.b64encode(ex.SerializeToString()).decode()


def _kind_of(name: str, values: list[Any]) -> Kind:
    if not values:
        raise ValueError(f"feature {name!r}: an empty list has no kind; name it in kinds")
    if isinstance(values[0], str):
        return "bytes"
    return "float" if isinstance(values[0], float) else "int64"
