"""A full re-export (a new entry version and new PS versions) rolls out without one failed request, with real parts:
serve-local running the model config that ``embedgate placement`` / ``deploy`` generate (every servable keeps its
latest two versions), a gateway process in front, clients predicting concurrently through it.

The new version is published in the order that hurts most, so the test does not rely on load timing: ``entry/2``
first; only once the gateway answers at version 1 marked degraded (serve-local serves entry 2, the shards only PS 1)
are ``ps_<i>/2`` and then ``manifest.json`` published. With TF Serving's default policy (latest one version)
serve-local unloads entry 1 as soon as entry 2 is AVAILABLE, no entry/PS pair is served everywhere and every request
fails with 503 until the shards load version 2 (this test then fails: no degraded answer, and 503s).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.support.gateway import run_gateway
from tests.support.predict import PredictLoop
from tests.support.servers import serve_local

pytestmark = pytest.mark.integration

MODEL = "demo"
_CLIENTS = 4
_MAX_REQUESTS_PER_CLIENT = 2000
_MAX_SECONDS = 240.0  # bound of the client loops (never reached unless something hangs)
_WAIT_S = 120.0  # bound of each wait for a rollout step (generous: shared machine)
_DEGRADED = "version_fallback"


def _publish_version_dir(src: Path, dest: Path) -> None:
    """Copy the version directory ``src`` to ``dest`` as the exporter publishes: built under a hidden name, then one
    rename (serve-local and TF Serving never see a half-written version)."""
    staging = dest.parent / f".staging-{dest.name}"
    shutil.copytree(src, staging)
    os.rename(staging, dest)


def _publish_manifest(model_dir: Path, version: int) -> None:
    from schemas.manifest import Manifest

    manifest = Manifest.load(model_dir).model_copy(update={"version": version})
    tmp = model_dir / ".manifest.json.tmp"
    tmp.write_text(manifest.dumps(), encoding="utf-8")
    os.replace(tmp, model_dir / "manifest.json")


@pytest.fixture
def stack(demo_artifacts: Any, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A copy of the v1 demo served by serve-local (0.2 s polls) with the generated model config, and a gateway
    process re-reading manifest.json every 0.2 s: (the model dir, the gateway URL)."""
    from embedgate.export.placement import model_config, select

    model_dir = tmp_path / "models" / MODEL
    shutil.copytree(demo_artifacts.model_dir, model_dir)
    config = tmp_path / "models.config"
    config.write_text(model_config(select(model_dir, ["entry; True", "ps_{i}; True"])), encoding="utf-8")
    n = demo_artifacts.manifest.num_shards
    with serve_local(config, poll_seconds=0.2) as backend:
        model = {
            "kind": "embedding",
            "name": MODEL,
            "manifest": str(model_dir),
            "entry": backend.target,
            "shards": [{"replicas": [backend.target]} for _ in range(n)],
        }
        cfg = tmp_path / "gateway.yaml"
        cfg.write_text(yaml.safe_dump({"manifest_poll_s": 0.2, "log": {"format": "text"}, "models": [model]}))
        with run_gateway(cfg) as gw:
            yield model_dir, gw.url


def test_full_reexport_under_concurrent_predicts_loses_no_request(
    stack: tuple[Path, str], demo_artifacts: Any
) -> None:
    from schemas.manifest import ps_dir_name

    model_dir, url = stack
    n = demo_artifacts.manifest.num_shards
    body = json.dumps({"instances": demo_artifacts.instances}).encode()
    clients = PredictLoop(url, MODEL, body, _MAX_REQUESTS_PER_CLIENT, _MAX_SECONDS)
    threads = [threading.Thread(target=clients.run, name=f"predict-{i}") for i in range(_CLIENTS)]
    for t in threads:
        t.start()
    try:
        clients.wait_until("answers at version 1", lambda: clients.count >= 4 * _CLIENTS, _WAIT_S)

        # entry/2 first: once serve-local serves it, the shards still serve only PS 1 -> the gateway keeps the
        # complete pair (entry 1, PS 1), pinning entry 1 explicitly, marked degraded.
        _publish_version_dir(model_dir / "entry" / "1", model_dir / "entry" / "2")
        start = clients.count
        clients.wait_until(
            "a degraded answer (entry 2 served, PS 2 not yet)",
            lambda: any(a.degraded == _DEGRADED for a in clients.since(start)),
            _WAIT_S,
        )

        # Then every PS shard's version 2 and the manifest: the gateway moves to (entry 2, PS 2), not degraded.
        for i in range(n):
            _publish_version_dir(model_dir / ps_dir_name(i) / "1", model_dir / ps_dir_name(i) / "2")
        _publish_manifest(model_dir, 2)
        switched = clients.count
        clients.wait_until(
            "10 answers at version 2 (not degraded)",
            lambda: sum(a.status == 200 and a.degraded is None for a in clients.since(switched)) >= 10,
            _WAIT_S,
        )
    finally:
        clients.stop.set()
        for t in threads:
            t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)

    answers = clients.answers
    failed = [(a.status, a.error) for a in answers if a.status != 200]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed during the rollout: {failed[:3]}"
    # Version 2 is a copy of version 1: every answer, at either version, is the same prediction.
    first = answers[0].preds
    assert first is not None
    for a in answers:
        assert a.preds is not None and np.allclose(a.preds, first, rtol=1e-6, atol=1e-6)
    assert {a.degraded for a in answers} == {None, _DEGRADED}
