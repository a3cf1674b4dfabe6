"""The entry's PredictRequest written natively in one pass (``gateway.native.entry_request``, native/src/entry.rs)
against the reference (``schemas.wire.predict_request_for`` of ``gateway.embedding.entry_inputs``).

* Generated manifests (the plan tests' generator: 1-4 shards, shared tables, every combiner, weights, both entry
  input modes and every row dtype) and batches: ``gateway.embedding.entry_request`` gives the same bytes with the
  native path on and off, and the bytes parse to the reference's tensors.
* The writer alone on arrays of every dtype it takes, empty and multi-part tensors, long names and large dimensions
  (multi-byte varints): the same bytes as ``schemas.wire``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import native
from gateway.embedding import entry_inputs, entry_request, plan_lookups
from gateway.errors import Internal
from gateway.features import batch_from_instances
from schemas.manifest import Manifest
from schemas.proto import tfs_pb2
from schemas.wire import bfloat16_bits, predict_request_for
from tests.gateway.test_native_plan import _instances, _manifest, _shard_values
from tests.support.native import native_mode

pytestmark = pytest.mark.skipif(
    not native.available() or not hasattr(native._module(), "entry_request"),
    reason="embedgate_native is not built with the entry writer (make install)",
)

_SPEC = tfs_pb2.ModelSpec(name="m__entry", signature_name="serving_default")


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_native_entry_request_equals_the_reference(data: st.DataObject) -> None:
    manifest = data.draw(_manifest())
    batch = batch_from_instances(_instances(data.draw, manifest), manifest)
    with native_mode("auto"):
        plan = plan_lookups(batch, manifest)
    values = _shard_values(plan, manifest, data.draw(st.integers(0, 3)))
    with native_mode("auto"):
        fast = entry_request(_SPEC, plan, values, batch, manifest)
    with native_mode("off"):
        ref = entry_request(_SPEC, plan, values, batch, manifest)
        inputs = entry_inputs(plan, values, batch, manifest)
    assert fast == ref
    assert fast == predict_request_for(_SPEC, inputs)
    parsed = tfs_pb2.PredictRequest.FromString(fast)
    assert sorted(parsed.inputs) == sorted(k for k, _ in inputs)


def test_native_entry_request_keeps_the_reference_errors() -> None:
    """A PS answer of the wrong shape is the same Internal error on either path (the shards' parts are checked
    before any byte is written)."""
    manifest = _demo_like()
    batch = batch_from_instances([{"f0": 3, "f1": [1, 2]}], manifest)
    plan = plan_lookups(batch, manifest)
    values = _shard_values(plan, manifest, 0)
    values[0]["t0"] = np.zeros((values[0]["t0"].shape[0] + 1, 2), np.float32)
    messages = []
    for mode in ("auto", "off"):
        with native_mode(mode), pytest.raises(Internal) as exc:
            entry_request(_SPEC, plan, values, batch, manifest)
        messages.append(exc.value.message)
    assert messages[0] == messages[1]
    assert "PS shard 0 returned values of shape" in messages[0]


_ARRAYS = st.sampled_from(["f32", "i32", "f16", "bf16"])


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(min_size=0, max_size=200),
            _ARRAYS,
            st.lists(st.integers(0, 3), min_size=1, max_size=3),
            st.integers(1, 3),
        ),
        max_size=5,
    ),
    st.integers(0, 2**31 - 1),
)
def test_writer_equals_schemas_wire(tensors: list[tuple[str, str, list[int], int]], big: int) -> None:
    rng = np.random.default_rng(0)
    ref_inputs = []
    native_inputs = []
    for name, kind, shape, parts in tensors:
        arr: np.ndarray = rng.normal(size=shape).astype(np.float32)
        if kind == "i32":
            arr = (arr * 1000).astype(np.int32)
        elif kind == "f16":
            arr = arr.astype(np.float16)
        elif kind == "bf16":
            arr = bfloat16_bits(arr)
        dtype = {
            "f32": tfs_pb2.DT_FLOAT,
            "i32": tfs_pb2.DT_INT32,
            "f16": tfs_pb2.DT_HALF,
            "bf16": tfs_pb2.DT_BFLOAT16,
        }[kind]
        ref_inputs.append((name, arr))
        cuts = np.array_split(np.arange(arr.shape[0]), parts)
        native_inputs.append(
            (name, dtype, arr.shape, [arr[c[0] : c[-1] + 1] for c in cuts if c.size] or [arr])
        )
    spec = tfs_pb2.ModelSpec(name="x" * (big % 300), signature_name="s")
    spec.version.value = big
    head = tfs_pb2.PredictRequest(model_spec=spec).SerializeToString()
    with native_mode("auto"):
        got = native.entry_request(head, native_inputs)
    assert got == predict_request_for(spec, ref_inputs)


def test_large_dimensions_and_contents_use_multibyte_lengths() -> None:
    rows = np.arange(70_000 * 3, dtype=np.float32).reshape(70_000, 3)
    spec = tfs_pb2.ModelSpec(name="m")
    head = tfs_pb2.PredictRequest(model_spec=spec).SerializeToString()
    with native_mode("auto"):
        got = native.entry_request(head, [("rows__t", tfs_pb2.DT_FLOAT, rows.shape, [rows[:5], rows[5:]])])
    assert got == predict_request_for(spec, [("rows__t", rows)])


def test_off_returns_none() -> None:
    with native_mode("off"):
        assert native.entry_request(b"", []) is None


def _demo_like() -> Manifest:
    return Manifest.model_validate(
        {
            "model_name": "m",
            "version": 1,
            "tables": [{"name": "t0", "dim": 2}],
            "sparse_features": [
                {"name": "f0", "table": "t0"},
                {"name": "f1", "table": "t0", "kind": "multi", "combiner": "mean", "max_ids": 4},
            ],
            "dense_features": [],
            "partition": {"num_shards": 2},
            "entry": {"outputs": [{"name": "y", "shape": [1]}], "input_mode": "unique_rows"},
        }
    )
