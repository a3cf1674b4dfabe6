"""Embedding-model features sent as gRPC tensors -> one validated :class:`~gateway.features.FeatureBatch`. Pure.

Tensors are named like the REST features (the manifest's names; ``GetModelMetadata`` lists them):

* single-id feature: integer ids ``[B]`` (or ``[B, 1]``);
* multi-id feature: integer ids ``[B, L]``, ``-1`` where a row has no id (a ragged batch is padded with ``-1``, so
  ``-1`` is never an id here; rows may be all ``-1``; at most ``max_ids`` real ids per row);
* its weights (the manifest's ``weights`` name, optional): floats of the ids' shape, finite; ignored where the id is
  ``-1``; missing means every weight is 1;
* dense feature: floats ``[B, dim]`` (or ``[B]`` when ``dim`` is 1).

Ids may be int32 or int64 (``tf.make_tensor_proto`` of Python ints gives int32), values any float or integer dtype
(converted to float32). A string-lookup feature (``StringLookup`` in the model, :mod:`gateway.lookup_mapping`) takes
DT_STRING ``[B]`` / ``[B, L]`` instead, padded with the empty string ``b""`` (never a value here); an integer-lookup
feature takes raw ids like any other. Lookup features are mapped to PS keys (vocabulary key or OOV) like REST's
(:func:`gateway.features.map_lookups`). Every error is :class:`~gateway.errors.InvalidArgument` naming the feature.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import numpy as np

from gateway.codec.numeric import numeric_ndarray
from gateway.codec.tensor import to_ndarray
from gateway.errors import GatewayError, InvalidArgument, clip
from gateway.features import FeatureBatch, SparseInput, map_lookups, string_features
from gateway.lookup_mapping import LookupMapping, lookups_of
from schemas.manifest import DenseFeatureSpec, FeatureKind, Manifest, SparseFeatureSpec
from schemas.proto import tfs_pb2

__all__ = ["PAD_ID", "PAD_STRING", "batch_from_tensors"]

PAD_ID: Final = -1
PAD_STRING: Final = b""


def batch_from_tensors(tensors: Mapping[str, tfs_pb2.TensorProto], manifest: Manifest) -> FeatureBatch:
    """Validate and assemble ``tensors`` (input name -> TensorProto) for ``manifest``'s features."""
    known = {f.name for f in manifest.sparse_features}
    known |= {f.weights for f in manifest.sparse_features if f.weights}
    known |= {d.name for d in manifest.dense_features}
    for name in tensors:
        if name not in known:
            raise InvalidArgument(f"input {clip(name)!r}: unknown feature; {_expected(manifest)}")
    arrays = {name: _decode(name, t) for name, t in tensors.items()}
    size = _batch_size(arrays, manifest)
    lookups = lookups_of(manifest)
    strings = string_features(manifest) if lookups else frozenset()
    sparse = {
        f.name: _sparse(f, arrays, size, lookups[f.name] if f.name in strings else None)
        for f in manifest.sparse_features
    }
    dense = {d.name: _dense(d, arrays, size) for d in manifest.dense_features}
    return map_lookups(FeatureBatch(size=size, sparse=sparse, dense=dense), manifest)


def _decode(name: str, t: tfs_pb2.TensorProto) -> np.ndarray:
    fast = numeric_ndarray(t)  # ids and values are small tensors: skip to_ndarray's fixed cost
    if fast is not None:
        return fast
    try:
        return to_ndarray(t)
    except GatewayError as exc:
        raise InvalidArgument(f"feature {name!r}: cannot read the tensor: {exc.message}") from None


def _batch_size(arrays: Mapping[str, np.ndarray], manifest: Manifest) -> int:
    required = [f.name for f in manifest.sparse_features] + [d.name for d in manifest.dense_features]
    for name in required:
        if name not in arrays:
            raise InvalidArgument(f"feature {name!r}: missing; {_expected(manifest)}")
    first = required[0]
    if arrays[first].ndim == 0:
        raise InvalidArgument(f"feature {first!r}: expected a tensor with a batch dimension, got a scalar")
    size = int(arrays[first].shape[0])
    if size == 0:
        raise InvalidArgument(f"feature {first!r}: the batch holds no examples")
    for name, arr in arrays.items():
        if arr.ndim == 0 or arr.shape[0] != size:
            raise InvalidArgument(
                f"feature {name!r} has shape {list(arr.shape)} but feature {first!r} has {size} examples; "
                "every feature needs one row per example"
            )
    return size


