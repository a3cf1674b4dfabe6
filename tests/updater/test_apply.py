"""updater.apply.ShardWriter against fake PS replicas: real gRPC servers on 127.0.0.1 that record what they get.

A group counts as written only when every replica of its shard acknowledged it; the request bytes go through the
shared channel/stub factory (tfs_grpc.channels) and tensor codec (schemas.tensors)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import grpc.aio
import numpy as np
import pytest

from schemas.deployment import EmbeddingModel
from schemas.proto import tfs_pb2
from schemas.tensors import from_ndarray, to_ndarray
from tests.support.ports import free_port
from tfs_grpc.channels import METHODS
from updater.apply import GroupKey, ShardWriter, WriteGroup
from updater.batch import Chunk, coalesce
from updater.errors import ApplyRejected, ShardUnavailable


@dataclass
class FakePs:
    """One replica: answers writes with ``stream_previous`` (or fails with ``code``); ``malformed`` sends a
    stream_previous whose bytes do not fit its shape."""

    target: str = ""
    requests: list[tfs_pb2.PredictRequest] = field(default_factory=list)
    code: grpc.StatusCode | None = None
    malformed: bool = False
    previous: int = 0

    async def predict(
        self, req: tfs_pb2.PredictRequest, ctx: grpc.aio.ServicerContext
    ) -> tfs_pb2.PredictResponse:
        if self.code is not None:
            await ctx.abort(self.code, "fake failure")
        self.requests.append(req)
        resp = tfs_pb2.PredictResponse()
        keys = list(req.inputs["stream_partitions"].string_val)
        prev = from_ndarray(np.full(len(keys), self.previous, np.int64))
        if self.malformed:
            prev.tensor_content = prev.tensor_content[:-1]
        resp.outputs["stream_previous"].CopyFrom(prev)
        return resp


@pytest.fixture
async def replicas() -> AsyncIterator[list[FakePs]]:
    out: list[FakePs] = []
    servers = []
    path, request, response = METHODS["Predict"]
    service, method = path.strip("/").split("/")
    for _ in range(2):
        ps = FakePs()
        srv = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(
            ps.predict,
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
        srv.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, {method: handler})])
        port = free_port()
        srv.add_insecure_port(f"127.0.0.1:{port}")
        await srv.start()
        ps.target = f"127.0.0.1:{port}"
        out.append(ps)
        servers.append(srv)
    try:
        yield out
    finally:
        for srv in servers:
            await srv.stop(None)


def _writer(replicas: list[FakePs], max_rows_per_call: int = 3) -> ShardWriter:
    model = EmbeddingModel.model_validate(
        {
            "name": "m",
            "manifest": "/nonexistent",
            "entry": "127.0.0.1:1",
            "shards": [{"replicas": [r.target for r in replicas]}],
        }
    )
    return ShardWriter([model], deadline_s=10, max_rows_per_call=max_rows_per_call)


def _group(n: int) -> WriteGroup:
    ids = np.arange(n, dtype=np.int64)
    rows = coalesce([Chunk(ids, np.ones((n, 2), np.float32), 5, 1)], 2)
    return WriteGroup(key=GroupKey("m", 0, "t"), rows=rows, positions={"d:0": 9})


async def test_every_replica_gets_every_row_and_the_position_goes_with_the_last_call(
    replicas: list[FakePs],
) -> None:
    writer = _writer(replicas)
    try:
        answers = await writer.apply(_group(5), lambda target: {"d:0": 4})
    finally:
        await writer.close()
    assert answers == {r.target: {"d:0": 0} for r in replicas}
    for ps in replicas:
        assert [r.model_spec.signature_name for r in ps.requests] == ["upsert_t", "upsert_t"]
        ids = np.concatenate([to_ndarray(r.inputs["ids"]) for r in ps.requests])
        assert ids.tolist() == [0, 1, 2, 3, 4]
        assert to_ndarray(ps.requests[0].inputs["values"]).shape == (3, 2)
        first, last = ps.requests
        assert list(first.inputs["stream_partitions"].string_val) == []
        assert list(last.inputs["stream_partitions"].string_val) == [b"d:0"]
        assert to_ndarray(last.inputs["stream_offsets"]).tolist() == [9]
        assert to_ndarray(last.inputs["stream_expected"]).tolist() == [4]


async def test_one_replica_down_fails_the_group_retriably(replicas: list[FakePs]) -> None:
    replicas[1].code = grpc.StatusCode.UNAVAILABLE
    writer = _writer(replicas)
    try:
        with pytest.raises(ShardUnavailable) as info:
            await writer.apply(_group(2))
    finally:
        await writer.close()
    assert info.value.target == replicas[1].target
    assert len(replicas[0].requests) == 1, "the healthy replica was not written"


async def test_a_retriable_failure_wins_over_a_rejection(replicas: list[FakePs]) -> None:
    replicas[0].code = grpc.StatusCode.INVALID_ARGUMENT
    writer = _writer(replicas)
    try:
        with pytest.raises(ApplyRejected):
            await writer.apply(_group(2))
        replicas[1].code = grpc.StatusCode.UNAVAILABLE
        with pytest.raises(ShardUnavailable):
            await writer.apply(_group(2))
    finally:
        await writer.close()


async def test_a_malformed_answer_is_a_retriable_internal_error(replicas: list[FakePs]) -> None:
    replicas[0].malformed = True
    writer = _writer(replicas)
    try:
        with pytest.raises(ShardUnavailable, match="malformed answer") as info:
            await writer.apply(_group(2))
    finally:
        await writer.close()
    assert info.value.code is grpc.StatusCode.INTERNAL
