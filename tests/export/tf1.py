"""Test helpers: run artifacts the way ``tensorflow_model_server`` does (TF1 Session + MetaGraph tensor names)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embedgate.export.instances import feature_ids
from embedgate.export.pooling import pool
from schemas.manifest import (
    LOOKUP_SIGNATURE,
    EntryInputMode,
    Manifest,
    lookup_ids_input,
    lookup_values_output,
    ps_dir_name,
)
from schemas.partition import shard_for


class Tf1Model:
    """One SavedModel version loaded into its own graph and ``tf.compat.v1.Session`` with tag ``serve``."""

    def __init__(self, path: Path) -> None:
        import tensorflow as tf

        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(graph=self.graph)
        with self.graph.as_default():
            self.meta_graph = tf.compat.v1.saved_model.loader.load(self.session, ["serve"], str(path))
        self.signatures = {k: v for k, v in self.meta_graph.signature_def.items() if not k.startswith("__")}

    def run(self, signature: str, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        sd = self.signatures[signature]
        assert set(feeds) == set(sd.inputs), (signature, sorted(feeds), sorted(sd.inputs))
        fetches = {k: v.name for k, v in sd.outputs.items()}
        return self.session.run(fetches, {sd.inputs[k].name: v for k, v in feeds.items()})

    def close(self) -> None:
        self.session.close()


class Tf1Artifacts:
    """Every servable of one exported model version, loaded as TF Serving would, plus the gateway's data path."""

    def __init__(self, model_dir: Path, manifest: Manifest) -> None:
        self.manifest = manifest
        v = str(manifest.version)
        self.entry = Tf1Model(model_dir / "entry" / v)
        self.ps = [Tf1Model(model_dir / ps_dir_name(i) / v) for i in range(manifest.num_shards)]

    def lookup(self, table: str, ids: Sequence[int]) -> np.ndarray:
        """Rows of ``ids`` in ``table``: each id asked of its shard through the ``lookup`` signature."""
        ids_arr = np.asarray(ids, np.int64)
        dim = self.manifest.table(table).dim
        out = np.zeros((len(ids_arr), dim), np.float32)
        shards = shard_for(ids_arr, self.manifest.num_shards) if len(ids_arr) else np.zeros(0, np.int64)
        for i, ps in enumerate(self.ps):
            sel = shards == i
            feeds = {lookup_ids_input(t.name): np.zeros(0, np.int64) for t in self.manifest.tables}
            feeds[lookup_ids_input(table)] = ids_arr[sel]
            out[sel] = ps.run(LOOKUP_SIGNATURE, feeds)[lookup_values_output(table)]
        return out

    def predict(self, instances: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        """Look up, pool (numpy reference) or build unique rows + indices (the gateway's own
        :func:`gateway.embedding.unique_inputs`), run the entry signature: what the gateway does."""
        if self.manifest.entry.input_mode is EntryInputMode.UNIQUE_ROWS:
            return self.entry.run(self.manifest.entry.signature_name, self.unique_feeds(instances))
        feeds: dict[str, np.ndarray] = {}
        for f in self.manifest.sparse_features:
            pooled = []
            for inst in instances:
                ids, w = feature_ids(inst, f.name, f.weights)
                pooled.append(pool(self.lookup(f.table, ids), w, f.combiner))
            feeds[f.name] = np.stack(pooled)
        for d in self.manifest.dense_features:
            feeds[d.name] = np.stack(
                [np.atleast_1d(np.asarray(inst[d.name], np.float32)) for inst in instances]
            ).reshape(len(instances), d.dim)
        return self.entry.run(self.manifest.entry.signature_name, feeds)

    def close(self) -> None:
        for m in [self.entry, *self.ps]:
            m.close()

    def unique_feeds(self, instances: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        """A ``unique_rows`` entry's feeds for ``instances`` (int ids), built by the gateway's functions."""
        from gateway.embedding import plan_lookups, unique_inputs
        from gateway.features import FeatureBatch, SparseInput, drop_padding
        from schemas.wire import Bfloat16Bits

        m = self.manifest
        sparse = {}
        for f in m.sparse_features:
            per = [feature_ids(inst, f.name, f.weights) for inst in instances]
            splits = np.zeros(len(per) + 1, np.int64)
            np.cumsum([len(i) for i, _ in per], out=splits[1:])
            ids = np.array([x for i, _ in per for x in i], np.int64)
            weights = np.array([x for _, w in per for x in w], np.float32) if f.weights else None
            sparse[f.name] = SparseInput(ids=ids, row_splits=splits, weights=weights)
        dense = {
            d.name: np.stack([np.atleast_1d(np.asarray(i[d.name], np.float32)) for i in instances]).reshape(
                len(instances), d.dim
            )
            for d in m.dense_features
        }
        batch = drop_padding(FeatureBatch(size=len(instances), sparse=sparse, dense=dense), m)
        plan = plan_lookups(batch, m)
        values = [{t: self.lookup(t, ids) for t, ids in shard.items()} for shard in plan.shard_ids]
        feeds = {**unique_inputs(plan, values, batch, m), **batch.dense}
        for k, v in feeds.items():
            if isinstance(v, Bfloat16Bits):
                import ml_dtypes

                feeds[k] = v.view(np.ndarray).view(ml_dtypes.bfloat16)
        return feeds
