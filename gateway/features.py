"""Request features of an embedding model -> one validated, numpy :class:`FeatureBatch`. Pure, no I/O, no TensorFlow.

Four request forms give the same batch for the same data (docs/dev/contracts.md "Gateway request format"):

* row JSON (:func:`batch_from_instances`): ``{"<sparse>": 12, "<multi>": [3, 4], "<multi_weights>": [0.5, 1],
  "<dense>": [0.1, 0.2]}`` per example, or ``{"b64": "<base64 serialized tf.Example>"}`` per example (forms may mix);
* columnar JSON (:func:`batch_from_columns`): ``{"<sparse>": [12, 13], "<multi>": [[3, 4], []], ...}``;
* classify/regress :class:`tfs_pb2.Input` (:func:`batch_from_input`), context features merged into every example.

Value rules (JSON): a ``single`` feature takes one integer id (or a one-element list); a ``multi`` feature a list of
integer ids (maybe empty, at most ``max_ids``); ids are JSON integers within int64 (``true``, ``1.0``, ``"1"`` are
rejected). Weights (the manifest's ``weights`` name) are optional, numbers (not bools), finite, one per id (a number
or a one-element list for single features); missing weights mean 1. A dense feature takes ``dim`` numbers (a bare
number when ``dim == 1``); NaN/Infinity pass through and finite values beyond float32 become +-inf, as TF Serving
treats DT_FLOAT. Weights must still be finite after that conversion. Unknown or missing features are errors. Values
are what a JSON parser returns (``int``, ``float``, ``str``, ``list``, ``dict``, ``bool``, ``None``); numpy scalars
are not JSON and are rejected.

tf.Example rules: ids are an ``int64_list``; weights and dense values a ``float_list`` **or** an ``int64_list``
(converted to float32: classify/regress JSON turns ``3`` into an int64_list, so integer-valued dense features must
work); a feature with no kind set counts as an empty list; a ``bytes_list`` or a float_list of ids is an error.
Features the model does not read are **ignored** in tf.Examples (as TF's example parsing ignores them; Examples
often carry labels), but are errors in JSON.

Lookup features (the model maps them with ``IntegerLookup`` / ``StringLookup``; ``lookups.json`` paired with the
manifest, :func:`gateway.lookup_mapping.lookups_of`): clients send the raw values. An integer-lookup feature takes
int64 ids as above; a string-lookup feature takes JSON strings where other features take ids (``"alice"`` or
``["alice"]`` for single, ``["a", "b"]`` for multi) and a ``bytes_list`` in a tf.Example. Every value is then mapped
to its PS key (``LookupMapping.map_keys``: the value's key if the vocabulary holds it, else the OOV key), so
``SparseInput.ids`` always holds PS keys. A number for a string feature, or a string for an integer one, is an error.

Every error is :class:`gateway.errors.InvalidArgument` and names the feature and, where there is one, the example
index: ``feature 'genres' at example 3: expected a list of int64 ids, got "abc"``.

This module is the reference. The REST route first asks the native parser (``gateway.native.request_features``,
``native/src/features.rs``), which gives the same batch for the row and columnar bodies it takes and declines every
other body (errors included) to :func:`batch_from_instances` / :func:`batch_from_columns` here.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import numpy as np
import numpy.typing as npt

from gateway.codec.example import parse_example
from gateway.codec.rapidjson import b64_decode
from gateway.errors import InvalidArgument, clip
from gateway.lookup_mapping import LookupKind, LookupMapping, lookups_of
from schemas.manifest import DenseFeatureSpec, FeatureKind, Manifest, SparseFeatureSpec
from schemas.proto import tfs_pb2

__all__ = [
    "FeatureBatch",
    "SparseInput",
    "batch_from_columns",
    "batch_from_input",
    "batch_from_instances",
    "client_signature",
    "drop_padding",
    "map_lookups",
    "string_features",
]

PREDICT_METHOD: Final = "tensorflow/serving/predict"

_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
_INT_ONLY: Final = {int}
_STR_ONLY: Final = {str}
_NUMBER_TYPES: Final = {int, float}

# One example's weights: Python numbers from JSON, a float32 array from a tf.Example.
_Floats = Sequence[float] | npt.NDArray[np.float32]


# eq=False: arrays have no truth value, so a generated __eq__ would raise; compare arrays explicitly.
@dataclass(frozen=True, eq=False)
class SparseInput:
    """One sparse feature over the batch, CSR-style: example ``i``'s ids are ``ids[row_splits[i]:row_splits[i+1]]``.

    ``ids`` int64 [nnz]; ``row_splits`` int64 [batch + 1] starting at 0, non-decreasing, ending at nnz (a single
    feature has ``row_splits == arange(batch + 1)``); ``weights`` float32 [nnz], or None when no example sent any
    (every weight is 1). Arrays are owned by the batch; treat them as read-only.
    """

    ids: np.ndarray
    row_splits: np.ndarray
    weights: np.ndarray | None


@dataclass(frozen=True, eq=False)
class FeatureBatch:
    """A validated batch: every sparse feature of the manifest in ``sparse``, every dense one in ``dense``
    (float32 [size, dim]). ``size`` is the number of examples."""

    size: int
    sparse: dict[str, SparseInput]
    dense: dict[str, np.ndarray]


# -- public entry points ----------------------------------------------------------------------------------------------


def batch_from_instances(instances: list[Any], manifest: Manifest) -> FeatureBatch:
    """Row format: ``instances`` is a non-empty list; item ``i`` is an object of features or ``{"b64": ...}``."""
    if not isinstance(instances, list):
        raise InvalidArgument(f"'instances' must be a list of examples, got {_show(instances)}")
    if not instances:
        raise InvalidArgument("'instances' must hold at least one example")
    fast = _fast_rows(instances, manifest)
    if fast is not None:
        return map_lookups(fast, manifest)
    builder = _Builder(manifest, len(instances))
    for i, item in enumerate(instances):
        if not isinstance(item, dict):
            raise InvalidArgument(
                f'example {i}: expected an object of features or {{"b64": ...}}, got {_show(item)}'
            )
        if len(item) == 1 and isinstance(item.get("b64"), str):
            try:
                data = b64_decode(item["b64"])
            except InvalidArgument as exc:
                raise InvalidArgument(f"example {i}: {exc.message}") from None
            builder.add_example(i, parse_example(data, i))
        else:
            builder.add_json(i, item)
    return map_lookups(builder.finish(), manifest)


def batch_from_columns(inputs: Any, manifest: Manifest) -> FeatureBatch:
    """Columnar format: ``inputs`` maps every feature to a list with one value per example (same length for all)."""
    if not isinstance(inputs, dict):
        raise InvalidArgument(
            f"'inputs' must be an object mapping each feature to a list of per-example values, got {_show(inputs)}"
        )
    roles = _roles(manifest)
    size: int | None = None
    first = ""
    for name, column in inputs.items():
        if name not in roles:
            raise InvalidArgument(f"feature {clip(name)!r}: unknown feature; {_expected_names(manifest)}")
        if not isinstance(column, list):
            raise InvalidArgument(
                f"feature {name!r}: expected a list with one value per example, got {_show(column)}"
            )
        if size is None:
            size, first = len(column), name
        elif len(column) != size:
            raise InvalidArgument(
                f"feature {name!r} has {len(column)} examples but feature {first!r} has {size}; "
                "every feature needs one value per example"
            )
    for name, (role, _spec) in roles.items():
        if role != "weights" and name not in inputs:
            raise InvalidArgument(f"feature {name!r}: missing; {_expected_names(manifest)}")
    fast = _fast_columns(inputs, size or 0, manifest)
    if fast is not None:
        return map_lookups(fast, manifest)
    builder = _Builder(manifest, size or 0)
    for name, column in inputs.items():
        builder.add_json_column(name, column)
    return map_lookups(builder.finish(), manifest)


def batch_from_input(inp: tfs_pb2.Input, manifest: Manifest) -> FeatureBatch:
    """classify/regress ``Input``: ``example_list`` or ``example_list_with_context`` (context in every example)."""
    kind = inp.WhichOneof("kind")
    if kind is None:
        raise InvalidArgument("Input is empty: it holds neither example_list nor example_list_with_context")
    if kind == "example_list":
        examples, context = inp.example_list.examples, None
    else:
        examples = inp.example_list_with_context.examples
        context = inp.example_list_with_context.context.features.feature
    if not examples:
        raise InvalidArgument("Input holds no examples")
    builder = _Builder(manifest, len(examples))
    for i, example in enumerate(examples):
        builder.add_example(i, example, context)
    return map_lookups(builder.finish(), manifest)


def string_features(manifest: Manifest) -> frozenset[str]:
    """Sparse features whose clients send strings (a ``StringLookup`` or a ``Hashing`` of strings) for ``manifest``."""
    return frozenset(name for name, m in lookups_of(manifest).items() if m.takes_strings)


def map_lookups(batch: FeatureBatch, manifest: Manifest) -> FeatureBatch:
    """``batch`` with the ids of every lookup feature of ``manifest`` mapped to PS keys (vocabulary key or OOV), then
    the padding of every ``mask_zero`` feature dropped (:func:`drop_padding`).

    The ids of a string feature must already be :func:`~gateway.lookup_mapping.string_key` hashes (the parsers do
    that); a manifest without lookups or masked features returns ``batch`` itself. Every parser (JSON rows and
    columns, tf.Example, gRPC tensors) ends here, so every path pools the same ids.
    """
    lookups = lookups_of(manifest)
    if lookups:
        sparse = dict(batch.sparse)
        for name, mapping in lookups.items():
            s = sparse.get(name)
            if s is not None:
                sparse[name] = SparseInput(
                    ids=mapping.map_keys(s.ids), row_splits=s.row_splits, weights=s.weights
                )
        batch = FeatureBatch(size=batch.size, sparse=sparse, dense=batch.dense)
    return drop_padding(batch, manifest)


def drop_padding(batch: FeatureBatch, manifest: Manifest) -> FeatureBatch:
    """``batch`` without the id-0 entries (and their weights) of every ``mask_zero`` feature of ``manifest``.

    Keras's ``Embedding(mask_zero=True)`` masks id 0 and a mask-aware pooling layer (``GlobalAveragePooling1D``, ...)
    skips it: a client padding ``[5, 9, 13, 0, 0]`` the way Keras input is padded is pooled over ``[5, 9, 13]``.
    Ids are PS keys here (after any lookup mapping; a ``Hashing`` mask value is bin 0). ``batch`` itself when
    nothing is dropped.
    """
    masked = [f.name for f in manifest.sparse_features if f.mask_zero]
    if not masked:
        return batch
    sparse = dict(batch.sparse)
    changed = False
    for name in masked:
        s = sparse.get(name)
        if s is None or not s.ids.size:
            continue
        keep = s.ids != 0
        if keep.all():
            continue
        kept = np.zeros(s.ids.size + 1, dtype=np.int64)
        np.cumsum(keep, out=kept[1:])
        sparse[name] = SparseInput(
            ids=s.ids[keep],
            row_splits=kept[s.row_splits],
            weights=None if s.weights is None else s.weights[keep],
        )
        changed = True
    return FeatureBatch(size=batch.size, sparse=sparse, dense=batch.dense) if changed else batch


def client_signature(
    manifest: Manifest, entry_outputs: Mapping[str, tfs_pb2.TensorInfo]
) -> tfs_pb2.SignatureDef:
    """The predict signature clients see in ``/metadata`` for an embedding model.

    Inputs: single ids int64 [-1]; multi ids int64 [-1, -1] (string for a string-lookup feature); weights float [-1] (single) / [-1, -1] (multi);
    dense float [-1, dim]. Outputs: ``entry_outputs`` as the entry reports them. Tensor names are ``<input>:0``.
    """
    sig = tfs_pb2.SignatureDef(method_name=PREDICT_METHOD)
    strings = string_features(manifest)
    for f in manifest.sparse_features:
        shape = [-1] if f.kind is FeatureKind.SINGLE else [-1, -1]
        dtype = tfs_pb2.DT_STRING if f.name in strings else tfs_pb2.DT_INT64
        _set_info(sig.inputs[f.name], f.name, dtype, shape)
        if f.weights:
            _set_info(sig.inputs[f.weights], f.weights, tfs_pb2.DT_FLOAT, shape)
    for d in manifest.dense_features:
        _set_info(sig.inputs[d.name], d.name, tfs_pb2.DT_FLOAT, [-1, d.dim])
    for name, info in entry_outputs.items():
        sig.outputs[name].CopyFrom(info)
    return sig


def _set_info(info: tfs_pb2.TensorInfo, name: str, dtype: int, shape: list[int]) -> None:
    info.name = f"{name}:0"
    info.dtype = dtype  # type: ignore[assignment]
    info.tensor_shape.dim.extend(tfs_pb2.TensorShapeProto.Dim(size=s) for s in shape)


# -- the fast path: whole columns -> arrays in C ----------------------------------------------------------------------
#
# Each function below returns None as soon as a column is not plainly well formed (a type other than the expected
# ones, a length, a value beyond int64/float32, a weight that is not finite, ...). The caller then runs the
# per-value path (:class:`_Builder`), which gives the same batch for inputs the fast path would have accepted and is
# the only place errors are worded. tests/gateway/test_features_fast.py checks both paths agree.

_LIST_ONLY: Final = {list}
_F32_MAX: Final = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class _Layout:
    """Per-manifest names, computed once: required inputs (ids + dense) and optional weight inputs."""

    sparse: tuple[SparseFeatureSpec, ...]
    dense: tuple[DenseFeatureSpec, ...]
    required: tuple[str, ...]
    weights: tuple[str, ...]


_LAYOUTS: dict[int, tuple[Manifest, _Layout]] = {}


def _layout(manifest: Manifest) -> _Layout:
    hit = _LAYOUTS.get(id(manifest))
    if hit is not None and hit[0] is manifest:
        return hit[1]
    sparse = tuple(manifest.sparse_features)
    dense = tuple(manifest.dense_features)
    layout = _Layout(
        sparse=sparse,
        dense=dense,
        required=tuple(f.name for f in sparse) + tuple(d.name for d in dense),
        weights=tuple(f.weights for f in sparse if f.weights),
    )
    if len(_LAYOUTS) > 256:  # manifests live as long as the app; this only bounds test processes
        _LAYOUTS.clear()
    _LAYOUTS[id(manifest)] = (manifest, layout)
    return layout


_MISSING: Final = object()


def _fast_rows(instances: list[Any], manifest: Manifest) -> FeatureBatch | None:
    """Row JSON without b64 examples, every example with the same keys, as whole columns; None = use the slow path."""
    if set(map(type, instances)) != {dict}:
        return None
    layout = _layout(manifest)
    try:
        columns = {name: [item[name] for item in instances] for name in layout.required}
    except KeyError:
        return None
    n = len(instances)
    keys = len(layout.required)
    for w in layout.weights:
        col = [item.get(w, _MISSING) for item in instances]
        missing = col.count(_MISSING)
        if missing == 0:
            columns[w] = col
            keys += 1
        elif missing != n:
            return None  # some examples send weights and some do not
    if sum(map(len, instances)) != n * keys:
        return None  # an unknown key somewhere
    return _fast_batch(columns, n, layout, lookups_of(manifest))


def _fast_columns(inputs: dict[str, list[Any]], size: int, manifest: Manifest) -> FeatureBatch | None:
    """Columnar JSON (names, list types and sizes already checked by the caller); None = use the slow path."""
    if size == 0:
        return None
    return _fast_batch(inputs, size, _layout(manifest), lookups_of(manifest))


def _fast_batch(
    columns: Mapping[str, list[Any]], n: int, layout: _Layout, lookups: Mapping[str, LookupMapping]
) -> FeatureBatch | None:
    """Raw keys: string features hashed, no vocabulary mapping yet (the caller runs :func:`map_lookups`)."""
    sparse: dict[str, SparseInput] = {}
    for f in layout.sparse:
        lk = lookups.get(f.name)
        to_ids = functools.partial(_fast_strings, lk) if lk is not None and lk.takes_strings else _fast_int64
        if f.kind is FeatureKind.SINGLE:
            ids = to_ids(columns[f.name])
            lengths = None
            row_splits = np.arange(n + 1, dtype=np.int64)
        else:
            got = _fast_lists(columns[f.name], f.max_ids)
            if got is None:
                return None
            lengths, flat = got
            ids = to_ids(flat) if flat else np.empty(0, dtype=np.int64)
            row_splits = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lengths, out=row_splits[1:])
        if ids is None:
            return None
        weights = None
        if f.weights and f.weights in columns:
            weights = _fast_weights(columns[f.weights], lengths)
            if weights is None:
                return None
        sparse[f.name] = SparseInput(ids=ids, row_splits=row_splits, weights=weights)
    dense: dict[str, np.ndarray] = {}
    for d in layout.dense:
        values = _fast_dense(columns[d.name], d.dim)
        if values is None:
            return None
        dense[d.name] = values
    return FeatureBatch(size=n, sparse=sparse, dense=dense)


def _fast_int64(values: list[Any]) -> np.ndarray | None:
    if set(map(type, values)) != _INT_ONLY:
        return None
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return None


def _fast_strings(mapping: LookupMapping, values: list[Any]) -> np.ndarray | None:
    if set(map(type, values)) != _STR_ONLY:
        return None
    return mapping.string_keys(values, len(values))


def _fast_lists(column: list[Any], max_ids: int | None) -> tuple[np.ndarray, list[Any]] | None:
    """(lengths int64 [n], the flattened elements) of a column of lists."""
    if set(map(type, column)) != _LIST_ONLY:
        return None
    lengths = np.fromiter(map(len, column), dtype=np.int64, count=len(column))
    if max_ids is not None and int(lengths.max()) > max_ids:
        return None
    return lengths, list(itertools.chain.from_iterable(column))


def _fast_doubles(values: list[Any]) -> np.ndarray | None:
    if values and not set(map(type, values)) <= _NUMBER_TYPES:
        return None
    try:
        return np.array(values, dtype=np.float64)
    except OverflowError:
        return None


def _fast_weights(column: list[Any], lengths: np.ndarray | None) -> np.ndarray | None:
    """float32 weights, all finite; ``lengths`` is None for a single feature (bare numbers per example)."""
    if lengths is None:
        flat = column
    else:
        got = _fast_lists(column, None)
        if got is None or not np.array_equal(got[0], lengths):
            return None
        flat = got[1]
    as_double = _fast_doubles(flat)
    if as_double is None:
        return None
    if as_double.size and not float(np.abs(as_double).max()) <= _F32_MAX:  # NaN fails too
        return None
    return as_double.astype(np.float32)


def _fast_dense(column: list[Any], dim: int) -> np.ndarray | None:
    types = set(map(type, column))
    if dim == 1 and types <= _NUMBER_TYPES:
        flat = column
    elif types == _LIST_ONLY and set(map(len, column)) == {dim}:
        flat = list(itertools.chain.from_iterable(column))
    else:
        return None
    as_double = _fast_doubles(flat)
    if as_double is None:
        return None
    return _narrow(as_double).reshape(len(column), dim)


def _narrow(as_double: np.ndarray) -> np.ndarray:
    """float64 -> float32; finite values beyond float32 become +-inf without a warning (errstate only then)."""
    if as_double.size and not float(np.abs(as_double).max()) <= _F32_MAX:
        with np.errstate(over="ignore"):
            return as_double.astype(np.float32)
    return as_double.astype(np.float32)


# -- the builder: per-example values -> arrays ------------------------------------------------------------------------

_Role = tuple[
    str, Any
]  # ("ids", SparseFeatureSpec) | ("weights", SparseFeatureSpec) | ("dense", DenseFeatureSpec)


def _roles(manifest: Manifest) -> dict[str, _Role]:
    roles: dict[str, _Role] = {}
    for f in manifest.sparse_features:
        roles[f.name] = ("ids", f)
        if f.weights:
            roles[f.weights] = ("weights", f)
    for d in manifest.dense_features:
        roles[d.name] = ("dense", d)
    return roles


class _Builder:
    """Collects validated per-example values for one batch and assembles the arrays once at the end.

    JSON numbers are type-checked per example but converted to float32 once per feature in :meth:`finish`
    (numpy calls on tiny per-example lists would dominate the cost).
    """

    def __init__(self, manifest: Manifest, size: int) -> None:
        self.manifest = manifest
        self.size = size
        self.roles = _roles(manifest)
        self.strings = {n: m for n, m in lookups_of(manifest).items() if m.takes_strings}
        self.ids: dict[str, list[Sequence[int] | None]] = {
            f.name: [None] * size for f in manifest.sparse_features
        }
        self.weights: dict[str, list[_Floats | None]] = {
            f.name: [None] * size for f in manifest.sparse_features if f.weights
        }
        self.dense: dict[str, np.ndarray] = {
            d.name: np.empty((size, d.dim), dtype=np.float32) for d in manifest.dense_features
        }
        self.dense_seen: dict[str, np.ndarray] = {
            d.name: np.zeros(size, dtype=bool) for d in manifest.dense_features
        }
        # JSON dense rows (example index, Python numbers), converted in finish()
        self.dense_json: dict[str, tuple[list[int], list[list[Any]]]] = {
            d.name: ([], []) for d in manifest.dense_features
        }

    # -- JSON ----------------------------------------------------------------------------------------------------
    def add_json(self, i: int, item: dict[str, Any]) -> None:
        for name, value in item.items():
            role = self.roles.get(name)
            if role is None:
                raise InvalidArgument(
                    f"feature {clip(name)!r} at example {i}: unknown feature; {_expected_names(self.manifest)}"
                )
            self._json_value(role, name, i, value)
        for name, (kind, _spec) in self.roles.items():
            if kind != "weights" and name not in item:
                raise InvalidArgument(
                    f"feature {name!r} at example {i}: missing; {_expected_names(self.manifest)}"
                )

    def add_json_column(self, name: str, column: list[Any]) -> None:
        role = self.roles[name]
        for i, value in enumerate(column):
            self._json_value(role, name, i, value)

    def _json_value(self, role: _Role, name: str, i: int, value: Any) -> None:
        kind, spec = role
        if kind == "ids":
            lk = self.strings.get(spec.name)
            if lk is not None:
                self.ids[spec.name][i] = _json_strings(value, spec, i, lk)
            else:
                self.ids[spec.name][i] = _json_ids(value, spec, i)
        elif kind == "weights":
            self.weights[spec.name][i] = _json_weights(value, spec, i)
        else:
            rows = self.dense_json[name]
            rows[0].append(i)
            rows[1].append(_json_dense(value, spec, i))
            self.dense_seen[name][i] = True

    # -- tf.Example ----------------------------------------------------------------------------------------------
    def add_example(self, i: int, example: tfs_pb2.Example, context: Any = None) -> None:
        fmap = example.features.feature
        for name, (kind, spec) in self.roles.items():
            feature = None
            if name in fmap:
                feature = fmap[name]
                if context is not None and name in context:
                    raise InvalidArgument(
                        f"feature {name!r} at example {i}: present in both the context and the example"
                    )
            elif context is not None and name in context:
                feature = context[name]
            if feature is None:
                if kind != "weights":
                    raise InvalidArgument(
                        f"feature {name!r} at example {i}: missing from the tf.Example; "
                        f"{_expected_names(self.manifest)}"
                    )
                continue
            if kind == "ids":
                self.ids[spec.name][i] = _example_ids(feature, spec, name, i, self.strings.get(spec.name))
            elif kind == "weights":
                self.weights[spec.name][i] = _example_floats(feature, name, i)
            else:
                values = _example_floats(feature, name, i)
                if len(values) != spec.dim:
                    raise InvalidArgument(
                        f"feature {name!r} at example {i}: expected {spec.dim} values, got {len(values)}"
                    )
                self.dense[name][i] = values
                self.dense_seen[name][i] = True

    # -- assembly ------------------------------------------------------------------------------------------------
    def finish(self) -> FeatureBatch:
        sparse: dict[str, SparseInput] = {}
        for f in self.manifest.sparse_features:
            per_example = self.ids[f.name]
            for i, example_ids in enumerate(per_example):
                if example_ids is None:  # every path checks presence first; a guard, not an expected error
                    raise InvalidArgument(f"feature {f.name!r} at example {i}: missing")
            present = cast(list[Sequence[int]], per_example)  # no None left: checked just above
            lengths = np.fromiter(map(len, present), dtype=np.int64, count=self.size)
            row_splits = np.zeros(self.size + 1, dtype=np.int64)
            np.cumsum(lengths, out=row_splits[1:])
            nnz = int(row_splits[-1])
            flat = itertools.chain.from_iterable(present)
            ids = np.fromiter(flat, dtype=np.int64, count=nnz)
            weights = self._weights(f, lengths, row_splits) if f.weights else None
            sparse[f.name] = SparseInput(ids=ids, row_splits=row_splits, weights=weights)
        for name, (index, rows) in self.dense_json.items():
            if rows:
                self.dense[name][index] = _to_float32(rows, name, index)
        for name, seen in self.dense_seen.items():
            if not seen.all():
                raise InvalidArgument(f"feature {name!r} at example {int(np.argmin(seen))}: missing")
        return FeatureBatch(size=self.size, sparse=sparse, dense=self.dense)

    def _weights(
        self, f: SparseFeatureSpec, lengths: np.ndarray, row_splits: np.ndarray
    ) -> np.ndarray | None:
        name = f.weights or ""
        per_example = self.weights[f.name]
        if all(w is None for w in per_example):
            return None
        counts = lengths.tolist()
        for i, (w, n) in enumerate(zip(per_example, counts, strict=True)):
            if w is not None and len(w) != n:
                raise InvalidArgument(
                    f"feature {name!r} at example {i}: expected {n} weights (one per id of {f.name!r}), got {len(w)}"
                )
        filled = [
            w if w is not None else itertools.repeat(1.0, n) for w, n in zip(per_example, counts, strict=True)
        ]
        try:
            as_double = np.fromiter(
                itertools.chain.from_iterable(filled), dtype=np.float64, count=int(row_splits[-1])
            )
        except OverflowError:
            i = next(i for i, w in enumerate(per_example) if w is not None and _beyond_double(w))
            raise InvalidArgument(
                f"feature {name!r} at example {i}: a value is outside the float range"
            ) from None
        out = _narrow(as_double)
        bad = ~np.isfinite(out)
        if bad.any():
            k = int(np.argmax(bad))
            i = int(np.searchsorted(row_splits, k, side="right")) - 1
            raise InvalidArgument(
                f"feature {name!r} at example {i}: weights must be finite float32 values, got {_show(float(out[k]))} "
                f"at position {k - int(row_splits[i])}"
            )
        return out


def _to_float32(rows: list[list[Any]], name: str, index: list[int]) -> np.ndarray:
    """float32 [len(rows), dim] from JSON rows of example ``index``; finite values beyond float32 become +-inf (as
    TF Serving's JSON parser makes them); Python ints too large for a double are an error naming the example."""
    try:
        as_double = np.array(rows, dtype=np.float64)
    except OverflowError:
        i = next(i for i, row in zip(index, rows, strict=True) if _beyond_double(row))
        raise InvalidArgument(
            f"feature {name!r} at example {i}: a value is outside the float range"
        ) from None
    return _narrow(as_double)


def _beyond_double(values: Iterable[Any]) -> bool:
    return any(type(x) is int and abs(x) > _DOUBLE_MAX_INT for x in values)


_DOUBLE_MAX_INT: Final = int(np.finfo(np.float64).max)


# -- JSON value checks ------------------------------------------------------------------------------------------------


def _json_ids(value: Any, spec: SparseFeatureSpec, i: int) -> list[int]:
    if spec.kind is FeatureKind.SINGLE:
        ids = value if type(value) is list else [value]
        if len(ids) != 1 or type(ids[0]) is not int:
            raise InvalidArgument(
                f"feature {spec.name!r} at example {i}: expected one int64 id (an integer or a one-element list), "
                f"got {_show(value)}"
            )
        if not _I64_MIN <= ids[0] <= _I64_MAX:
            raise InvalidArgument(f"feature {spec.name!r} at example {i}: id {ids[0]} is outside int64")
        return ids
    if type(value) is not list:
        raise InvalidArgument(
            f"feature {spec.name!r} at example {i}: expected a list of int64 ids, got {_show(value)}"
        )
    # C-speed checks first; the per-element loop only runs to name the offending element.
    if value and not (
        set(map(type, value)) == _INT_ONLY and min(value) >= _I64_MIN and max(value) <= _I64_MAX
    ):
        for j, x in enumerate(value):
            if type(x) is not int:
                raise InvalidArgument(
                    f"feature {spec.name!r} at example {i}: expected a list of int64 ids, got {_show(x)} "
                    f"at position {j}"
                )
            if not _I64_MIN <= x <= _I64_MAX:
                raise InvalidArgument(
                    f"feature {spec.name!r} at example {i}: id {x} at position {j} is outside int64"
                )
    if spec.max_ids is not None and len(value) > spec.max_ids:
        raise InvalidArgument(
            f"feature {spec.name!r} at example {i}: {len(value)} ids, more than max_ids {spec.max_ids}"
        )
    return value


def _layer_kind(mapping: LookupMapping) -> str:
    """How error messages name the layer that maps a string feature."""
    return "Hashing layer" if mapping.kind is LookupKind.HASHING else "StringLookup"


def _json_strings(value: Any, spec: SparseFeatureSpec, i: int, mapping: LookupMapping) -> list[int]:
    """A string-lookup (or string-hashing) feature's JSON value -> the raw keys (``mapping.string_key``) of its
    strings."""
    string_key = mapping.string_key
    layer = _layer_kind(mapping)
    if spec.kind is FeatureKind.SINGLE:
        vals = value if type(value) is list else [value]
        if len(vals) != 1 or type(vals[0]) is not str:
            raise InvalidArgument(
                f"feature {spec.name!r} at example {i}: expected one string (the model maps this feature with a "
                f"{layer}; a string or a one-element list), got {_show(value)}"
            )
        return [string_key(vals[0])]
    if type(value) is not list:
        raise InvalidArgument(
            f"feature {spec.name!r} at example {i}: expected a list of strings (the model maps this feature with a "
            f"{layer}), got {_show(value)}"
        )
    if value and set(map(type, value)) != _STR_ONLY:
        for j, x in enumerate(value):
            if type(x) is not str:
                raise InvalidArgument(
                    f"feature {spec.name!r} at example {i}: expected a list of strings (the model maps this feature "
                    f"with a {layer}), got {_show(x)} at position {j}"
                )
    if spec.max_ids is not None and len(value) > spec.max_ids:
        raise InvalidArgument(
            f"feature {spec.name!r} at example {i}: {len(value)} strings, more than max_ids {spec.max_ids}"
        )
    return [string_key(x) for x in value]


def _json_numbers(values: list[Any], name: str, i: int, what: str, *, bare: bool = False) -> list[Any]:
    """``values`` after checking every element is a JSON number (int or float, not bool); ``what`` describes the
    expectation and ``bare`` says the client sent one value, not a list (no position in the error then)."""
    if not set(map(type, values)) <= _NUMBER_TYPES:
        for j, x in enumerate(values):
            if type(x) is not float and type(x) is not int:
                where = "" if bare else f" at position {j}"
                raise InvalidArgument(
                    f"feature {name!r} at example {i}: expected {what}, got {_show(x)}{where}"
                )
    return values


def _json_weights(value: Any, spec: SparseFeatureSpec, i: int) -> list[Any]:
    name = spec.weights or ""
    bare = spec.kind is FeatureKind.SINGLE and type(value) is not list
    what = f"a list of weights (one number per id of {spec.name!r})"
    if bare:
        value, what = [value], f"a weight for {spec.name!r} (a number or a one-element list)"
    if type(value) is not list:
        raise InvalidArgument(f"feature {name!r} at example {i}: expected {what}, got {_show(value)}")
    return _json_numbers(value, name, i, what, bare=bare)


def _json_dense(value: Any, spec: DenseFeatureSpec, i: int) -> list[Any]:
    bare = spec.dim == 1 and type(value) is not list
    what = "a number (or a list of 1 number)" if spec.dim == 1 else f"a list of {spec.dim} numbers"
    if bare:
        value = [value]
    if type(value) is not list:
        raise InvalidArgument(f"feature {spec.name!r} at example {i}: expected {what}, got {_show(value)}")
    if len(value) != spec.dim:
        raise InvalidArgument(
            f"feature {spec.name!r} at example {i}: expected {spec.dim} numbers, got {len(value)}"
        )
    return _json_numbers(value, spec.name, i, what, bare=bare)


# -- tf.Example value checks ------------------------------------------------------------------------------------------

_KIND_TEXT: Final = {
    "bytes_list": "a bytes_list",
    "float_list": "a float_list",
    "int64_list": "an int64_list",
}


def _example_ids(
    feature: tfs_pb2.Feature, spec: SparseFeatureSpec, name: str, i: int, strings: LookupMapping | None = None
) -> list[int]:
    """Ids (or, for a string-lookup feature, the raw keys of a bytes_list's strings) of one example."""
    kind = feature.WhichOneof("kind")
    if strings is not None:
        if kind == "bytes_list":
            ids = [strings.string_key(b) for b in feature.bytes_list.value]
        elif kind is None:
            ids = []
        else:
            raise InvalidArgument(
                f"feature {name!r} at example {i}: expected a bytes_list of strings (the model maps this feature "
                f"with a {_layer_kind(strings)}), got {_KIND_TEXT[kind]}"
            )
    elif kind == "int64_list":
        ids = list(feature.int64_list.value)
    elif kind is None:
        ids = []
    else:
        raise InvalidArgument(
            f"feature {name!r} at example {i}: expected an int64_list of ids, got {_KIND_TEXT[kind]}"
        )
    if spec.kind is FeatureKind.SINGLE:
        if len(ids) != 1:
            raise InvalidArgument(f"feature {name!r} at example {i}: expected exactly one id, got {len(ids)}")
    elif spec.max_ids is not None and len(ids) > spec.max_ids:
        raise InvalidArgument(
            f"feature {name!r} at example {i}: {len(ids)} ids, more than max_ids {spec.max_ids}"
        )
    return ids


def _example_floats(feature: tfs_pb2.Feature, name: str, i: int) -> npt.NDArray[np.float32]:
    kind = feature.WhichOneof("kind")
    if kind == "float_list":
        return np.array(feature.float_list.value, dtype=np.float32)
    if kind == "int64_list":
        return np.array(feature.int64_list.value, dtype=np.int64).astype(np.float32)
    if kind is None:
        return np.empty(0, dtype=np.float32)
    raise InvalidArgument(
        f"feature {name!r} at example {i}: expected a float_list (or int64_list) of values, got {_KIND_TEXT[kind]}"
    )


# -- messages ---------------------------------------------------------------------------------------------------------


def _expected_names(manifest: Manifest) -> str:
    sparse = ", ".join(f.name for f in manifest.sparse_features)
    dense = ", ".join(d.name for d in manifest.dense_features) or "none"
    weights = ", ".join(f.weights for f in manifest.sparse_features if f.weights) or "none"
    return f"the model takes sparse features {sparse}; dense features {dense}; optional weights {weights}"


def _show(value: Any, limit: int = 120) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
