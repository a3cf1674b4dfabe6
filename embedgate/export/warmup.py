"""TF Serving warmup records: ``<version>/assets.extra/tf_serving_warmup_requests`` in every exported SavedModel.

``tensorflow_model_server`` replays these ``PredictionLog`` records (a TFRecord file) while it loads a version and
marks the version AVAILABLE only afterwards, so the first client request does not pay graph initialisation. The
entry gets one Predict of its serving signature at each batch size in ``batch_sizes`` (zeros: pooled embeddings and
dense features; for a ``unique_rows`` entry one zero row per table that every example reads); each PS shard one ``lookup`` of a single id per table. Only read-only signatures are used: replaying
a warmup file can never change a row. The records name the served model (``<model>_entry``, ``<model>_ps_<i>``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schemas.manifest import (
    LOOKUP_SIGNATURE,
    EntryInputMode,
    Manifest,
    entry_model_name,
    entry_splits_input,
    lookup_ids_input,
    ps_dir_name,
    ps_model_name,
)

__all__ = ["WARMUP_FILE", "warmup_requests", "write_warmup"]

WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"
ENTRY_DIR = "entry"  # = exporter.ENTRY_DIR (not imported: the exporter imports this module)


def warmup_requests(manifest: Manifest, sub_graph: str, batch_sizes: Sequence[int] = (1, 64)) -> list[Any]:
    """The ``PredictRequest`` protos (official tensorflow_serving.apis) replayed for ``sub_graph`` ("entry"/"ps_<i>")."""
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    dims = {t.name: t.dim for t in manifest.tables}
    requests = []
    if sub_graph == ENTRY_DIR:
        for batch in batch_sizes:
            req = predict_pb2.PredictRequest()
            req.model_spec.name = entry_model_name(manifest.model_name)
            req.model_spec.signature_name = manifest.entry.signature_name
            if manifest.entry.input_mode is EntryInputMode.POOLED:
                for f in manifest.sparse_features:
                    req.inputs[f.name].CopyFrom(
                        tf.make_tensor_proto(np.zeros((batch, dims[f.table]), np.float32))
                    )
            else:
                for name, arr in _unique_zeros(manifest, batch).items():
                    req.inputs[name].CopyFrom(tf.make_tensor_proto(arr))
            for d in manifest.dense_features:
                req.inputs[d.name].CopyFrom(tf.make_tensor_proto(np.zeros((batch, d.dim), np.float32)))
            requests.append(req)
        return requests
    shard = int(sub_graph.removeprefix("ps_"))
    req = predict_pb2.PredictRequest()
    req.model_spec.name = ps_model_name(manifest.model_name, shard)
    req.model_spec.signature_name = LOOKUP_SIGNATURE
    for t in manifest.tables:
        req.inputs[lookup_ids_input(t.name)].CopyFrom(tf.make_tensor_proto(np.zeros((1,), np.int64)))
    return [req]


def _unique_zeros(manifest: Manifest, batch: int) -> dict[str, Any]:
    """A ``unique_rows`` entry's sparse inputs for ``batch`` examples that all read one zero row per table (multi
    features: one id each)."""
    import numpy as np
    import tensorflow as tf

    from embedgate.export.entry_graph import input_specs

    out: dict[str, Any] = {}
    for spec in input_specs(manifest):
        if spec.dtype == tf.int32:
            if spec.name.startswith(entry_splits_input("")):
                out[spec.name] = np.arange(batch + 1, dtype=np.int32)
            else:
                out[spec.name] = np.zeros(batch, np.int32)
        elif spec.shape.rank == 2:
            out[spec.name] = tf.zeros([1, spec.shape[1]], spec.dtype)
        else:
            out[spec.name] = np.ones(batch, np.float32)
    return out


def write_warmup(stage: Path, manifest: Manifest) -> None:
    """Write the warmup file into ``stage/entry`` and every ``stage/ps_<i>`` (the SavedModel dirs of one version)."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    for sub in [ENTRY_DIR] + [ps_dir_name(i) for i in range(manifest.num_shards)]:
        path = stage / sub / WARMUP_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        with tf.io.TFRecordWriter(str(path)) as writer:
            for req in warmup_requests(manifest, sub):
                log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=req))
                writer.write(log.SerializeToString())
