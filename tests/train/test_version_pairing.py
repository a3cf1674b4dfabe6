"""The gateway's entry/PS version pairing (unit): ``ManifestStore.ps_version_of`` and its layout check, and the
``VersionPinner`` choosing an entry version whose PS version every shard serves."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gateway.core.manifests import ManifestStore
from gateway.core.versions import DEGRADED_VERSION_FALLBACK, VersionPinner
from schemas.manifest import Manifest
from schemas.proto import tfs_pb2

BASE = {
    "model_name": "m",
    "version": 1,
    "tables": [{"name": "t", "dim": 2}],
    "sparse_features": [{"name": "f", "table": "t"}],
    "partition": {"num_shards": 2},
    "entry": {"outputs": [{"name": "score", "shape": [1]}]},
}


def _manifest(**changes: Any) -> Manifest:
    return Manifest.model_validate({**BASE, **changes})


def _write(path: Path, m: Manifest) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(m.dumps())
    tmp.replace(path)


def test_layout_key_covers_tables_and_partitioning_only() -> None:
    base = _manifest()
    assert _manifest(version=7, stream_cut={"x:0": 3}).ps_layout_key == base.ps_layout_key
    assert _manifest(tables=[{"name": "t", "dim": 2, "rows": 99}]).ps_layout_key == base.ps_layout_key
    assert _manifest(tables=[{"name": "t", "dim": 3}]).ps_layout_key != base.ps_layout_key
    assert (
        _manifest(tables=[{"name": "t", "dim": 2, "default_value": 1.0}]).ps_layout_key != base.ps_layout_key
    )
    assert _manifest(partition={"num_shards": 3}).ps_layout_key != base.ps_layout_key
    with pytest.raises(ValueError, match="ps_version 3 is newer than version 2"):
        _manifest(version=2, ps_version=3)


def test_store_pairs_entry_versions_and_refuses_another_layout(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    first = _manifest()
    _write(path, first)
    store = ManifestStore("m", first, path)
    assert store.ps_version_of(1) == 1
    _write(path, _manifest(version=2, ps_version=1))
    assert store.ps_version_of(2) == 1  # read on demand
    assert store.for_version(1).version == 1
    time.sleep(0.01)
    _write(path, _manifest(version=3, ps_version=1, tables=[{"name": "t", "dim": 2, "default_value": 5.0}]))
    assert store.poll() is False  # refused: PS version 1 has another layout
    assert store.versions == [1, 2]
    assert store.ps_version_of(3) == 3  # unknown: pairs with itself (no PS serves 3: never pinned)
    store.retain({2})
    assert store.versions == [1, 2]  # 1 is kept: entry 2 reads it


class _Status:
    def __init__(self, versions: list[int]) -> None:
        self.versions = versions

    async def get_model_status(self, req: Any, deadline: float) -> Any:
        resp = tfs_pb2.GetModelStatusResponse()
        for v in self.versions:
            resp.model_version_status.add(version=v, state=tfs_pb2.ModelVersionStatus.AVAILABLE)
        return resp


async def test_pinner_pins_the_entry_whose_ps_version_every_shard_serves() -> None:
    pairs = {3: 1, 2: 1, 1: 1}
    entry = _Status([2, 3])
    shards = [("m_ps_0", [_Status([1])]), ("m_ps_1", [_Status([1])])]
    pinner = VersionPinner("m", entry, "m_entry", shards, ps_of=pairs.get)  # type: ignore[arg-type]
    deadline = time.monotonic() + 10
    assert (await pinner.current(deadline)).version == 3
    pin = await pinner.after_not_found(await pinner.current(deadline), deadline)
    assert pin.version == 3 and pin.degraded is None  # every shard serves PS version 1
    refused = VersionPinner("m", entry, "m_entry", shards, ps_of={2: 1}.get)  # type: ignore[arg-type]
    pin = await refused.current(deadline)
    assert (pin.version, pin.degraded) == (2, DEGRADED_VERSION_FALLBACK)  # 3's layout disagrees: not pinned
