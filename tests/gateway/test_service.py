"""gateway.service without servers: metadata cache TTL/refresh, name resolution, hidden signatures (fake client)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gateway.errors import InvalidArgument, NotFound
from gateway.service import Gateway, MetadataCache, PassthroughServable, VersionSpec, is_hidden_signature
from schemas.deployment import PassthroughModel
from schemas.proto import tfs_pb2


class FakeClient:
    target = "fake:1"

    def __init__(self) -> None:
        self.version = 1
        self.metadata_calls = 0

    async def get_model_metadata(self, req: tfs_pb2.GetModelMetadataRequest, deadline: float) -> Any:
        self.metadata_calls += 1
        sigmap = tfs_pb2.SignatureDefMap()
        sigmap.signature_def["serving_default"].inputs["x"].dtype = tfs_pb2.DataType.DT_FLOAT
        sigmap.signature_def["lookup"].inputs["t_ids"].dtype = tfs_pb2.DataType.DT_INT64
        resp = tfs_pb2.GetModelMetadataResponse()
        resp.model_spec.name = req.model_spec.name
        resp.model_spec.version.value = self.version
        resp.metadata["signature_def"].value = sigmap.SerializeToString()
        return resp


async def test_cache_ttl_fresh_and_invalidate() -> None:
    client = FakeClient()
    cache = MetadataCache(ttl=3600)
    deadline = time.monotonic() + 5
    assert (await cache.get(client, "m", None, deadline))[0] == 1  # type: ignore[arg-type]
    await cache.get(client, "m", None, deadline)  # type: ignore[arg-type]
    assert client.metadata_calls == 1
    client.version = 2
    assert (await cache.get(client, "m", None, deadline))[0] == 1  # type: ignore[arg-type]
    cache.invalidate("m", None)
    assert (await cache.get(client, "m", None, deadline))[0] == 2  # type: ignore[arg-type]
    assert (await cache.get(client, "m", None, deadline, fresh=True))[0] == 2  # type: ignore[arg-type]
    assert client.metadata_calls == 3
    zero = MetadataCache(ttl=0)
    await zero.get(client, "m", None, deadline)  # type: ignore[arg-type]
    await zero.get(client, "m", None, deadline)  # type: ignore[arg-type]
    assert client.metadata_calls == 5


async def test_resolution_labels_and_hidden_signatures() -> None:
    cfg = PassthroughModel(name="m", target="h:1", version_labels={"stable": 4})
    gw = Gateway({"m": PassthroughServable(cfg, FakeClient(), MetadataCache(60))})  # type: ignore[arg-type]
    deadline = time.monotonic() + 5
    with pytest.raises(NotFound, match=r"Servable not found for request: Latest\(x\)"):
        await gw.predict("x", VersionSpec(), b'{"instances": [1.0]}', deadline)
    with pytest.raises(InvalidArgument, match="Unrecognized servable version label: canary"):
        await gw.predict("m", VersionSpec(label="canary"), b'{"instances": [1.0]}', deadline)
    with pytest.raises(NotFound):
        await gw.predict("m", VersionSpec(), b'{"instances": [1], "signature_name": "lookup"}', deadline)
    with pytest.raises(InvalidArgument, match="JSON Parse error"):  # body parsed before the model is resolved
        await gw.predict("x", VersionSpec(), b"{", deadline)
    meta = await gw.metadata("m", VersionSpec(label="stable"), deadline)
    assert b'"lookup"' not in meta.body and b'"serving_default"' in meta.body


@pytest.mark.parametrize(
    ("sig", "hidden"),
    [
        ("lookup", True),
        ("row_count", True),
        ("upsert_items", True),
        ("delete_items", True),
        ("serving_default", False),
        ("", False),
        ("lookups", False),
    ],
)
def test_hidden_signatures(sig: str, hidden: bool) -> None:
    assert is_hidden_signature(sig) is hidden
