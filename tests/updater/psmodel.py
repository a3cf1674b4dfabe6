"""A small PS-only model for the updater's integration tests, built with the exporter's ``write_ps_shard`` in a
subprocess (TensorFlow never enters the test process), plus Predict helpers over our wire protos."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import numpy.typing as npt

from schemas.manifest import Manifest, lookup_ids_input, lookup_values_output
from schemas.proto import tfs_pb2

__all__ = ["build_ps_model", "lookup", "wait_until"]

_PREDICT = "/tensorflow.serving.PredictionService/Predict"


def build_ps_model(root: Path, name: str = "emb", num_shards: int = 2, version: int = 1) -> Manifest:
    """``root/<name>/manifest.json`` + ``ps_<i>/<version>/``: tables item (dim 4, 100 initial rows, ids 0..99,
    row = [id, id, id, id]) and user (dim 3, empty, allow_nan)."""
    manifest = Manifest.model_validate(
        {
            "model_name": name,
            "version": version,
            "tables": [
                {"name": "item", "dim": 4, "default_value": -1.0},
                {"name": "user", "dim": 3, "allow_nan": True},
            ],
            "sparse_features": [{"name": "item_id", "table": "item"}, {"name": "user_id", "table": "user"}],
            "partition": {"num_shards": num_shards},
            "entry": {"outputs": [{"name": "p", "shape": [1]}]},
        }
    )
    model_dir = root / name
    model_dir.mkdir(parents=True)
    (model_dir / "manifest.json").write_text(manifest.dumps())
    script = textwrap.dedent(
        f"""
        import json, numpy as np
        from pathlib import Path
        from embedgate.export.ps import write_ps_shard
        from schemas.manifest import Manifest
        from schemas.partition import shard_for
        m = Manifest.load({str(model_dir)!r})
        ids = np.arange(100, dtype=np.int64)
        shards = shard_for(ids, m.num_shards)
        for s in range(m.num_shards):
            sel = ids[shards == s]
            rows = {{"item": (sel, np.repeat(sel[:, None].astype(np.float32), 4, axis=1))}}
            write_ps_shard(Path({str(model_dir)!r}) / f"ps_{{s}}" / "{version}", m.tables, rows)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, env=_env())
    return manifest


def _env() -> dict[str, str]:
    import os

    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")


def lookup(
    target: str, served_name: str, manifest: Manifest, table: str, ids: npt.ArrayLike
) -> npt.NDArray[np.float32]:
    """Rows of ``ids`` in ``table`` via the PS ``lookup`` signature (every other table gets an empty id list)."""
    from schemas.tensors import from_ndarray

    req = tfs_pb2.PredictRequest(model_spec=tfs_pb2.ModelSpec(name=served_name, signature_name="lookup"))
    for t in manifest.tables:
        arr = np.asarray(ids if t.name == table else [], dtype=np.int64).reshape(-1)
        req.inputs[lookup_ids_input(t.name)].CopyFrom(from_ndarray(arr))
    with grpc.insecure_channel(target) as ch:
        call = ch.unary_unary(
            _PREDICT,
            request_serializer=tfs_pb2.PredictRequest.SerializeToString,
            response_deserializer=tfs_pb2.PredictResponse.FromString,
        )
        resp = call(req, timeout=10)
    out = resp.outputs[lookup_values_output(table)]
    shape = [d.size for d in out.tensor_shape.dim]
    if out.tensor_content:
        return np.frombuffer(out.tensor_content, dtype="<f4").reshape(shape)
    return np.asarray(out.float_val, dtype=np.float32).reshape(shape)


def wait_until(cond: Callable[[], bool], timeout_s: float = 30.0, interval_s: float = 0.2) -> bool:
    """Poll ``cond`` until true or ``timeout_s`` (bounded); returns the last result."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        if cond():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
