"""Small SavedModels for the serve-local tests, written atomically (built in a temp dir, then renamed)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

__all__ = ["write_classifier", "write_half_plus", "write_stateful"]


def _publish(build_dir: Path, base: Path, version: int) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    target = base / str(version)
    if target.exists():
        shutil.rmtree(target)
    build_dir.rename(target)
    return target


def _scratch(base: Path) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=".build-", dir=base)) / "model"


def write_half_plus(base: Path, version: int, *, offset: float | None = None) -> Path:
    """``serving_default``: ``x`` float32 [n] -> ``y`` = 0.5 x + offset (default: the version), ``x2`` = 2 x;
    ``times_ten``: ``x`` float32 [n, 1] -> ``z`` = 10 x. A TF2 ``tf.Module``, loaded by serve-local into a Session."""
    import tensorflow as tf

    b = float(version if offset is None else offset)

    class HalfPlus(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = tf.Variable(0.5, dtype=tf.float32)
            self.b = tf.Variable(b, dtype=tf.float32)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": self.a * x + self.b, "x2": 2.0 * x}

        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def times_ten(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"z": 10.0 * x}

    module = HalfPlus()
    build = _scratch(base)
    tf.saved_model.save(
        module, str(build), signatures={"serving_default": module.serve, "times_ten": module.times_ten}
    )
    out = _publish(build, base, version)
    shutil.rmtree(build.parent, ignore_errors=True)
    return out


def write_stateful(base: Path, version: int) -> Path:
    """``insert``: ``keys`` int64 [n], ``values`` float32 [n] -> ``size`` int64 (rows after);
    ``lookup``: ``keys`` int64 [n] -> ``values`` float32 [n] (-1 for unknown). State lives in a MutableHashTable."""
    import tensorflow as tf

    class Store(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, default_value=-1.0)

        @tf.function(
            input_signature=[
                tf.TensorSpec([None], tf.int64, name="keys"),
                tf.TensorSpec([None], tf.float32, name="values"),
            ]
        )
        def insert(self, keys: tf.Tensor, values: tf.Tensor) -> dict[str, tf.Tensor]:
            self.table.insert(keys, values)
            return {"size": self.table.size()}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="keys")])
        def lookup(self, keys: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"values": self.table.lookup(keys)}

    module = Store()
    build = _scratch(base)
    tf.saved_model.save(module, str(build), signatures={"insert": module.insert, "lookup": module.lookup})
    out = _publish(build, base, version)
    shutil.rmtree(build.parent, ignore_errors=True)
    return out


def write_classifier(base: Path, version: int) -> Path:
    """TF1 graph with tf.Example input (feature ``x``: one float): ``serving_default`` = classification
    (classes ``neg``/``pos``, scores [1 - s, s] with s = sigmoid(x)), ``regress`` = regression (``outputs`` = 3 x),
    ``predict`` = predict (``x`` float32 [n] -> ``s``)."""
    import tensorflow as tf

    v1 = tf.compat.v1
    sdu = v1.saved_model.signature_def_utils
    build = _scratch(base)
    graph = tf.Graph()
    with graph.as_default():
        serialized = v1.placeholder(tf.string, [None], name="tf_example")
        parsed = v1.io.parse_example(serialized, {"x": v1.io.FixedLenFeature([1], tf.float32)})
        x = tf.reshape(parsed["x"], [-1])
        s = tf.sigmoid(x)
        scores = tf.stack([1.0 - s, s], axis=1)
        classes = tf.tile(tf.constant([["neg", "pos"]]), [tf.shape(x)[0], 1])
        regression = tf.reshape(3.0 * x, [-1, 1])
        raw = v1.placeholder(tf.float32, [None], name="raw_x")
        raw_s = tf.sigmoid(raw)
        info = v1.saved_model.utils.build_tensor_info
        with v1.Session(graph=graph) as sess:
            builder = v1.saved_model.builder.SavedModelBuilder(str(build))
            builder.add_meta_graph_and_variables(
                sess,
                ["serve"],
                signature_def_map={
                    "serving_default": sdu.classification_signature_def(serialized, classes, scores),
                    "regress": sdu.regression_signature_def(serialized, regression),
                    "predict": sdu.predict_signature_def({"x": raw}, {"s": raw_s}),
                    "classify_no_method": sdu.build_signature_def(
                        {"inputs": info(serialized)}, {"scores": info(scores)}, "tensorflow/serving/predict"
                    ),
                },
            )
            builder.save()
    out = _publish(build, base, version)
    shutil.rmtree(build.parent, ignore_errors=True)
    return out
