"""The export self-check: run the staged entry + PS SavedModels on sample inputs and compare with the model.

Before a version is published, :func:`check_staged` loads the staged ``ps_<i>`` and ``entry`` SavedModels, does what
the gateway does with the gateway's own functions (drop the padding of ``mask_zero`` features, dedupe and look every
id up on its shard, then build the entry's inputs: rows pooled in numpy for a ``pooled`` entry, unique rows plus
indices for a ``unique_rows`` one; call the entry signature) on :func:`sample_instances`, and compares the outputs
with a :class:`Reference` (the Keras model itself, or ``dense_model(pooled(tables))`` for a decomposed export). A
mismatch raises :class:`SelfCheckError` naming the output, the feature whose pooled embedding differs and the
likely cause (combiner, weights, mask, or the entry cut), found by re-pooling the same rows every other way.

Sample inputs: per example, every sparse feature gets ids that exist in its table (multi features 1..L ids; a
weighted feature random weights in [0.2, 2]), every dense feature random values; deterministic (seeded).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from embedgate.export.declaration import DeclarationError
from embedgate.export.instances import feature_ids
from embedgate.export.pooling import pool
from gateway.features import FeatureBatch, SparseInput
from gateway.lookup_mapping import LookupMapping
from schemas.manifest import (
    LOOKUP_SIGNATURE,
    Combiner,
    EntryInputMode,
    FeatureKind,
    Manifest,
    entry_model_name,
    lookup_ids_input,
    lookup_values_output,
    ps_dir_name,
    ps_model_name,
)
from schemas.partition import shard_for
from schemas.proto import tfs_pb2
from schemas.wire import predict_request_for

__all__ = ["TOLERANCE", "Reference", "SelfCheckError", "SelfCheckReport", "check_staged", "sample_instances"]

Instances = list[dict[str, Any]]

_NO_IDS = np.zeros(0, np.int64)
RTOL = 1e-3
ATOL = 1e-4
# (rtol, atol relative to max(1, max |output|)) by the least precise row dtype of the model's tables and of the unique_rows entry's wire: float16 rows
# round each element to 11 significant bits (relative error <= 2**-11), bfloat16 to 8 (<= 2**-8); the error of an
# output grows with the pooling and the layers after it, so the bounds are 20x the rounding.
TOLERANCE: dict[str, tuple[float, float]] = {
    "float32": (RTOL, ATOL),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}


@dataclass(frozen=True)
class SelfCheckReport:
    """What the self-check measured on its sample examples: the largest absolute difference per output (served vs
    the trained model) and per table (served rows of the sampled ids vs the float32 rows exported, 0 for float32
    storage), and the (rtol, atol) the outputs were held to."""

    output_error: dict[str, float]
    row_error: dict[str, float]
    tolerance: tuple[float, float]


class SelfCheckError(DeclarationError):
    """The exported entry + PS do not reproduce the model; the message names the output, feature and likely cause."""


class Reference(Protocol):
    """What the served model must reproduce."""

    def outputs(self, instances: Instances) -> dict[str, npt.NDArray[Any]]:
        """The model's outputs (by output name) for ``instances`` (gateway instance format)."""

    def pooled(self, instances: Instances) -> dict[str, npt.NDArray[np.float32]] | None:
        """The model's own pooled [B, dim] embedding per sparse feature, or None when it has none of its own."""


@dataclass(frozen=True)
class _Candidate:
    combiner: Combiner
    weights: str  # "declared" | "ignored" | "padding"


