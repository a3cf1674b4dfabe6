"""updater.errors: every grpc status code maps to a retriable or a rejected ApplyError."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest

from updater.errors import ApplyRejected, ShardUnavailable, UpdaterError, error_from_grpc

RETRIABLE = {
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
    "RESOURCE_EXHAUSTED",
    "ABORTED",
    "CANCELLED",
    "NOT_FOUND",
    "UNKNOWN",
    "INTERNAL",
}


@pytest.mark.parametrize(
    "code", [c for c in grpc.StatusCode if c is not grpc.StatusCode.OK], ids=lambda c: c.name
)
def test_every_status_code_is_classified(code: grpc.StatusCode) -> None:
    exc = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="boom")
    err = error_from_grpc(exc, target="127.0.0.1:1", what="upsert_item on emb_ps_0")
    assert isinstance(err, UpdaterError)
    assert err.code is code and err.target == "127.0.0.1:1"
    assert f"upsert_item on emb_ps_0 at 127.0.0.1:1 failed: {code.name}: boom" == str(err)
    expected = ShardUnavailable if code.name in RETRIABLE else ApplyRejected
    assert type(err) is expected
    assert err.retriable is (code.name in RETRIABLE)
