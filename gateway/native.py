"""The only door to embedgate's compiled hot path (the Rust crate in ``native/``, module ``embedgate_native``).

Which path runs: :func:`path` is ``"native"`` when the module imports and ``EMBEDGATE_NATIVE`` is not ``off``,
else ``"reference"`` (the pure-Python code in ``gateway.codec``, which stays the reference and is what CI tests the
native code against). The gateway logs it at startup (``"rest_codec"`` in the ``gateway started`` line).

Today the native code types REST predict bodies for plain (pass-through) models: :func:`predict_tensors`. It answers
only well-formed numeric/boolean bodies; for every other body it returns None and the caller runs the reference
(which also words every error), so both paths give the same tensors or the same error by construction of the
fallback, and ``tests/gateway/test_native_codec.py`` checks the tensors are the same.

For embedding models it plans the lookups of every batch (:func:`plan_lookups`: dedupe, splitmix64 routing,
(shard, table) grouping and each id's row; reference ``gateway.embedding.plan_lookups_reference``) and holds the
hot-row cache's id -> slot index (:func:`slot_index`; reference: a ``dict``), and pools the rows of a ``pooled``
entry (:func:`pool_feature`; reference ``gateway.embedding._combine``). All three take every input the reference
takes (no per-request fallback); ``tests/gateway/test_native_plan.py`` checks they give the same plans, the same
pooled rows (bit for bit) and the same entry requests.

For an embedding model's REST predict body it parses the features (:func:`request_features`; reference
``gateway.features.batch_from_instances`` / ``batch_from_columns``) from the tree :func:`check_predict` kept, for
rows and columns of integer ids and numbers; every other body returns None and the reference parses it (and words
every error). ``tests/gateway/test_native_features.py`` checks the batches are the same bit for bit.

The REST route first tries an embedding model's body in ONE pass over the raw bytes (:func:`rest_batch`,
``native/src/rest_body.rs``): the limits of ``gateway.limits.parse_document``, ``signature_name`` and the features,
no tree built; it declines what :func:`request_features` declines and any body ``parse_document`` would refuse, and
the route then runs :func:`check_predict` or the reference. ``tests/gateway/test_native_rest_body.py`` checks it.
It writes the entry's serialized ``PredictRequest`` in one pass (:func:`entry_request`; reference
``schemas.wire.predict_request_for`` of ``gateway.embedding.entry_inputs``, same bytes:
``tests/gateway/test_native_entry.py``) and tells the gRPC front which large PredictRequests are plain enough to
parse in process without the parse worker's check (:func:`plain_predict_request`; ``tests/gateway/test_native_scan.py``).

A gRPC Predict's features are read from the request's bytes (:func:`tensor_features`, ``native/src/tensor_features.rs``;
reference ``gateway.grpc_front.features.batch_from_tensors``, ``tests/gateway/test_native_tensor_features.py``), and
a batch whose every row the hot-row cache holds has its plan, cache read and entry request done in one call
(:func:`cached_entry_request`, ``native/src/hot.rs``; reference: the general path, ``tests/gateway/test_native_hot.py``).

:func:`grpc_gate` starts the native gRPC gate on the gateway's gRPC port (``native/src/gate.rs``): it refuses overload
without Python and relays every other call to the Python gRPC front, which stays the reference
(``grpc_front: python``; ``tests/gateway/test_grpc_gate.py``).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, Literal

import numpy as np

from gateway.codec import json_tensor as jt
from gateway.codec.json_tensor import Format
from gateway.errors import MAX_NAME_BYTES, InvalidArgument, name_too_long
from schemas.manifest import FeatureKind

if TYPE_CHECKING:
    from embedgate_native import CheckedBody, FeatureLayout, GrpcClient, GrpcGate, RestGate, SlotIndex

    from gateway.features import FeatureBatch
    from schemas.gateway_settings import LimitsSettings
    from schemas.manifest import Manifest

__all__ = [
    "ENV",
    "available",
    "cached_entry_request",
    "check_predict",
    "checked_tensors",
    "classify_response",
    "entry_request",
    "grpc_gate",
    "path",
    "plain_predict_request",
    "plan_lookups",
    "pool_feature",
    "predict_response",
    "predict_tensors",
    "regress_response",
    "request_features",
    "rest_batch",
    "rest_gate",
    "slot_index",
    "spec_too_long",
    "tensor_features",
]

ENV: Final = (
    "EMBEDGATE_NATIVE"  # "off" forces the Python reference; anything else (default "auto") uses native
)
log = logging.getLogger("embedgate.gateway")

# Told ``step`` (``rest_features`` / ``grpc_features``) when a native feature reader leaves a request to the Python
# reference: the caller's app counts it (``Metrics.native_fallback``, ``embedgate_native_fallbacks_total{step}``).
FallbackSink = Callable[[str], None]


@functools.cache
def _module() -> ModuleType | None:
    try:
        import embedgate_native
    except ImportError:
        return None
    return embedgate_native


def available() -> bool:
    """Whether the compiled module is installed (``make install`` builds it)."""
    return _module() is not None


def path() -> Literal["native", "reference"]:
    """``"native"`` when the compiled module is used, ``"reference"`` when not installed or forced off by the env."""
    if os.environ.get(ENV, "auto").strip().lower() == "off" or not available():
        return "reference"
    return "native"


def grpc_gate(
    host: str,
    port: int,
    upstream: str,
    capacity: int,
    max_in_flight: int,
    max_lag_text: str,
    status: int,
    **whole: Any,
) -> GrpcGate | None:
    """The native gRPC gate (``native/src/gate.rs``) listening on ``host:port`` in front of the Python gRPC front on
    the Unix socket ``upstream``; None when the native path is off (the Python front, its reference, then listens
    itself). ``whole``: the gate's keyword arguments for the methods it receives whole (``direct``, ``max_message``,
    ``max_calls``, ``max_bytes``, ``bytes_text``, ``tokens``, ``receive_timeout_s``, ``timeout_text``; see
    ``GrpcGate`` in ``native/src/gate.rs``). Raises OSError when it cannot listen."""
    mod = _module()
    if mod is None or path() != "native":
        return None
    gate: GrpcGate = mod.GrpcGate(
        host, port, upstream, capacity, max_in_flight, max_lag_text, status, **whole
    )
    return gate


def rest_gate(
    host: str,
    port: int,
    upstream: str,
    capacity: int,
    max_in_flight: int,
    max_lag_text: str,
    status: int,
    retry_after: int,
    keep_alive_s: float,
    reuse_port: bool,
) -> RestGate | None:
    """The native REST gate (``native/src/rest_gate.rs``) listening on ``host:port`` in front of uvicorn on the Unix
    socket ``upstream``; None when the native path is off (uvicorn then listens itself). Raises OSError when it
    cannot listen."""
    mod = _module()
    if mod is None or path() != "native":
        return None
    gate: RestGate = mod.RestGate(
        host,
        port,
        upstream,
        capacity,
        max_in_flight,
        max_lag_text,
        status,
        retry_after,
        keep_alive_s,
        reuse_port,
    )
    return gate


def grpc_client(max_receive: int) -> GrpcClient | None:
    """The native gRPC client of backend calls (``native/src/client.rs``; :mod:`gateway.backends.native_client`), or
    None when the native path is off (``grpc.aio`` makes every call)."""
    mod = _module()
    if mod is None or path() != "native":
        return None
    client: GrpcClient = mod.GrpcClient(max_receive)
    return client


def predict_tensors(body: bytes, dtypes: Mapping[str, int]) -> tuple[dict[str, np.ndarray], Format] | None:
    """The signature inputs of a REST predict ``body`` typed natively, and its format; None when the native path is
    off or leaves the body to the reference (any error, strings, ``b64``, NaN/Infinity tokens, ``-0``). The arrays
    equal ``json_tensor.tensors_from_request(json_tensor.loads(body), dtypes)`` (dtype, shape, bytes)."""
    mod = _module()
    if mod is None or path() != "native":
        return None
    names = sorted(dtypes)
    done = mod.predict_tensors(body, names, [int(dtypes[n]) for n in names])
    if done is None:
        return None
    arrays, fmt = done
    return arrays, Format(fmt)


def check_predict(body: bytes, limits: LimitsSettings) -> tuple[str, CheckedBody] | None:
    """The ``signature_name`` ("" when absent) of a REST predict ``body`` checked natively in one pass, and the body
    kept parsed for :func:`checked_tensors`: strict JSON (no NaN/Infinity tokens, no lone surrogates, nothing after
    the root object), depth, batch and per-example list limits as ``gateway.limits.parse_document`` checks them.
    None when the native path is off or the body needs the reference (which then words any error). A signature
    name over ``MAX_NAME_BYTES`` is refused here (``name_too_long``) without being copied into a str."""
    mod = _module()
    if mod is None or path() != "native":
        return None
    done: tuple[str | int, CheckedBody] | None = mod.check_predict(
        body, limits.max_json_depth, limits.max_instances, limits.max_ids_per_feature, MAX_NAME_BYTES
    )
    if done is None:
        return None
    sig, checked = done
    return _signature(sig), checked


def _signature(sig: str | int) -> str:
    """The native parsers' ``signature_name``: the text, or the size of one too long to be served (refused)."""
    if isinstance(sig, int):
        raise name_too_long("signature_name", sig)
    return sig