def _ints(name: str, arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind not in "iu":
        raise InvalidArgument(f"feature {name!r}: expected int64 (or int32) ids, got {_dtype(arr)}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise InvalidArgument(f"feature {name!r}: an id is outside int64")
    return arr.astype(np.int64, copy=False)


def _floats(name: str, arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind not in "fiu":
        raise InvalidArgument(f"feature {name!r}: expected float values, got {_dtype(arr)}")
    with np.errstate(over="ignore"):
        return arr.astype(np.float32, copy=False)


def _strings(name: str, arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind != "O":
        raise InvalidArgument(
            f"feature {name!r}: expected a string tensor (DT_STRING; the model maps this feature with a "
            f"StringLookup), got {_dtype(arr)}"
        )
    return arr


def _sparse(
    f: SparseFeatureSpec, arrays: Mapping[str, np.ndarray], size: int, strings: LookupMapping | None
) -> SparseInput:
    """Ids as given (string features: raw keys of the strings, padding dropped); the caller maps lookups."""
    ids = _strings(f.name, arrays[f.name]) if strings is not None else _ints(f.name, arrays[f.name])
    weights = None
    if f.weights and f.weights in arrays:
        weights = _floats(f.weights, arrays[f.weights])
        if weights.shape != ids.shape:
            raise InvalidArgument(
                f"feature {f.weights!r}: weights of shape {list(weights.shape)} do not match the ids of "
                f"{f.name!r} of shape {list(ids.shape)}"
            )
    if f.kind is FeatureKind.SINGLE:
        if ids.shape not in ((size,), (size, 1)):
            raise InvalidArgument(
                f"feature {f.name!r}: expected one id per example, shape [{size}] or [{size}, 1], "
                f"got {list(ids.shape)}"
            )
        flat_w = None if weights is None else weights.reshape(size)
        _check_finite(f.weights or "", flat_w)
        flat = strings.string_keys(ids.reshape(size), size) if strings is not None else ids.reshape(size)
        return SparseInput(ids=flat, row_splits=np.arange(size + 1, dtype=np.int64), weights=flat_w)
    pad = PAD_STRING if strings is not None else PAD_ID
    if ids.ndim != 2:
        raise InvalidArgument(
            f"feature {f.name!r}: expected ids of shape [{size}, L] padded with {pad!r}, got {list(ids.shape)}"
        )
    present = ids != pad
    lengths = present.sum(axis=1)
    if f.max_ids is not None and lengths.size and int(lengths.max()) > f.max_ids:
        i = int(np.argmax(lengths > f.max_ids))
        raise InvalidArgument(
            f"feature {f.name!r} at example {i}: {int(lengths[i])} ids, more than max_ids {f.max_ids}"
        )
    row_splits = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(lengths, out=row_splits[1:])
    flat_w = None if weights is None else weights[present]
    _check_finite(f.weights or "", flat_w)
    kept = ids[present]
    flat = strings.string_keys(kept, len(kept)) if strings is not None else kept
    return SparseInput(ids=flat, row_splits=row_splits, weights=flat_w)


def _check_finite(name: str, weights: np.ndarray | None) -> None:
    if weights is not None and not bool(np.isfinite(weights).all()):
        raise InvalidArgument(f"feature {name!r}: weights must be finite float32 values")


def _dense(d: DenseFeatureSpec, arrays: Mapping[str, np.ndarray], size: int) -> np.ndarray:
    values = _floats(d.name, arrays[d.name])
    if values.shape == (size,) and d.dim == 1:
        values = values.reshape(size, 1)
    if values.shape != (size, d.dim):
        raise InvalidArgument(
            f"feature {d.name!r}: expected float values of shape [{size}, {d.dim}], got {list(values.shape)}"
        )
    return values


def _dtype(arr: np.ndarray) -> str:
    return "string" if arr.dtype.kind in "OSU" else str(arr.dtype)


def _expected(manifest: Manifest) -> str:
    sparse = ", ".join(f.name for f in manifest.sparse_features)
    dense = ", ".join(d.name for d in manifest.dense_features) or "none"
    weights = ", ".join(f.weights for f in manifest.sparse_features if f.weights) or "none"
    return f"the model takes sparse features {sparse}; dense features {dense}; optional weights {weights}"
