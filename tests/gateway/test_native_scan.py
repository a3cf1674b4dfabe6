"""``gateway.native.plain_predict_request`` (native/src/scan.rs): which gRPC PredictRequests skip the parse worker.

* Every request of numeric tensors that protobuf serializes (``tensor_content``, packed values, shapes, output
  filters, versions) is plain, so the gateway's own requests and every client's ordinary ones skip the worker.
* Soundness: a message the scan calls plain always parses (hypothesis mutates valid messages byte by byte; a plain
  verdict on a message protobuf refuses would let it be parsed on the gateway's own thread unchecked first).
* String tensors, unknown fields, truncated messages and too many fields are not plain; with the native path off
  nothing is.
* The gRPC front's parse of large messages: with the native path only messages that are not plain (string
  tensors, Classify/Regress) go to the parse worker; with it off every one does.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import native
from schemas.proto import tfs_pb2
from schemas.tensors import from_ndarray
from tests.support.native import native_mode

pytestmark = pytest.mark.skipif(
    not native.available() or not hasattr(native._module(), "plain_predict_request"),
    reason="embedgate_native is not built with the scan (make install)",
)

_DTYPES = st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.float16, np.uint32, np.uint64])


@st.composite
def _request(draw: st.DrawFn) -> tfs_pb2.PredictRequest:
    req = tfs_pb2.PredictRequest()
    req.model_spec.name = draw(st.text(max_size=20))
    req.model_spec.signature_name = draw(st.text(max_size=10))
    if draw(st.booleans()):
        req.model_spec.version.value = draw(st.integers(0, 2**62))
    for k in range(draw(st.integers(0, 4))):
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        arr = (np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) * 1.5).astype(draw(_DTYPES))
        t = from_ndarray(arr)
        if draw(st.booleans()) and arr.dtype in (np.float32, np.int32, np.int64) and arr.size:
            # typed repeated values instead of tensor_content (packed on the wire)
            t.ClearField("tensor_content")
            field = {np.float32: t.float_val, np.int32: t.int_val, np.int64: t.int64_val}[arr.dtype.type]
            field.extend(arr.reshape(-1).tolist())
        req.inputs[f"in{k}"].CopyFrom(t)
    req.output_filter.extend(draw(st.lists(st.text(max_size=5), max_size=2)))
    return req


@settings(max_examples=150, deadline=None)
@given(_request())
def test_numeric_requests_are_plain(req: tfs_pb2.PredictRequest) -> None:
    with native_mode("auto"):
        assert native.plain_predict_request(req.SerializeToString())
    with native_mode("off"):
        assert not native.plain_predict_request(req.SerializeToString())


@settings(max_examples=300, deadline=None)
@given(_request(), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4))
def test_a_plain_verdict_always_parses(req: tfs_pb2.PredictRequest, edits: list[tuple[int, int]]) -> None:
    raw = bytearray(req.SerializeToString())
    if not raw:
        return
    for at, value in edits:
        raw[at % len(raw)] = value
    cut = bytes(raw[: len(raw) - edits[0][1] % 3])  # sometimes truncated too
    with native_mode("auto"):
        plain = native.plain_predict_request(cut)
    if plain:
        tfs_pb2.PredictRequest.FromString(cut)  # must not raise


def test_strings_unknown_fields_truncation_and_field_count_are_not_plain() -> None:
    strings = tfs_pb2.PredictRequest()
    strings.inputs["q"].CopyFrom(from_ndarray(np.array([b"a", b"b"], dtype=object)))
    ok = tfs_pb2.PredictRequest()
    ok.inputs["x"].CopyFrom(from_ndarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
    raw = ok.SerializeToString()
    many = tfs_pb2.PredictRequest()
    for k in range(1025):
        many.inputs[f"i{k}"].dtype = tfs_pb2.DT_FLOAT
    with native_mode("auto"):
        assert native.plain_predict_request(raw)
        assert not native.plain_predict_request(strings.SerializeToString())
        assert not native.plain_predict_request(raw + b"\x28\x01")  # field 5 (unknown here), varint
        assert not native.plain_predict_request(raw[:-1])
        assert not native.plain_predict_request(many.SerializeToString())
    with pytest.raises(DecodeError):
        tfs_pb2.PredictRequest.FromString(raw[:-1])


class _Pool:
    """A stand-in parse worker pool recording what it is asked to check (runs the check in process)."""

    def __init__(self) -> None:
        self.checked: list[int] = []

    async def acall(self, fn: Any, *args: Any) -> Any:
        self.checked.append(len(args[1]))
        return fn(*args)


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_only_messages_that_are_not_plain_go_to_the_parse_worker(mode: str) -> None:
    """The gRPC front's parse (``_Servicer._parse``) of large messages: with the native path a plain PredictRequest
    is parsed in process only; a string tensor, a Regress request and every message with the native path off are
    checked by the worker first. Either way the same message comes out."""
    from concurrent.futures import ThreadPoolExecutor

    from gateway.grpc_front.servicer import _Servicer, offload_threshold
    from gateway.limits import request_scope
    from schemas.gateway_settings import LimitsSettings

    limits = LimitsSettings(offload_bytes=0)
    rt = SimpleNamespace(settings=SimpleNamespace(limits=limits, max_body_bytes=1 << 26))
    servicer = _Servicer(rt, None)  # type: ignore[arg-type]
    plain = tfs_pb2.PredictRequest()
    plain.inputs["x"].CopyFrom(from_ndarray(np.arange(40_000, dtype=np.int64)))
    strings = tfs_pb2.PredictRequest()
    strings.inputs["q"].CopyFrom(from_ndarray(np.array([b"a"] * 10, dtype=object)))
    regress = tfs_pb2.RegressionRequest()
    regress.model_spec.name = "m"
    messages: list[tuple[type[Any], bytes]] = [
        (tfs_pb2.PredictRequest, plain.SerializeToString()),
        (tfs_pb2.PredictRequest, strings.SerializeToString()),
        (tfs_pb2.RegressionRequest, regress.SerializeToString()),
    ]
    pool = _Pool()

    async def parse_all() -> list[Any]:
        out = []
        with ThreadPoolExecutor(1) as executor:
            for kind, raw in messages:
                with request_scope(limits, executor, len(raw), pool):  # type: ignore[arg-type]
                    plain, _ = offload_threshold(kind, raw, limits)
                    out.append((await servicer._parse(kind, raw, plain)).message)
        return out

    with native_mode(mode):
        parsed = asyncio.run(parse_all())
    assert [m.SerializeToString() for m in parsed] == [raw for _, raw in messages]
    sizes = [len(raw) for _, raw in messages]
    assert pool.checked == (sizes[1:] if mode == "auto" else sizes)


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_a_plain_predict_request_is_large_from_plain_offload_bytes(mode: str) -> None:
    """Where a gRPC request's work runs (``offload_threshold``): a plain PredictRequest goes off the loop from
    ``limits.plain_offload_bytes``, every other message (and every message with the native path off) from
    ``limits.offload_bytes``."""
    from gateway.grpc_front.servicer import offload_threshold
    from schemas.gateway_settings import LimitsSettings

    limits = LimitsSettings(offload_bytes=1000, plain_offload_bytes=50_000)
    plain = tfs_pb2.PredictRequest()
    plain.inputs["x"].CopyFrom(from_ndarray(np.arange(2_000, dtype=np.int64)))
    strings = tfs_pb2.PredictRequest()
    strings.inputs["q"].CopyFrom(from_ndarray(np.array([b"a"] * 2_000, dtype=object)))
    regress = tfs_pb2.RegressionRequest()
    regress.model_spec.name = "m" * 2_000
    with native_mode(mode):
        got = [
            offload_threshold(tfs_pb2.PredictRequest, plain.SerializeToString(), limits),
            offload_threshold(tfs_pb2.PredictRequest, strings.SerializeToString(), limits),
            offload_threshold(tfs_pb2.RegressionRequest, regress.SerializeToString(), limits),
        ]
    first = (True, 50_000) if mode == "auto" else (False, 1000)
    assert got == [first, (False, 1000), (False, 1000)]