def checked_tensors(
    checked: CheckedBody, dtypes: Mapping[str, int]
) -> tuple[dict[str, np.ndarray], Format] | None:
    """:func:`predict_tensors` for a body :func:`check_predict` passed (typed from its parsed form, no new parse)."""
    names = sorted(dtypes)
    done = checked.tensors(names, [int(dtypes[n]) for n in names])
    if done is None:
        return None
    arrays, fmt = done
    return arrays, Format(fmt)


# ---- the JSON response writer (issue 17: TF Serving's writer in Rust, native/src/response.rs) ----------------------

_NATIVE_KINDS: Final = (
    "fiub"  # numeric and boolean arrays go to Rust as numpy; string kinds as lists of bytes
)


def _values(arr: np.ndarray) -> np.ndarray | list[bytes]:
    """One output's flat values as the native writer takes them (C order, native byte order)."""
    if arr.dtype.kind in _NATIVE_KINDS:
        flat = np.ascontiguousarray(arr).reshape(-1)
        return flat if flat.dtype.isnative else flat.astype(flat.dtype.newbyteorder("="))
    return [jt.as_bytes(x) for x in arr.reshape(-1).tolist()]


def predict_response(outputs: Mapping[str, np.ndarray], fmt: Format) -> bytes | None:
    """``json_tensor.predict_response(outputs, fmt)`` written natively: the same bytes, and the same
    ``InvalidArgument`` for outputs TF Serving cannot write (``json_tensor.checked_names`` runs first, here).
    None when the native path is off, the module is a build without the writer, or an output has a dtype the native
    writer leaves to the reference (float128, non-native byte orders are converted first)."""
    mod = _module()
    if mod is None or path() != "native":
        return None
    write = getattr(mod, "predict_response", None)  # None: a build older than the writer
    if write is None:
        return None
    names, _ = jt.checked_names(outputs, fmt)
    args = [(n, list(outputs[n].shape), _values(outputs[n])) for n in names]
    body: bytes | None = write(args, fmt is Format.ROW)
    return body


