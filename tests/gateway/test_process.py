"""The gateway as a process: no TensorFlow import, `embedgate gateway` via run_gateway, JSON logs with request ids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.gateway import run_gateway

_REPO = Path(__file__).resolve().parents[2]


def test_app_creation_does_not_import_tensorflow(tmp_path: Path) -> None:
    code = """
import sys
from gateway.app import create_app
from gateway.cli import register
import gateway.core, gateway.grpc_front, gateway.features, gateway.embedding, gateway.codec.example
from schemas.gateway_settings import GatewaySettings
create_app(GatewaySettings(models=[{"kind": "passthrough", "name": "m", "target": "127.0.0.1:1"}]))
bad = sorted(m for m in sys.modules if m == "tensorflow" or m.startswith(("tensorflow.", "keras")))
print(bad)
assert not bad, bad
"""
    r = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=_REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr + r.stdout


def test_bad_config_exits_with_message(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("models: []\n")
    r = subprocess.run(
        [sys.executable, "-m", "embedgate", "gateway", "--config", str(cfg)],
        check=False,
        cwd=_REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "invalid configuration" in r.stderr and "models" in r.stderr


@pytest.mark.integration
def test_gateway_process_end_to_end(
    tmp_path: Path, demo_artifacts: Any, demo_backends: Any, passthrough_backend: Any
) -> None:
    m = demo_artifacts.manifest
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "request_timeout_s": 10,
                "models": [
                    {
                        "kind": "embedding",
                        "name": m.model_name,
                        "manifest": str(demo_artifacts.model_dir),
                        "entry": demo_backends.target,
                        "shards": [{"replicas": [demo_backends.target]}] * m.num_shards,
                    },
                    {"kind": "passthrough", "name": "half", "target": passthrough_backend.target},
                ],
            }
        )
    )
    with run_gateway(cfg, env={"EMBEDGATE_LOG__LEVEL": "INFO"}) as gw:
        example = json.loads((demo_artifacts.model_dir / "example_request.json").read_text())
        r = httpx.post(
            f"{gw.url}/v1/models/{m.model_name}:predict",
            json=example,
            headers={"X-Request-Id": "req-42"},
            timeout=10,
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"] == "req-42"
        assert "predictions" in r.json()
        r = httpx.post(f"{gw.url}/v1/models/half:predict", content=b'{"instances": [1.0]}', timeout=10)
        assert r.json() == {"predictions": [3.5]}
        r = httpx.post(
            f"{gw.url}/v1/models/{m.model_name}_ps_0:predict", content=b'{"instances": [1]}', timeout=10
        )
        assert r.status_code == 404
        assert httpx.get(f"{gw.url}/docs", timeout=10).status_code == 200
        assert "embedgate_requests_total" in httpx.get(f"{gw.url}/metrics", timeout=10).text
        r = httpx.post(
            f"{gw.url}/v1/models/{m.model_name}:regress", json={"examples": example["instances"]}, timeout=10
        )
        assert r.status_code in (200, 400), r.text
        maps = Path(f"/proc/{gw.proc.pid}/maps").read_text()
        assert "tensorflow" not in maps, "the gateway process loaded a TensorFlow library"
        rss_kb = next(
            int(x.split()[1])
            for x in Path(f"/proc/{gw.proc.pid}/status").read_text().splitlines()
            if x.startswith("VmRSS:")
        )
        assert rss_kb < 200 * 1024
    lines = [json.loads(x) for x in gw.log_path.read_text().splitlines() if x.startswith("{")]
    access = [x for x in lines if x.get("msg") == "request" and x.get("request_id") == "req-42"]
    assert access and access[0]["status"] == 200 and access[0]["path"].endswith(":predict")
    assert not any(x.get("path") in ("/readyz", "/healthz") for x in lines)
    # glibc's thresholds fixed at start (malloc_mmap_threshold_bytes' default), unless the environment sets them
    config = next(x for x in lines if x.get("msg") == "config")
    if not {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"} & set(os.environ):
        assert config["malloc"] == {"MALLOC_MMAP_THRESHOLD_": 32 << 20, "MALLOC_TRIM_THRESHOLD_": 64 << 20}
