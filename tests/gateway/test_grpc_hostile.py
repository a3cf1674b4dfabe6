"""Hostile gRPC clients (issue 21): the gRPC front has REST's protections.

A real ``embedgate gateway`` process (tokens, ``grpc_port``, ``ops_port``) over serve-local backends (the pass-through
models of ``tests.gateway.conftest`` and the small demo embedding model), called over real gRPC on 127.0.0.1 with raw
bytes (``channel.unary_unary`` without serializers), so any message, well-formed or not, can be sent. Each class:

* no token: refused UNAUTHENTICATED with the message never read (``embedgate_grpc_request_bytes_total`` unchanged);
* malformed messages (a corpus and hypothesis garbage): INVALID_ARGUMENT, details free of internals;
* shape bombs: INVALID_ARGUMENT (rank, negative dims) or RESOURCE_EXHAUSTED (sizes), before any allocation;
* too many examples / instances: RESOURCE_EXHAUSTED naming ``limits.max_instances``, as REST's 413;
* over the buffered-bytes budget: RESOURCE_EXHAUSTED naming ``limits.max_buffered_bytes``, counted as rejected;
* a burst beyond ``max_in_flight``: the gateway's RESOURCE_EXHAUSTED, counted; never CANCELLED inside gRPC;
* a large message is parsed off the event loop: ``/healthz`` answers while its check is held in the parse worker.

No durations are asserted; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.grpc_front import messages as messages_module
from gateway.grpc_front import servicer as servicer_module
from schemas.proto import tfs_pb2
from tests.gateway.conftest import passthrough_models
from tests.support import gates
from tests.support.gateway import run_gateway
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

_WAIT_S = 60.0  # bound of every call and wait (never reached when the gateway behaves)
_TOKEN = "hostile-all-models-token"
_HALF_TOKEN = "hostile-half-only-token"
_MAX_BODY = 8 * 1024 * 1024
_BUDGET = 3 * 1024 * 1024  # limits.max_buffered_bytes: below max_body_bytes, so one message can be over it
_PREDICT = "/tensorflow.serving.PredictionService/Predict"
_CLASSIFY = "/tensorflow.serving.PredictionService/Classify"
_REGRESS = "/tensorflow.serving.PredictionService/Regress"
_METADATA = "/tensorflow.serving.PredictionService/GetModelMetadata"
_STATUS = "/tensorflow.serving.ModelService/GetModelStatus"
_KINDS: dict[str, Any] = {
    _PREDICT: tfs_pb2.PredictRequest,
    _CLASSIFY: tfs_pb2.ClassificationRequest,
    _REGRESS: tfs_pb2.RegressionRequest,
    _METADATA: tfs_pb2.GetModelMetadataRequest,
    _STATUS: tfs_pb2.GetModelStatusRequest,
}
# What a client must never read in an error: our proto package, parser/exception class names, tracebacks.
_LEAKS = re.compile(
    r"embedgate\.|tfs_pb2|google\.protobuf|Traceback|DecodeError|\b(?:Value|Type|Key|Attribute|Runtime|Memory|"
    r"Recursion|Overflow|Index|Unicode\w*)Error\b|Exception"
)
_NEVER = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED}


@dataclass
class Gw:
    url: str
    ops: str
    port: int  # gRPC
    channel: grpc.Channel

    def call(self, method: str, raw: bytes, token: str | None = _TOKEN) -> tuple[grpc.StatusCode, str, bytes]:
        """(status, details, reply bytes) of one raw call."""
        fn = self.channel.unary_unary(method)
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        try:
            reply = fn(raw, timeout=_WAIT_S, metadata=metadata)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or "", b""
        assert isinstance(reply, bytes)
        return grpc.StatusCode.OK, "", reply

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.ops}/metrics", timeout=_WAIT_S).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith((name + " ", name + "{")):
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory,
    demo_artifacts: Any,
    demo_backends: Any,
    passthrough_backend: Any,
) -> Iterator[Gw]:
    m = demo_artifacts.manifest
    embedding = {
        "kind": "embedding",
        "name": m.model_name,
        "manifest": str(demo_artifacts.model_dir),
        "entry": demo_backends.target,
        "shards": [{"replicas": [demo_backends.target]}] * m.num_shards,
    }
    d = tmp_path_factory.mktemp("grpc_hostile")
    tokens = d / "tokens"
    tokens.write_text(f"{_TOKEN}\n{_HALF_TOKEN} half\n", encoding="utf-8")
    cfg = d / "gateway.yaml"
    config = {
        "models": [embedding, *passthrough_models(passthrough_backend.target)],
        "auth": {"tokens_file": str(tokens)},
        "max_body_bytes": _MAX_BODY,
        "max_in_flight": 16,
        "limits": {"max_buffered_bytes": _BUDGET},
    }
    cfg.write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    port, ops = free_port(), free_port()
    env = {"EMBEDGATE_GRPC_PORT": str(port), "EMBEDGATE_OPS_PORT": str(ops)}
    options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
    with (
        run_gateway(cfg, env=env) as proc,
        grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel,
    ):
        yield Gw(proc.url, f"http://127.0.0.1:{ops}", port, channel)


def _tensor(shape: list[int], dtype: Any = tfs_pb2.DataType.DT_FLOAT, **values: Any) -> tfs_pb2.TensorProto:
    t = tfs_pb2.TensorProto(dtype=dtype)
    for size in shape:
        t.tensor_shape.dim.add().size = size
    for field, v in values.items():
        if field == "tensor_content":
            t.tensor_content = v
        else:
            getattr(t, field).extend(v)
    return t


def _predict(model: str, **inputs: tfs_pb2.TensorProto) -> bytes:
    req = tfs_pb2.PredictRequest()
    req.model_spec.name = model
    for name, t in inputs.items():
        req.inputs[name].CopyFrom(t)
    raw: bytes = req.SerializeToString()
    return raw


def _examples(kind: Any, model: str, n: int, values: int = 1, signature: str = "") -> bytes:
    """A Classify/Regress request of ``n`` examples with one float feature ``x`` of ``values`` values."""
    feature = tfs_pb2.Feature()
    feature.float_list.value.extend([0.5] * values)
    example = tfs_pb2.Example()
    example.features.feature["x"].CopyFrom(feature)
    req: Any = kind()
    req.model_spec.name = model
    req.model_spec.signature_name = signature
    # built on the wire (fast for 100k examples): Input.example_list (field 1) -> ExampleList.examples (field 1)
    one: bytes = example.SerializeToString()
    example_list = (b"\x0a" + _varint(len(one)) + one) * n
    inp = b"\x0a" + _varint(len(example_list)) + example_list
    head: bytes = req.SerializeToString()
    return head + b"\x12" + _varint(len(inp)) + inp


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _assert_clean(code: grpc.StatusCode, details: str, what: object) -> None:
    assert code not in _NEVER, (what, code, details)
    assert not _LEAKS.search(details), (what, details)


# ---- authentication before the message is read --------------------------------------------------------------------


def test_no_token_big_messages_are_refused_unread(gw: Gw) -> None:
    """16 concurrent 6 MB messages without a token (and with a wrong one): UNAUTHENTICATED, and not one byte of them
    was read by the gateway; the same message with a token is read (the counter moves by its size)."""
    big = _predict("half", x=_tensor([1], float_val=[1.0])) + b"\xfa\x3e" + _varint(6 * 1024 * 1024)
    big += b"\0" * (6 * 1024 * 1024)  # an unknown field 999: a valid message of 6 MB
    before = gw.metric("embedgate_grpc_request_bytes_total")
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda tok: gw.call(_PREDICT, big, tok), [None] * 12 + ["wrong"] * 4))
    assert {code for code, _, _ in results} == {grpc.StatusCode.UNAUTHENTICATED}, results
    assert gw.metric("embedgate_grpc_request_bytes_total") == before, (
        "a message without a valid token was read"
    )
    code, details, _ = gw.call(_STATUS, b"\xff\xff", None)  # not even parsed: unparseable bytes, no token
    assert code == grpc.StatusCode.UNAUTHENTICATED, details
    assert gw.metric("embedgate_grpc_request_bytes_total") == before
    small = _predict("half", x=_tensor([1], float_val=[1.0]))
    code, details, _ = gw.call(_PREDICT, small)
    assert code == grpc.StatusCode.OK, details
    assert gw.metric("embedgate_grpc_request_bytes_total") == before + len(small)


def test_token_for_another_model_is_permission_denied(gw: Gw) -> None:
    x = _tensor([1], float_val=[1.0])
    code, details, _ = gw.call(_PREDICT, _predict("multi", x=x), _HALF_TOKEN)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "multi" in details, details
    code, details, _ = gw.call(_PREDICT, _predict("half", x=x), _HALF_TOKEN)
    assert code == grpc.StatusCode.OK, details


# ---- malformed messages -------------------------------------------------------------------------------------------


def _deep_groups(depth: int) -> bytes:
    return b"\xfb\x3e" * depth + b"\xfc\x3e" * depth  # start/end group of field 999, nested


def _corpus() -> list[tuple[str, bytes]]:
    valid = {
        _PREDICT: _predict("half", x=_tensor([2], float_val=[1.0, 2.0])),
        _CLASSIFY: _examples(tfs_pb2.ClassificationRequest, "cr", 2, signature="classify"),
        _REGRESS: _examples(tfs_pb2.RegressionRequest, "cr", 2),
        _METADATA: tfs_pb2.GetModelMetadataRequest(
            model_spec=tfs_pb2.ModelSpec(name="half"), metadata_field=["signature_def"]
        ).SerializeToString(),
        _STATUS: tfs_pb2.GetModelStatusRequest(model_spec=tfs_pb2.ModelSpec(name="half")).SerializeToString(),
    }
    out: list[tuple[str, bytes]] = []
    for method, good in valid.items():
        out += [
            (method, good[:-1]),  # truncated
            (method, good[: len(good) // 2]),
            (method, b"\xff" * 16),  # field 0 / bad tag
            (method, b"\x0a\xff\xff\xff\xff\x0f"),  # length far beyond the message
            (method, b"\x0a\x05\x0a\x03\xff\xfe\xfd"),  # model_spec.name not UTF-8
            (method, b"\x0b"),  # start group never ended
            (method, b"\x0c"),  # end group without start
            (method, b"\x0f"),  # wire type 7
            (method, _deep_groups(200)),  # nesting beyond the parser's depth limit
            (method, _deep_groups(100_000)),
            (method, b"\x0a\x02\x0a\x80"),  # varint cut inside a submessage
            (method, good + b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"),  # varint of 11 bytes
        ]
    return out


def test_malformed_messages_are_invalid_argument(gw: Gw) -> None:
    for method, raw in _corpus():
        assert not _parses(_KINDS[method], raw), (method, raw[:32])  # the corpus's own precondition
        code, details, _ = gw.call(method, raw)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, raw[:32], code, details)
        _assert_clean(code, details, (method, raw[:32]))
        assert "Cannot parse the" in details, details


def _parses(kind: Any, raw: bytes) -> bool:
    try:
        kind.FromString(raw)
    except (DecodeError, RuntimeError, ValueError):
        return False
    return True


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    method=st.sampled_from(sorted(_KINDS)),
    raw=st.one_of(
        st.binary(max_size=300),
        st.builds(
            lambda head, junk: head + junk,
            st.sampled_from([b"\x0a\x06\x0a\x04half", b"\x0a\x04\x0a\x02cr", b"\x12", b"\x1a\x05\x0a\x01x"]),
            st.binary(max_size=200),
        ),
    ),
)
def test_garbage_never_gets_unknown_or_internal(gw: Gw, method: str, raw: bytes) -> None:
    """Whatever the bytes: bytes that do not parse get INVALID_ARGUMENT; bytes that happen to parse get an answer
    that is never UNKNOWN, INTERNAL or CANCELLED; no detail leaks internals."""
    code, details, _ = gw.call(method, raw)
    _assert_clean(code, details, (method, raw))
    if not _parses(_KINDS[method], raw):
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, raw, code, details)


# ---- shapes and counts --------------------------------------------------------------------------------------------

_RANK = messages_module.MAX_RANK


def _bombs(name: str) -> list[tuple[tfs_pb2.TensorProto, grpc.StatusCode, str]]:
    code_size = grpc.StatusCode.RESOURCE_EXHAUSTED
    bad = grpc.StatusCode.INVALID_ARGUMENT
    return [
        (_tensor([1, 25_000_000], float_val=[1.0]), code_size, "max_body_bytes"),  # 30 bytes -> 100 MB
        (_tensor([1, 2**40], float_val=[1.0]), code_size, "max_body_bytes"),
        (_tensor([1, 2**62, 2**62, 2**62], float_val=[1.0]), code_size, "max_body_bytes"),
        (_tensor([2**40], float_val=[1.0]), code_size, "limits.max_instances"),
        (_tensor([1, 2_000_000], tfs_pb2.DataType.DT_STRING, string_val=[b"a"]), code_size, "max_body_bytes"),
        (_tensor([-1], float_val=[1.0]), bad, "dimension 0"),
        (_tensor([1, -5], float_val=[1.0]), bad, "dimension 1"),
        (_tensor([2, -(2**62)], float_val=[1.0]), bad, "dimension 1"),
        (_tensor([1] * (_RANK + 1), float_val=[1.0]), bad, f"{_RANK + 1} dimensions"),
        (_tensor([1] * 10_000, float_val=[1.0]), bad, "10000 dimensions"),
    ]


def test_shape_bombs_are_refused_before_allocation(gw: Gw, demo_artifacts: Any) -> None:
    embedding = demo_artifacts.manifest
    single = embedding.sparse_features[0].name
    for model, name in (("half", "x"), (embedding.model_name, single)):
        for t, want, text in _bombs(name):
            code, details, _ = gw.call(_PREDICT, _predict(model, **{name: t}))
            assert code == want and text in details, (model, list(t.tensor_shape.dim)[:3], code, details)
            assert repr(name) in details, details
            _assert_clean(code, details, model)
    # at the bounds: rank 64 and an empty dimension pass the checks and get the model's own answer
    for t in (_tensor([1] * _RANK, float_val=[1.0]), _tensor([0, 2**40])):
        code, details, _ = gw.call(_PREDICT, _predict("half", x=t))
        _assert_clean(code, details, "half at the bounds")
        assert code != grpc.StatusCode.RESOURCE_EXHAUSTED, details


_MAX_INSTANCES = 100_000  # the default limits.max_instances


def test_too_many_examples_and_instances(gw: Gw, demo_artifacts: Any) -> None:
    n = _MAX_INSTANCES + 1
    for method, kind in ((_CLASSIFY, tfs_pb2.ClassificationRequest), (_REGRESS, tfs_pb2.RegressionRequest)):
        code, details, _ = gw.call(method, _examples(kind, "cr", n, signature="classify"))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (method, code, details)
        assert f"{n} examples" in details and "limits.max_instances" in details, details
    code, details, _ = gw.call(_REGRESS, _examples(tfs_pb2.RegressionRequest, "cr", 1, values=100_001))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert "'x' of example 0" in details and "limits.max_ids_per_feature" in details, details
    x = _tensor([n], tensor_content=np.zeros(n, dtype=np.float32).tobytes())
    code, details, _ = gw.call(_PREDICT, _predict("half", x=x))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "limits.max_instances" in details, details
    single = demo_artifacts.manifest.sparse_features[0].name
    ids = _tensor([n], tfs_pb2.DataType.DT_INT64, tensor_content=np.ones(n, dtype=np.int64).tobytes())
    code, details, _ = gw.call(_PREDICT, _predict(demo_artifacts.manifest.model_name, **{single: ids}))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "limits.max_instances" in details, details
    # within the limits: answered
    code, details, reply = gw.call(_REGRESS, _examples(tfs_pb2.RegressionRequest, "cr", 1000))
    assert code == grpc.StatusCode.OK, details
    assert len(tfs_pb2.RegressionResponse.FromString(reply).result.regressions) == 1000


# ---- the buffered-bytes budget ------------------------------------------------------------------------------------


def test_over_budget_is_resource_exhausted_and_counted(gw: Gw) -> None:
    """A message larger than limits.max_buffered_bytes, and a 30-byte tensor that would decode to more than it:
    RESOURCE_EXHAUSTED naming the budget, counted in embedgate_requests_rejected_total; the budget is given back."""
    rejected = gw.metric("embedgate_requests_rejected_total")
    pad = _BUDGET + 1024
    big = _predict("half", x=_tensor([1], float_val=[1.0])) + b"\xfa\x3e" + _varint(pad) + b"\0" * pad
    code, details, _ = gw.call(_PREDICT, big)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "limits.max_buffered_bytes" in details, details
    expands = _predict(
        "half", x=_tensor([1, _BUDGET // 4 + 16], float_val=[1.0])
    )  # < max_body_bytes, > budget
    code, details, _ = gw.call(_PREDICT, expands)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "limits.max_buffered_bytes" in details, details
    assert gw.metric("embedgate_requests_rejected_total") == rejected + 2
    code, details, _ = gw.call(_PREDICT, _predict("half", x=_tensor([2], float_val=[1.0, 2.0])))
    assert code == grpc.StatusCode.OK, details  # nothing stayed reserved


# ---- bursts -------------------------------------------------------------------------------------------------------


def test_burst_gets_counted_resource_exhausted_never_cancelled(gw: Gw) -> None:
    """3,000 concurrent calls (max_in_flight 16): each is answered by the gateway, OK or RESOURCE_EXHAUSTED, and the
    refusals are in embedgate_requests_rejected_total. gRPC's own backlog (1,000 calls by default) would cancel
    some silently: CANCELLED, never counted."""
    raw = _predict("half", x=_tensor([1], float_val=[1.0]))
    rejected = gw.metric("embedgate_requests_rejected_total")

    async def burst() -> collections.Counter[str]:
        counts: collections.Counter[str] = collections.Counter()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as channel:
            fn = channel.unary_unary(_PREDICT)

            async def one() -> None:
                try:
                    await fn(raw, timeout=_WAIT_S, metadata=(("authorization", f"Bearer {_TOKEN}"),))
                    counts["OK"] += 1
                except grpc.aio.AioRpcError as exc:
                    refused = exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    counts[
                        "max_in_flight"
                        if refused and "max_in_flight" in (exc.details() or "")
                        else exc.code().name
                    ] += 1

            await asyncio.gather(*(one() for _ in range(3000)))
        return counts

    counts = asyncio.run(burst())
    assert set(counts) <= {"OK", "max_in_flight"}, counts  # refusals name max_in_flight
    assert counts["OK"] > 0, counts
    assert gw.metric("embedgate_requests_rejected_total") == rejected + counts["max_in_flight"], counts


# ---- off the event loop -------------------------------------------------------------------------------------------


def gated_check_message(gate: str, *args: Any) -> int:
    """``check_message`` as the parse worker runs it, held until the test creates ``<gate>/go`` (bounded wait).

    Writes the worker's pid to ``<gate>/started`` first. Module-level: the worker process imports it by name."""
    gates.hold(gate, _WAIT_S)
    return messages_module.check_message(*args)


