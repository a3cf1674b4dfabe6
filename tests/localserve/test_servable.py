"""``Servable``'s direct run path (cached run plans, one ``TF_SessionRun`` per call) against ``Session.run``, the
reference (``EMBEDGATE_SERVE_DIRECT_RUN=off``), in one process on the conftest's SavedModels."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import predict_pb2

from embedgate.localserve import servable as servable_mod
from embedgate.localserve.errors import ServingError
from embedgate.localserve.request import DIRECT_ENV
from embedgate.localserve.servable import Servable
from tests.support.native import env_set


def _direct(mode: str) -> AbstractContextManager[None]:
    return env_set(DIRECT_ENV, mode)


@pytest.fixture(scope="module")
def half(model_root: Path) -> Iterator[Servable]:
    s = Servable.load("half", 1, model_root / "half" / "1")
    yield s
    s.close()


def _request(
    x: np.ndarray, *, signature: str = "", output_filter: tuple[str, ...] = ()
) -> predict_pb2.PredictRequest:
    req = predict_pb2.PredictRequest()
    req.model_spec.signature_name = signature
    req.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
    req.output_filter.extend(output_filter)
    return req


def _outcome(s: Servable, req: predict_pb2.PredictRequest, timeout: float | None) -> object:
    """The response's bytes, or the error's (class, code, message)."""
    try:
        return s.predict(req, timeout=timeout).SerializeToString(deterministic=True)
    except ServingError as exc:
        return type(exc).__name__, exc.code, exc.message


@pytest.mark.parametrize("timeout", [None, 60.0])
@pytest.mark.parametrize(
    "req",
    [
        _request(np.array([1.0, 2.5, -3.0], np.float32)),
        _request(np.array([1.0], np.float32), output_filter=("x2",)),
        _request(np.array([[1.0], [4.0]], np.float32), signature="times_ten"),
        _request(np.array([[1.0]], np.float32)),  # wrong rank: the signature check's error
        _request(np.array([1, 2], np.int64)),  # wrong dtype
        _request(np.zeros(0, np.float32)),
    ],
)
def test_direct_run_answers_as_session_run(
    half: Servable, req: predict_pb2.PredictRequest, timeout: float | None
) -> None:
    with _direct("off"):
        want = _outcome(half, req, timeout)
    with _direct("on"):
        got = _outcome(half, req, timeout)
    assert got == want
    assert any(plan is not None for plan in half._plans.values())  # the direct path did run


def test_feeds_session_run_would_convert_go_through_session_run(half: Servable) -> None:
    """Values the plan cannot take as they are (another dtype, a list, a wrong shape) get ``Session.run``'s own
    conversion or error, the same with the direct path on or off."""
    _, sig = half.signature("")
    x = sig.inputs["x"].name
    y = sig.outputs["y"].name
    for value in (np.array([2.0], np.float64), [2.0], np.zeros((1, 2), np.float32)):
        outcomes = []
        for mode in ("off", "on"):
            with _direct(mode):
                try:
                    outcomes.append([v.tolist() for v in half._run({x: value}, [y], None)])
                except ServingError as exc:
                    outcomes.append([exc.code, exc.message])
        assert outcomes[0] == outcomes[1], value
    with _direct("on"):
        (out,) = half._run({x: np.array([2.0], np.float32)}, [y], None)
    assert out.tolist() == [2.0]  # 0.5 * 2 + 1


def test_unresolvable_names_fall_back_to_session_run_errors(half: Servable) -> None:
    _, sig = half.signature("")
    with _direct("on"), pytest.raises(ServingError) as exc:
        half._run({"nope:0": np.array([1.0], np.float32)}, [sig.outputs["y"].name], None)
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert half._plan(("nope:0",), (sig.outputs["y"].name,)) is None


def test_plan_cache_is_bounded(half: Servable) -> None:
    _, sig = half.signature("")
    x = sig.inputs["x"].name
    outs = [sig.outputs["y"].name, sig.outputs["x2"].name]
    with _direct("on"):
        for i in range(servable_mod._PLAN_CACHE_SIZE + 8):
            fetches = [outs[i % 2]]
            half._run({x: np.array([float(i)], np.float32)}, fetches, None)
            half._plan((x,), (f"bogus:{i}",))  # a distinct key each time
    assert len(half._plans) == servable_mod._PLAN_CACHE_SIZE


def test_typed_values_out_of_range_are_invalid_argument() -> None:
    """A ``half_val`` that does not fit 16 bits (client input) is INVALID_ARGUMENT, not INTERNAL."""
    req = predict_pb2.PredictRequest()
    req.inputs["x"].dtype = types_pb2.DT_HALF
    req.inputs["x"].tensor_shape.dim.add(size=1)
    req.inputs["x"].half_val.append(4194560)
    sig = meta_graph_pb2.SignatureDef()
    sig.inputs["x"].dtype = types_pb2.DT_HALF
    with pytest.raises(ServingError) as exc:
        servable_mod._decode_input("x", req.inputs["x"], sig.inputs["x"], sig)
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "tensor parsing error: x" in exc.value.message