def sample_instances(
    manifest: Manifest,
    ids: Mapping[str, npt.NDArray[np.int64]],
    lengths: Mapping[str, int],
    *,
    raw: Mapping[str, Sequence[Any]] | None = None,
    n: int = 12,
    seed: int = 0,
) -> Instances:
    """``n`` instances for ``manifest``'s features: ids drawn from ``ids[table]``, ``lengths[feature]`` = the most ids
    a multi feature may carry (the model's padded length). ``raw[feature]``: the raw values (ints or strings) a
    feature behind a lookup layer takes instead; every one of them appears in some example when ``n`` allows."""
    rng = np.random.default_rng(seed)
    out: Instances = []
    for k in range(n):
        inst: dict[str, Any] = {}
        for f in manifest.sparse_features:
            cand = ids[f.table]
            if raw and f.name in raw:
                values = list(raw[f.name])
                if f.kind is FeatureKind.SINGLE:
                    inst[f.name] = values[-1] if k == n - 1 else values[int(rng.integers(0, len(values)))]
                    continue
                longest = max(1, lengths[f.name])
                count = min([1, longest, 2, max(1, longest - 1), 3][k % 5], longest)
                picked = [values[int(i)] for i in rng.integers(0, len(values), count)]
                if k == n - 1:
                    picked[-1] = values[-1]  # the OOV probe
                inst[f.name] = picked
                if f.weights:
                    inst[f.weights] = rng.uniform(0.2, 2.0, count).round(3).tolist()
                continue
            if f.kind is FeatureKind.SINGLE:
                inst[f.name] = int(rng.choice(cand))
                if f.weights:
                    inst[f.weights] = [round(float(rng.uniform(0.2, 2.0)), 3)]
                continue
            longest = max(1, lengths[f.name])
            count = [1, longest, 2, max(1, longest - 1), 3][k % 5]
            inst[f.name] = [int(x) for x in rng.choice(cand, min(count, longest))]
            if f.mask_zero and k % 3 == 1 and len(inst[f.name]) < longest:
                inst[f.name] += [0] * (longest - len(inst[f.name]))  # padded as Keras input is: dropped
            if f.weights:
                inst[f.weights] = rng.uniform(0.2, 2.0, len(inst[f.name])).round(3).tolist()
        for d in manifest.dense_features:
            inst[d.name] = rng.normal(size=d.dim).round(3).tolist()
        out.append(inst)
    return out


class _Served:
    """The staged version loaded as TF Serving loads it (:class:`~embedgate.localserve.servable.Servable`: the
    ``serve`` MetaGraph in a session, run by its SignatureDefs, as serve-local runs it) and asked with the requests
    the gateway sends: the gateway's own padding drop, lookup plan and entry inputs (:mod:`gateway.embedding`:
    pooled rows, or unique rows + indices, in ``row_dtype`` on the wire), each serialized as the gateway serializes
    it (:func:`schemas.wire.predict_request_for`), the PS ``lookup`` signature of every shard and the entry
    signature. :meth:`close` when done."""

    def __init__(self, stage: Path, manifest: Manifest, mappings: Mapping[str, LookupMapping]) -> None:
        from embedgate.localserve.servable import Servable

        self.manifest = manifest
        self.mappings = mappings
        self.ps: list[Servable] = []
        self.entry: Servable | None = None
        try:
            for i in range(manifest.num_shards):
                self.ps.append(
                    Servable.load(ps_model_name(manifest.model_name, i), 1, stage / ps_dir_name(i))
                )
            self.entry = Servable.load(entry_model_name(manifest.model_name), 1, stage / "entry")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for servable in [*self.ps, *([self.entry] if self.entry is not None else [])]:
            servable.close()
        self.ps, self.entry = [], None

    @staticmethod
    def _predict(
        servable: Any, signature: str, inputs: Sequence[tuple[str, npt.NDArray[Any]]]
    ) -> dict[str, npt.NDArray[Any]]:
        from tensorflow_serving.apis import predict_pb2

        from embedgate.localserve.tensors import decode_tensor

        raw = predict_request_for(tfs_pb2.ModelSpec(name=servable.name, signature_name=signature), inputs)
        resp = servable.predict(predict_pb2.PredictRequest.FromString(raw))
        return {k: decode_tensor(v) for k, v in resp.outputs.items()}

    def rows(self, table: str, ids: Sequence[int] | npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        m = self.manifest
        arr = np.asarray(ids, np.int64)
        out = np.zeros((len(arr), m.table(table).dim), np.float32)
        shards = shard_for(arr, m.num_shards) if len(arr) else np.zeros(0, np.int64)
        for i, ps in enumerate(self.ps):
            sel = shards == i
            inputs = [(lookup_ids_input(t.name), arr[sel] if t.name == table else _NO_IDS) for t in m.tables]
            got = self._predict(ps, LOOKUP_SIGNATURE, inputs)[lookup_values_output(table)]
            out[sel] = np.asarray(got, np.float32).reshape(-1, m.table(table).dim)
        return out

    def ids(self, inst: Mapping[str, Any], f: Any) -> tuple[list[int], list[float]]:
        """The PS keys and weights of ``f`` in ``inst`` (raw values mapped as the gateway maps them, padding of a
        ``mask_zero`` feature dropped)."""
        m = self.mappings.get(f.name)
        if m is None:
            ids, w = feature_ids(inst, f.name, f.weights)
        else:
            raw = inst[f.name]
            values = list(raw) if isinstance(raw, (list, tuple)) else [raw]
            w = (
                [float(x) for x in inst[f.weights]]
                if f.weights and f.weights in inst
                else [1.0] * len(values)
            )
            ids = [int(k) for k in m.keys_for(values)]
        if getattr(f, "mask_zero", False):
            kept = [(i, x) for i, x in zip(ids, w, strict=True) if i != 0]
            ids, w = [i for i, _ in kept], [x for _, x in kept]
        return ids, w

    def batch(self, instances: Instances) -> FeatureBatch:
        """``instances`` as the gateway's :class:`FeatureBatch` (PS keys, padding dropped)."""
        sparse = {}
        for f in self.manifest.sparse_features:
            per = [self.ids(inst, f) for inst in instances]
            splits = np.zeros(len(per) + 1, np.int64)
            np.cumsum([len(i) for i, _ in per], out=splits[1:])
            ids = np.array([x for i, _ in per for x in i], np.int64)
            weights = np.array([x for _, w in per for x in w], np.float32) if f.weights else None
            sparse[f.name] = SparseInput(ids=ids, row_splits=splits, weights=weights)
        dense = {
            d.name: np.stack([np.atleast_1d(np.asarray(i[d.name], np.float32)) for i in instances]).reshape(
                len(instances), d.dim
            )
            for d in self.manifest.dense_features
        }
        return FeatureBatch(size=len(instances), sparse=sparse, dense=dense)

    def pooled(self, instances: Instances) -> dict[str, npt.NDArray[np.float32]]:
        out = {}
        for f in self.manifest.sparse_features:
            vecs = []
            for inst in instances:
                ids, w = self.ids(inst, f)
                vecs.append(pool(self.rows(f.table, ids), w, f.combiner))
            out[f.name] = np.stack(vecs)
        return out

    def entry_inputs(self, instances: Instances) -> dict[str, np.ndarray]:
        """The entry's inputs as the gateway builds them (:func:`gateway.embedding.pool` or
        :func:`~gateway.embedding.unique_inputs`), dense features included."""
        from gateway.embedding import plan_lookups, unique_inputs
        from gateway.embedding import pool as gateway_pool

        batch = self.batch(instances)
        plan = plan_lookups(batch, self.manifest)
        values = [{t: self.rows(t, ids) for t, ids in shard.items()} for shard in plan.shard_ids]
        build = gateway_pool if self.manifest.entry.input_mode is EntryInputMode.POOLED else unique_inputs
        return {**build(plan, values, batch, self.manifest), **batch.dense}

    def outputs(self, instances: Instances) -> dict[str, Any]:
        assert self.entry is not None, "closed"
        inputs = sorted(self.entry_inputs(instances).items())
        return self._predict(self.entry, self.manifest.entry.signature_name, inputs)


def check_staged(
    stage: Path,
    manifest: Manifest,
    reference: Reference,
    instances: Instances,
    lengths: Mapping[str, int] | None = None,
    mappings: Mapping[str, LookupMapping] | None = None,
    rows: Mapping[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]] | None = None,
) -> SelfCheckReport:
    """Raise :class:`SelfCheckError` unless the staged version reproduces ``reference`` on ``instances``, within
    :data:`TOLERANCE` of the least precise ``row_dtype``; return what was measured.

    ``lengths``: the model's padded length per multi feature (lets the diagnosis recognise pooling over padding).
    ``rows``: table -> (ids, float32 rows) exported, for the row error (up to 64 ids a table are compared).
    """
    served = _Served(stage, manifest, mappings or {})
    try:
        return _check(served, manifest, reference, instances, lengths, rows)
    finally:
        served.close()


