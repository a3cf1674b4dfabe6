"""Small real SavedModels for gateway tests (built with TensorFlow in the test process, never in the gateway)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["build_models"]


def build_models(root: Path) -> dict[str, Path]:
    """Served name -> base dir: half (v1, v2), multi, slow, cr (classify/regress). Returns the base dirs."""
    import tensorflow as tf

    out: dict[str, Path] = {}

    # half: y = 0.5 x + 2 (v1) / + 3 (v2); extra signatures "double" and "lookup" (a PS-looking name)
    for version, offset in ((1, 2.0), (2, 3.0)):

        class Half(tf.Module):
            @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
            def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
                return {"y": 0.5 * x + offset}  # noqa: B023

            @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
            def double(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
                return {"y": 2.0 * x}

            @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="t_ids")])
            def lookup(self, t_ids: tf.Tensor) -> dict[str, tf.Tensor]:
                return {"t_values": tf.cast(t_ids, tf.float32)}

        m = Half()
        tf.saved_model.save(
            m,
            str(root / "half" / str(version)),
            signatures={"serving_default": m.serve, "double": m.double, "lookup": m.lookup},
        )
    out["half"] = root / "half"

    class Multi(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 2], tf.float32, name="a"),
                tf.TensorSpec([None], tf.int64, name="n"),
                tf.TensorSpec([None], tf.string, name="s"),
            ]
        )
        def serve(self, a: tf.Tensor, n: tf.Tensor, s: tf.Tensor) -> dict[str, tf.Tensor]:
            return {
                "sum": tf.reduce_sum(a, axis=1) + tf.cast(n, tf.float32),
                "s_bytes": s,
                "len": tf.strings.length(s, unit="BYTE"),
            }

    m = Multi()
    tf.saved_model.save(m, str(root / "multi" / "1"), signatures={"serving_default": m.serve})
    out["multi"] = root / "multi"

    class Slow(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.int32, name="n")])
        def serve(self, n: tf.Tensor) -> dict[str, tf.Tensor]:
            limit = tf.reduce_max(n)
            _, acc = tf.while_loop(
                lambda i, acc: i < limit,
                lambda i, acc: (i + 1, acc + 1.0),
                (tf.constant(0), tf.constant(0.0)),
            )
            return {"y": tf.cast(n, tf.float32) * 0.0 + acc}

    m = Slow()
    tf.saved_model.save(m, str(root / "slow" / "1"), signatures={"serving_default": m.serve})
    out["slow"] = root / "slow"

    # cr: TF1 classification + regression signatures over tf.Example feature x (float, 1 value)
    export = root / "cr" / "1"
    graph = tf.Graph()
    with graph.as_default():
        serialized = tf.compat.v1.placeholder(tf.string, [None], name="tf_example")
        feats = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([1], tf.float32)})
        x = feats["x"]
        value = 2.0 * x[:, 0] + 1.0
        scores = tf.concat([x, 1.0 - x], axis=1)
        sigs = {
            "regress": tf.compat.v1.saved_model.regression_signature_def(serialized, value),
            "classify": tf.compat.v1.saved_model.classification_signature_def(serialized, None, scores),
        }
        sigs["serving_default"] = sigs["regress"]
        with tf.compat.v1.Session(graph=graph) as sess:
            b = tf.compat.v1.saved_model.Builder(str(export))
            b.add_meta_graph_and_variables(sess, ["serve"], signature_def_map=sigs)
            b.save()
    out["cr"] = root / "cr"
    return out


def build_retyped(base: Path, version: int) -> Path:
    """``retyped``: v1 takes float32 x (y = x + 1), v2 takes int64 x (y = 10 x): a signature change across versions."""
    import tensorflow as tf

    if version == 1:

        class V1(tf.Module):
            @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
            def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
                return {"y": x + 1.0}

        m: tf.Module = V1()
    else:

        class V2(tf.Module):
            @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="x")])
            def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
                return {"y": tf.cast(x, tf.float32) * 10.0}

        m = V2()
    path = base / str(version)
    tf.saved_model.save(m, str(path), signatures={"serving_default": m.serve})  # type: ignore[attr-defined]
    return path