async def test_large_message_is_checked_off_the_event_loop(
    passthrough_backend: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """In process: a large Regress is held inside the parse worker (another pid) while /healthz and a small gRPC
    call are answered; released, it is answered."""
    from gateway.app import create_app
    from schemas.gateway_settings import GatewaySettings

    gate: Callable[..., int] = functools.partial(gated_check_message, str(tmp_path))
    monkeypatch.setattr(servicer_module, "check_message", gate)
    port = free_port()
    app = create_app(
        GatewaySettings.model_validate(
            {
                "models": passthrough_models(passthrough_backend.target),
                "grpc_port": port,
                "limits": {"parse_processes": 1},
            }
        )
    )
    big = _examples(tfs_pb2.RegressionRequest, "cr", 20_000)
    assert len(big) >= app.state.runtime.settings.limits.offload_bytes
    small = tfs_pb2.GetModelStatusRequest(model_spec=tfs_pb2.ModelSpec(name="half")).SerializeToString()
    async with (
        app.router.lifespan_context(app),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http,
    ):
        task = asyncio.ensure_future(channel.unary_unary(_REGRESS)(big, timeout=_WAIT_S))
        pid = await gates.reached(tmp_path / "started", "the message", _WAIT_S)
        assert int(pid) != os.getpid(), "the message was checked in the gateway's own process"
        health = await asyncio.wait_for(http.get("/healthz"), _WAIT_S)
        assert health.status_code == 200
        status = await channel.unary_unary(_STATUS)(small, timeout=_WAIT_S)
        assert tfs_pb2.GetModelStatusResponse.FromString(status).model_version_status
        assert not task.done(), "the large call finished while its check was held"
        (tmp_path / "go").touch()
        reply = await asyncio.wait_for(task, _WAIT_S)
    assert len(tfs_pb2.RegressionResponse.FromString(reply).result.regressions) == 20_000


# ---- gRPC's own compression ---------------------------------------------------------------------------------------


def test_grpc_compressed_bomb_is_refused_by_size(gw: Gw) -> None:
    """A message gzip-compressed by the gRPC client (``grpc-encoding: gzip``) that inflates past max_body_bytes:
    gRPC inflates messages itself (in its C core, off the event loop) and refuses it by size; a small compressed
    message is answered."""
    pad = 4 * _MAX_BODY
    bomb = _predict("half", x=_tensor([1], float_val=[1.0])) + b"\xfa\x3e" + _varint(pad) + b"\0" * pad
    metadata = (("authorization", f"Bearer {_TOKEN}"),)
    fn = gw.channel.unary_unary(_PREDICT)
    with pytest.raises(grpc.RpcError) as exc:
        fn(bomb, timeout=_WAIT_S, metadata=metadata, compression=grpc.Compression.Gzip)
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.value.details()
    reply = fn(
        _predict("half", x=_tensor([1], float_val=[1.0])),
        timeout=_WAIT_S,
        metadata=metadata,
        compression=grpc.Compression.Gzip,
    )
    assert tfs_pb2.PredictResponse.FromString(reply).outputs