def _check(
    served: _Served,
    manifest: Manifest,
    reference: Reference,
    instances: Instances,
    lengths: Mapping[str, int] | None,
    rows: Mapping[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]] | None,
) -> SelfCheckReport:
    tol = max(
        [TOLERANCE[t.row_dtype] for t in manifest.tables] + [TOLERANCE[manifest.entry.row_dtype.value]],
        key=lambda x: x[0],
    )
    row_error = {name: _row_error(served, name, r) for name, r in (rows or {}).items()}
    got = served.outputs(instances)
    want = reference.outputs(instances)
    bad = []
    output_error = {}
    for o in manifest.entry.outputs:
        g = np.asarray(got[o.name], np.float64)
        w = np.asarray(want[o.name], np.float64).reshape(g.shape)
        diff = np.abs(g - w)
        diff = diff[np.isfinite(diff)]  # NaN in both (equal_nan) is no error
        output_error[o.name] = float(diff.max()) if diff.size else 0.0
        if not _close(g, w, tol):
            bad.append(f"{o.name!r} (max abs diff {float(np.max(np.abs(g - w))):.4g})")
    if not bad:
        return SelfCheckReport(output_error, row_error, tol)
    pooled = served.pooled(instances)
    head = (
        f"self-check failed: the exported entry + PS do not reproduce the model on {len(instances)} sample "
        f"examples: output {', '.join(bad)} differs"
    )
    own = reference.pooled(instances)
    if own is None:
        raise SelfCheckError(
            f"{head}. The pooled inputs were computed from the tables as declared, so the entry itself differs "
            "from the dense model"
        )
    causes = []
    for f in manifest.sparse_features:
        mine = np.asarray(own[f.name], np.float64)
        if _close(pooled[f.name].astype(np.float64), mine):
            continue
        causes.append(_diagnose(f, served, instances, mine, (lengths or {}).get(f.name)))
    if not causes:
        raise SelfCheckError(
            f"{head}, although every sparse feature's pooled embedding matches the model's. A model input reaches "
            "the outputs in a way the entry cut does not reproduce (a dense feature with the wrong dim or order, "
            "or an undeclared path)"
        )
    raise SelfCheckError(f"{head}. {' '.join(causes)} No version was published")


