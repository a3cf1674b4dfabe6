"""Cached signature metadata follows the served version: a new latest version with other input dtypes works."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from tests.gateway.conftest import app_client
from tests.gateway.models import build_retyped

pytestmark = pytest.mark.integration


async def test_new_version_with_new_dtypes_is_picked_up(tmp_path: Path) -> None:
    from tests.support.servers import serve_local

    staging = tmp_path / "staging"
    base = tmp_path / "retyped"
    build_retyped(base, 1)
    build_retyped(staging, 2)
    with serve_local({"retyped": base}, poll_seconds=0.2) as srv:
        models = [{"kind": "passthrough", "name": "retyped", "target": srv.target}]
        async with app_client(models=models, metadata_ttl_s=3600) as gw:
            r = await gw.post("/v1/models/retyped:predict", content=b'{"instances": [2.0]}')
            assert r.json() == {"predictions": [3.0]}
            shutil.copytree(staging / "2", base / "2")
            for _ in range(150):
                status = (await gw.get("/v1/models/retyped")).json()["model_version_status"]
                if [s["version"] for s in status if s["state"] == "AVAILABLE"] == ["2"]:
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail(f"version 2 never became the only AVAILABLE version: {status}")
            r = await gw.post("/v1/models/retyped:predict", content=b'{"instances": [2]}')
            assert r.status_code == 200, r.text
            assert r.json() == {"predictions": [20.0]}
            meta = (await gw.get("/v1/models/retyped/metadata")).json()
            assert meta["model_spec"]["version"] == "2"
            sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
            assert sig["inputs"]["x"]["dtype"] == "DT_INT64"
