"""Keras ``IntegerLookup`` / ``StringLookup`` in front of an Embedding: re-key the table by raw value, for the gateway.

For a sparse feature whose Keras ids input goes through a lookup layer into its Embedding, the exported table holds,
for every vocabulary entry at index ``i``, the Embedding row ``i`` under the raw value's key
(:mod:`gateway.lookup_mapping`: the integer itself, or ``string_key`` of the string), and the OOV row under
``OOV_KEY``. The gateway applies :class:`gateway.lookup_mapping.LookupMapping` to what clients send; predictions
then equal the Keras model's, OOV values included.

``Hashing(num_bins)`` (no salt) in front of an Embedding: the table keeps its ``num_bins`` rows keyed by bin, and the
gateway computes the bin from the raw string or integer (FarmHash Fingerprint64, :mod:`gateway.farmhash`; a
``hashing`` mapping in ``lookups.json``).

Refused, each with the layer and the reason: a salted ``Hashing`` (SipHash), an
``output_mode`` other than ``int``, ``num_oov_indices`` other than 1 (hashed OOV buckets), a multi-valued feature
behind a lookup without ``mask_token`` (its padding value), a layer between the lookup and the Embedding, a table shared with a feature not behind the same
lookup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from embedgate.export.declaration import DeclarationError, SparseDecl
from embedgate.export.modelcheck import source_input
from gateway.lookup_mapping import OOV_KEY, HashInput, LookupKind, LookupMapping, string_key
from schemas.manifest import FeatureKind

__all__ = ["KeyedTable", "find_lookup", "keyed_table"]


@dataclass(frozen=True)
class KeyedTable:
    mapping: LookupMapping
    keys: npt.NDArray[np.int64]  # row keys: raw-value keys + OOV_KEY
    rows: npt.NDArray[np.float32]
    samples: list[Any]  # raw values to sample the self-check from (vocabulary entries and one OOV value)
    pad: Any = (
        None  # the lookup's mask token: what pads a multi-valued feature's raw values on the Keras side
    )
    # the Embedding row each key's row comes from, in the order of ``keys`` (what embedgate.train binds rows by)
    index: npt.NDArray[np.int64] | None = None


def find_lookup(model: Any, f: SparseDecl) -> Any | None:
    """The preprocessing layer that takes ``f``'s ids input, if it is a lookup/hashing layer, else None."""
    import keras

    kinds = (keras.layers.IntegerLookup, keras.layers.StringLookup, keras.layers.Hashing)
    for layer in model.layers:
        if isinstance(layer, kinds):
            for node in layer._inbound_nodes:
                if node.input_tensors and source_input(node.input_tensors[0]) == f.ids_input:
                    return layer
    return None


def keyed_table(f: SparseDecl, lookup: Any, emb: Any) -> KeyedTable:
    """The table of Embedding ``emb`` re-keyed by raw value through ``lookup`` (refusals name layer and reason)."""
    import keras

    what = f"sparse feature {f.name!r}"
    name = f"layer {lookup.name!r} ({type(lookup).__name__})"
    if isinstance(lookup, keras.layers.Hashing):
        return _hashing_table(f, lookup, emb, what, name)
    if f.kind is FeatureKind.MULTI and lookup.mask_token is None:
        raise DeclarationError(
            f"{what}: {name} has no mask_token: a multi-valued feature behind a lookup is padded with the mask "
            "token (e.g. StringLookup(mask_token='') or IntegerLookup(mask_token=0)) and pooled by a mask-aware "
            "layer after Embedding(mask_zero=True)"
        )
    if getattr(lookup, "output_mode", "int") != "int":
        raise DeclarationError(
            f"{what}: {name} has output_mode {lookup.output_mode!r}; only 'int' feeds an Embedding"
        )
    if int(getattr(lookup, "num_oov_indices", 1)) != 1:
        raise DeclarationError(
            f"{what}: {name} has num_oov_indices {lookup.num_oov_indices}: several OOV buckets are chosen by a hash "
            "the gateway does not compute; use num_oov_indices=1"
        )
    feeds = [
        n
        for n in emb._inbound_nodes
        if n.input_tensors and getattr(n.input_tensors[0], "_keras_history", None)
    ]
    if not any(n.input_tensors[0]._keras_history[0] is lookup for n in feeds):
        raise DeclarationError(
            f"{what}: {name} does not feed Embedding {emb.name!r} directly; put no layer between the lookup and "
            "the Embedding"
        )
    string = isinstance(lookup, keras.layers.StringLookup)
    vocab = list(lookup.get_vocabulary())
    weights = np.asarray(emb.embeddings.numpy(), np.float32)
    if len(vocab) > len(weights):
        raise DeclarationError(
            f"{what}: {name} has {len(vocab)} indices but Embedding {emb.name!r} only {len(weights)} rows"
        )
    mask_first = lookup.mask_token is not None
    oov_index = 1 if mask_first else 0
    keys: list[int] = []
    idx: list[int] = []
    samples: list[Any] = []
    for i, tok in enumerate(vocab):
        if mask_first and i == 0:
            continue  # the mask token's index: padding, never a client value
        if i == oov_index:
            keys.append(OOV_KEY)
        else:
            if string:
                token = str(tok)
                keys.append(string_key(token))
                samples.append(token)
            else:
                key = int(tok)
                keys.append(key)
                samples.append(key)
        idx.append(i)
    key_arr = np.asarray(keys, np.int64)
    order = np.argsort(key_arr)
    if len(key_arr) > 1 and bool(np.any(key_arr[order][1:] == key_arr[order][:-1])):
        raise DeclarationError(f"{what}: {name}: two vocabulary entries map to the same key")
    vocab_keys = np.sort(key_arr[key_arr != OOV_KEY])
    mapping = LookupMapping(
        feature=f.name,
        kind=LookupKind.STRING if string else LookupKind.INTEGER,
        layer=lookup.name,
        keys=vocab_keys,
    )
    probe: Any = "<embedgate self-check: not in the vocabulary>" if string else _unused_int(samples)
    pad = (
        None if lookup.mask_token is None else (str(lookup.mask_token) if string else int(lookup.mask_token))
    )
    index = np.asarray(idx, np.int64)
    return KeyedTable(mapping, key_arr, weights[index], [*samples[:63], probe], pad, index)