def _diagnose(
    f: Any,
    served: _Served,
    instances: Instances,
    model_pooled: npt.NDArray[np.float64],
    length: int | None,
) -> str:
    """Name the likely cause for feature ``f`` by re-pooling its rows every other way and seeing which one matches."""
    declared = f"combiner {f.combiner.value}" + (f", weights {f.weights!r}" if f.weights else "")
    as_declared = _pool_as(f, served, instances, _Candidate(f.combiner, "declared"), length)
    prefix = (
        f"Sparse feature {f.name!r}: the model's pooled embedding differs from what the gateway computes "
        f"({declared}; max abs diff {float(np.max(np.abs(as_declared - model_pooled))):.4g})."
    )
    for cand in _candidates(f, length):
        if _close(_pool_as(f, served, instances, cand, length), model_pooled):
            return f"{prefix} {_explain(f, cand)}"
    return (
        f"{prefix} No other combiner or weighting reproduces it: check the pooled layer ({f.name!r}'s `pooled`), "
        "that its table is the declared one, and the mask/weights inputs."
    )


def _candidates(f: Any, length: int | None) -> list[_Candidate]:
    out = []
    hows = (
        ("declared", "ignored", "padding")
        if f.kind is FeatureKind.MULTI and length
        else ("declared", "ignored")
    )
    for how in hows:
        for c in Combiner:
            if (c, how) != (f.combiner, "declared"):
                out.append(_Candidate(c, how))
    return out


def _pool_as(
    f: Any, served: _Served, instances: Instances, cand: _Candidate, length: int | None
) -> npt.NDArray[np.float64]:
    vecs = []
    for inst in instances:
        ids, w = served.ids(inst, f)
        weights: list[float] | None = None if cand.weights == "ignored" else w
        if cand.weights == "padding" and length:
            ids, weights = ids + [0] * (length - len(ids)), None  # padding id 0 pooled like a real id
        vecs.append(pool(served.rows(f.table, ids), weights, cand.combiner))
    return np.stack(vecs).astype(np.float64)


def _explain(f: Any, cand: _Candidate) -> str:
    if cand.weights == "padding":
        return (
            f"Likely cause: mask: the model pools the padding positions of {f.name!r} too ({cand.combiner.value} "
            "over the whole padded length); give the pooling layer the padding mask (declare `mask:` with a 0/1 "
            "input, or use Embedding(mask_zero=True) with a mask-aware pooling layer)."
        )
    if cand.weights == "ignored" and f.weights:
        extra = "" if cand.combiner is f.combiner else f" and combines with {cand.combiner.value}"
        return (
            f"Likely cause: weights: the model does not apply the per-id weights {f.weights!r}{extra}; remove "
            f"`weights` from the declaration or feed them to the pooling layer."
        )
    return (
        f"Likely cause: combiner: the model pools {f.name!r} with {cand.combiner.value}, the declaration says "
        f"`combiner: {f.combiner.value}`."
    )


def _row_error(
    served: _Served, table: str, rows: tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]
) -> float:
    """The largest absolute difference between the served and the exported rows of up to 64 of ``table``'s ids."""
    ids, vecs = rows
    pick = (
        np.linspace(0, len(ids) - 1, min(64, len(ids))).astype(np.int64)
        if len(ids)
        else np.zeros(0, np.int64)
    )
    if not len(pick):
        return 0.0
    got = served.rows(table, ids[pick].tolist())
    return float(np.max(np.abs(got.astype(np.float64) - vecs[pick].astype(np.float64))))


def _close(
    got: npt.NDArray[np.float64], want: npt.NDArray[np.float64], tol: tuple[float, float] = (RTOL, ATOL)
) -> bool:
    if got.shape != want.shape:
        return False
    scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    return bool(np.allclose(got, want, rtol=tol[0], atol=tol[1] * scale, equal_nan=True))