def regress_response(values: Sequence[float] | np.ndarray) -> bytes | None:
    """``json_tensor.regress_response(values)`` written natively (same bytes, same error); None when off."""
    mod = _module()
    if mod is None or path() != "native" or not hasattr(mod, "regress_response"):
        return None
    arr = np.asarray(values, dtype=np.float32).reshape(-1)
    if not arr.size:
        raise InvalidArgument("Cannot convert empty RegressionResults to JSON")
    body: bytes = mod.regress_response(arr.tolist())
    return body


def classify_response(results: Sequence[Sequence[tuple[str, float]]]) -> bytes | None:
    """``json_tensor.classify_response(results)`` written natively (same bytes, same error); None when off."""
    mod = _module()
    if mod is None or path() != "native" or not hasattr(mod, "classify_response"):
        return None
    if not results:
        raise InvalidArgument("Cannot convert empty ClassificationResults to JSON")
    labels = [jt.as_bytes(label) for classes in results for label, _ in classes]
    scores = [float(np.float32(score)) for classes in results for _, score in classes]
    body: bytes = mod.classify_response(labels, scores, [len(classes) for classes in results])
    return body


def plan_lookups(
    ids: Sequence[np.ndarray], tables: Sequence[int], num_tables: int, num_shards: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The lookup plan of one batch computed natively, or None when the native path is off.

    ``ids[k]``: sparse feature k's ids (int64 [n_k]); ``tables[k]``: its table's index in ``[0, num_tables)``.
    Returns ``(grouped, bounds, rows)``: int64 ``grouped`` holds every (shard, table) group's unique ids, ascending,
    groups in (shard, table) order (group ``g = shard * num_tables + table`` is ``grouped[bounds[g]:bounds[g + 1]]``);
    int32 ``rows``, per id of every feature in feature order, its row in its table's answers concatenated in shard
    order. What ``gateway.embedding.plan_lookups_reference`` computes with numpy."""
    mod = _module()
    if mod is None or path() != "native":
        return None
    arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in ids]
    done: tuple[np.ndarray, np.ndarray, np.ndarray] = mod.plan_lookups(
        arrays, list(tables), num_tables, num_shards
    )
    return done


def slot_index() -> dict[int, int] | SlotIndex:
    """A new, empty id -> slot index for one table of the hot-row cache: the native ``SlotIndex`` (a Rust hash map
    with the ``dict`` methods the cache uses, a bulk ``slots(ids, missing)`` and ``read``, a (shard, table) read in
    one pass) when the native path is on, else a ``dict`` (the reference)."""
    mod = _module()
    if mod is None or path() != "native":
        return {}
    index: SlotIndex = mod.SlotIndex()
    return index


_COMBINERS: Final = {"sum": 0, "mean": 1, "sqrtn": 2}


def pool_feature(
    table: np.ndarray,
    rows: np.ndarray,
    row_splits: np.ndarray | None,
    weights: np.ndarray | None,
    combiner: str,
) -> np.ndarray | None:
    """One sparse feature pooled natively, float32 [B, dim], or None when the native path is off.

    ``table``: float32 [U, dim], the distinct rows of the feature's table; ``rows``: each id's row in it;
    ``row_splits``: int64 [B + 1] of a multi feature, None for a single one; ``weights``: float32 per id or None;
    ``combiner``: ``sum``, ``mean`` or ``sqrtn`` (ignored for a single feature). Bit for bit what
    ``gateway.embedding._combine`` computes from ``table[rows]`` (numpy's summation order included)."""
    mod = _module()
    if mod is None or path() != "native":
        return None
    pooled: np.ndarray = mod.pool_feature(
        np.ascontiguousarray(table, dtype=np.float32),
        np.ascontiguousarray(rows, dtype=np.int32),
        None if row_splits is None else np.ascontiguousarray(row_splits, dtype=np.int64),
        None if weights is None else np.ascontiguousarray(weights, dtype=np.float32),
        _COMBINERS[combiner],
    )
    return pooled


# ---- REST features of an embedding model (native/src/features.rs; reference gateway.features) -----------------------

_FEATURE_LAYOUTS: dict[int, tuple[Manifest, object, FeatureLayout | None]] = {}


def _feature_layout(mod: ModuleType, manifest: Manifest) -> FeatureLayout | None:
    """``manifest``'s features as the native parser takes them, built once per manifest and lookup mappings; None
    for a model with string features (StringLookup / Hashing of strings: their hashing stays with the reference)."""
    from gateway.features import string_features
    from gateway.lookup_mapping import lookups_of

    lookups = lookups_of(manifest)
    hit = _FEATURE_LAYOUTS.get(id(manifest))
    if hit is not None and hit[0] is manifest and hit[1] is lookups:
        return hit[2]
    layout: FeatureLayout | None = None
    if not string_features(manifest) and hasattr(mod, "FeatureLayout"):
        sparse = [
            (f.name, f.kind is FeatureKind.MULTI, -1 if f.max_ids is None else f.max_ids, f.weights or "")
            for f in manifest.sparse_features
        ]
        layout = mod.FeatureLayout(sparse, [(d.name, d.dim) for d in manifest.dense_features])
    if len(_FEATURE_LAYOUTS) > 256:  # manifests live as long as the app; this only bounds test processes
        _FEATURE_LAYOUTS.clear()
    _FEATURE_LAYOUTS[id(manifest)] = (manifest, lookups, layout)
    return layout


def request_features(source: CheckedBody | bytes, manifest: Manifest) -> tuple[FeatureBatch, Format] | None:
    """The feature batch of a REST predict body for an embedding model, parsed natively, and its format; None when
    the native path is off or leaves the body to the reference (any error, ``b64`` examples, strings, booleans,
    nulls, ``-0``, a columnar batch of 0 examples, a model with string features).

    ``source``: the body as :func:`check_predict` parsed it (no new parse), or a raw body the caller already checked
    (``gateway.limits.parse_document``). The batch equals ``gateway.features.batch_from_instances`` /
    ``batch_from_columns`` of the parsed body (``map_lookups`` included: integer lookups mapped, padding dropped)."""
    mod = _module()
    if mod is None or path() != "native":
        return None
    layout = _feature_layout(mod, manifest)
    if layout is None:
        return None
    if isinstance(source, bytes):
        done = mod.body_features(source, layout)
    else:
        done = mod.checked_features(source, layout)
    if done is None:
        return None
    return _feature_batch(done, manifest)


def tensor_features(
    raw: bytes, manifest: Manifest, fallback: FallbackSink | None = None
) -> FeatureBatch | None:
    """The feature batch of a serialized gRPC ``PredictRequest`` for an embedding model, read natively from its
    bytes (``native/src/tensor_features.rs``); None when the native path is off or leaves the request to the
    reference (any error, inputs other than ``tensor_content`` tensors of int32/int64 ids and float32 values, a
    model with string features; then ``fallback("grpc_features")`` is called). The batch equals
    ``gateway.grpc_front.features.batch_from_tensors`` of the parsed request's inputs (``map_lookups`` included)."""
    mod = _module()
    if mod is None or path() != "native" or not hasattr(mod, "tensor_features"):
        return None
    layout = _feature_layout(mod, manifest)
    done = None if layout is None else mod.tensor_features(raw, layout)
    if done is None:
        if fallback is not None:
            fallback("grpc_features")
        return None
    return _feature_batch(done, manifest)[0]


def rest_batch(
    body: bytes, manifest: Manifest, limits: LimitsSettings, fallback: FallbackSink | None = None
) -> tuple[str, FeatureBatch, Format] | None:
    """An embedding model's REST predict ``body`` in ONE native pass (``native/src/rest_body.rs``): its
    ``signature_name`` ("" when absent), its feature batch for ``manifest`` and its format, parsed from the bytes
    straight into the batch's arrays while the limits are checked (strict JSON, no lone surrogates, ``limits``'
    depth, batch and per-example list sizes: what ``gateway.limits.parse_document`` checks). None when the native
    path is off or leaves the body to the reference (every error, and what :func:`request_features` declines; then
    ``fallback("rest_features")`` is called); the caller then runs ``parse_document`` and the reference, which word
    every error. The batch equals ``batch_from_instances`` / ``batch_from_columns`` of the parsed body (``map_lookups``
    included). A signature name over ``MAX_NAME_BYTES`` is refused as :func:`check_predict` refuses it."""
    mod = _module()
    if mod is None or path() != "native" or not hasattr(mod, "rest_features"):
        return None
    layout = _feature_layout(mod, manifest)
    done = (
        None
        if layout is None
        else mod.rest_features(
            body,
            layout,
            limits.max_json_depth,
            limits.max_instances,
            limits.max_ids_per_feature,
            MAX_NAME_BYTES,
        )
    )
    if done is None:
        if fallback is not None:
            fallback("rest_features")
        return None
    sig, arrays = done
    batch, fmt = _feature_batch(arrays, manifest)
    return _signature(sig), batch, fmt


def _feature_batch(
    done: tuple[bool, int, list[tuple[np.ndarray, np.ndarray, np.ndarray | None]], list[np.ndarray]],
    manifest: Manifest,
) -> tuple[FeatureBatch, Format]:
    """The native parser's arrays as the reference's ``FeatureBatch`` (lookup layers mapped) and format."""
    from gateway.features import FeatureBatch, SparseInput, map_lookups

    row, size, sparse_arrays, dense_arrays = done
    sparse = {
        f.name: SparseInput(ids=ids, row_splits=splits, weights=weights)
        for f, (ids, splits, weights) in zip(manifest.sparse_features, sparse_arrays, strict=True)
    }
    dense = dict(zip((d.name for d in manifest.dense_features), dense_arrays, strict=True))
    batch = FeatureBatch(size=size, sparse=sparse, dense=dense)
    return map_lookups(batch, manifest), Format.ROW if row else Format.COLUMNAR


# ---- the entry's PredictRequest bytes in one pass (native/src/entry.rs; reference schemas.wire) ---------------------


def entry_request(
    head: bytes, inputs: Sequence[tuple[str, int, Sequence[int], Sequence[np.ndarray]]]
) -> bytes | None:
    """A serialized ``PredictRequest`` written natively in one pass, or None when the native path is off (or the module
    is a build without the writer).

    ``head``: the serialized request's ``model_spec`` field; ``inputs``: per input, its name, ``DataType`` number,
    shape and the parts of its ``tensor_content`` (C-contiguous little-endian arrays whose bytes are joined in order,
    e.g. a table's rows as each PS shard answered them). The bytes equal ``schemas.wire.predict_request_for`` of the
    joined arrays; each part is copied once, without the GIL."""
    mod = _module()
    if mod is None or path() != "native" or not hasattr(mod, "entry_request"):
        return None
    args = [
        (name, dtype, list(shape), [np.frombuffer(np.ascontiguousarray(p), np.uint8) for p in parts])
        for name, dtype, shape, parts in inputs
    ]
    wire: bytes = mod.entry_request(head, args)
    return wire


def cached_entry_request(
    head: bytes,
    features: list[
        tuple[int, np.ndarray, str, tuple[str, np.ndarray] | None, tuple[str, np.ndarray | None] | None]
    ],
    tables: list[tuple[str | None, SlotIndex | dict[int, int], np.ndarray, np.ndarray]],
    dense: list[tuple[str, np.ndarray]],
    num_shards: int,
    tick: int,
    row_dtype: int,
) -> tuple[bytes, int] | None:
    """A ``unique_rows`` entry's serialized ``PredictRequest`` when the hot-row cache holds every row the batch reads
    (native/src/hot.rs: plan, slab reads with their LRU ticks from ``tick`` on, and the request, in one call), with
    the number of rows read; None on any miss (nothing changed) or when the native path is off or a table's index is
    the ``dict`` reference. Arrays must be C-contiguous: ids and row splits int64, weights, rows and dense float32,
    LRU ticks int64 (written).

    ``features``: per sparse feature in the manifest's order, (its table's position in ``tables``, ids, ``index__``
    name, (``splits__`` name, row splits) of a multi feature, (``weights__`` name, weights or None for all ones) of
    a feature with weights); ``tables``: per table of the manifest, (``rows__`` name when a feature reads it, its
    slab's index, rows, ticks); ``dense``: (name, float32 array) in the batch's order; ``row_dtype``: the rows'
    ``DataType`` on the wire, ``DT_FLOAT`` (1) or ``DT_BFLOAT16`` (14, rounded as ``schemas.wire.bfloat16_bits``)."""
    mod = _module()
    if mod is None or path() != "native" or not hasattr(mod, "cached_entry_request"):
        return None
    native_tables = []
    for name, index, rows, used in tables:
        if isinstance(index, dict):
            return None
        native_tables.append((name, index, rows, used))
    done: tuple[bytes, int] | None = mod.cached_entry_request(
        head, features, native_tables, dense, num_shards, tick, row_dtype
    )
    return done


def spec_too_long(raw: bytes, max_bytes: int, limit: int) -> tuple[int, int] | Literal[False] | None:
    """The first ``model_spec`` string of the serialized request ``raw`` longer than ``max_bytes``, read natively
    from the wire format (native/src/spec_sizes.rs; reference
    ``gateway.grpc_front.messages.check_spec_sizes_reference``, reading at most ``limit`` fields per level): (its
    field number in ``ModelSpec``, its size), False when there is none, None when the native path is off."""
    mod = _module()
    if mod is None or path() != "native" or not hasattr(mod, "spec_too_long"):
        return None
    found: tuple[int, int] | None = mod.spec_too_long(raw, max_bytes, limit)
    return False if found is None else found


def predict_input_bytes(
    raw: bytes, items: Sequence[int], default_item: int, max_rank: int, max_instances: int, max_bytes: int
) -> int | None:
    """The bytes the input tensors of the parsed ``PredictRequest`` ``raw`` decode to when every one passes
    ``gateway.grpc_front.messages.check_tensor`` (its reference, which words every refusal), read from the wire
    format without the GIL (native/src/shape_check.rs): ``items[dtype]`` bytes per element (``default_item`` beyond
    the table). None when a tensor would be refused, when protobuf's reading is not plain (a key or a shape given
    twice), or when the native path is off: the caller then checks the parsed message."""
    mod = _module()
    if mod is None or path() != "native" or not hasattr(mod, "predict_input_bytes"):
        return None
    found: int | None = mod.predict_input_bytes(raw, items, default_item, max_rank, max_instances, max_bytes)
    return found


def plain_predict_request(raw: bytes) -> bool:
    """Whether the serialized ``PredictRequest`` ``raw`` is *plain* (native/src/scan.rs, scanned without the GIL):
    only the model spec, output filter and input tensors of numeric dtypes (shape, ``tensor_content`` or packed
    values), well-formed, so that protobuf parses it in a few allocations and copies. False when the native path is
    off (or the module is a build without the scan): the caller then treats the message as not plain."""
    mod = _module()
    if mod is None or path() != "native" or not hasattr(mod, "plain_predict_request"):
        return False
    plain: bool = mod.plain_predict_request(raw)
    return plain