def _hashing_table(f: SparseDecl, layer: Any, emb: Any, what: str, name: str) -> KeyedTable:
    """``Hashing(num_bins)``: the table keyed by bin (rows 0..num_bins-1); the gateway computes the bin."""
    if layer.salt is not None:
        raise DeclarationError(
            f"{what}: {name} has a salt: a salted Hashing uses SipHash (tf.strings.to_hash_bucket_strong), which "
            "the gateway does not compute; use Hashing without salt"
        )
    if getattr(layer, "output_mode", "int") != "int":
        raise DeclarationError(
            f"{what}: {name} has output_mode {layer.output_mode!r}; only 'int' feeds an Embedding"
        )
    _check_feeds(layer, emb, what, name)
    node = next(n for n in layer._inbound_nodes if n.input_tensors)
    dtype = str(node.input_tensors[0].dtype)
    if "string" in dtype:
        hash_input = HashInput.STRING
    elif "int" in dtype:
        hash_input = HashInput.INTEGER
    else:
        raise DeclarationError(
            f"{what}: {name} hashes {dtype} values; the gateway hashes string and integer features only"
        )
    mask = layer.mask_value
    if mask is not None:
        if hash_input is HashInput.STRING:
            mask = mask.decode() if isinstance(mask, bytes) else mask
            if not isinstance(mask, str):
                raise DeclarationError(
                    f"{what}: {name} has mask_value {mask!r}; a string feature needs a string"
                )
        elif isinstance(mask, bool) or not isinstance(mask, (int, np.integer)):
            raise DeclarationError(
                f"{what}: {name} has mask_value {mask!r}; an integer feature needs an integer"
            )
        else:
            mask = int(mask)
    if f.kind is FeatureKind.MULTI and mask is None:
        raise DeclarationError(
            f"{what}: {name} has no mask_value: a multi-valued feature behind Hashing is padded with the mask value "
            "(e.g. Hashing(n, mask_value='') or mask_value=0), which maps to bin 0, and pooled by a mask-aware "
            "layer after Embedding(mask_zero=True)"
        )
    num_bins = int(layer.num_bins)
    weights = np.asarray(emb.embeddings.numpy(), np.float32)
    if num_bins > len(weights):
        raise DeclarationError(
            f"{what}: {name} has {num_bins} bins but Embedding {emb.name!r} only {len(weights)} rows"
        )
    mapping = LookupMapping(
        feature=f.name,
        kind=LookupKind.HASHING,
        layer=layer.name,
        keys=np.zeros(0, np.int64),
        num_bins=num_bins,
        hash_input=hash_input,
        mask_value=mask,
    )
    if hash_input is HashInput.STRING:
        samples: list[Any] = ["", "a", "alice", "x" * 17, "y" * 40, "z" * 70, "日本語", "embedgate hashing"]
    else:
        samples = [0, 1, -1, 7, 42, 12345, 2**40 + 3, -(2**62)]
    samples = [v for v in samples if v != mask]  # the mask value pads; Keras masks it, clients do not send it
    bins = np.arange(num_bins, dtype=np.int64)
    return KeyedTable(mapping, bins, weights[:num_bins], samples, mask, bins)


def _check_feeds(layer: Any, emb: Any, what: str, name: str) -> None:
    feeds = [
        n
        for n in emb._inbound_nodes
        if n.input_tensors and getattr(n.input_tensors[0], "_keras_history", None)
    ]
    if not any(n.input_tensors[0]._keras_history[0] is layer for n in feeds):
        raise DeclarationError(
            f"{what}: {name} does not feed Embedding {emb.name!r} directly; put no layer between the lookup and "
            "the Embedding"
        )


def _unused_int(values: list[Any]) -> int:
    return (max(values) + 1) if values else 1
